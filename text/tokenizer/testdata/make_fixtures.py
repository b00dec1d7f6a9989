#!/usr/bin/env python3
"""Builds the tokenizer fixtures with the `tokenizers` library itself.

For each family pipeline: trains a small BPE (tokenizers' BpeTrainer) on a
generated corpus (corpus.py), then writes tokenizer.json with the family's
normalizer / pre-tokenizer / post-processor / decoder / added tokens as the
real models ship them, and expected.jsonl with what tokenizers returns for
each test text: ids and byte offsets with and without special tokens, the
ids when the text is user data (specials not matched), and decodes.

    /work/venv/bin/python text/tokenizer/testdata/make_fixtures.py text/tokenizer/testdata
    # optional: a real vocabulary, kept out of the repository (1.7 MB):
    /work/venv/bin/python text/tokenizer/testdata/make_fixtures.py --real /tmp/tok_real

--real reads the byte-level BPE tokenizer.json that the `anthropic` PyPI
package shipped up to 0.38 (pip download anthropic==0.30.0 --no-deps).
"""
import argparse
import json
import os
import sys
import zipfile

import tokenizers
from tokenizers import Tokenizer, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

QWEN_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
O200K_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DS_RE = [r"\p{N}{1,3}", "[一-龥\u3040-ゟ゠-ヿ]+",
         "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
         "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]


def split(regex, behavior="Isolated", invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": regex}, "behavior": behavior,
            "invert": invert}


def bytelevel(prefix=False, trim=True, regex=False):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": trim, "use_regex": regex}


def seq(kind, key, items):
    return {"type": "Sequence", key: items}


def added(content, special=True, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"content": content, "special": special, "normalized": (not special) if normalized is None else normalized,
            "lstrip": lstrip, "rstrip": rstrip, "single_word": single_word}


def template(bos):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [None], "tokens": [bos]}}}


SP_DECODER = seq("d", "decoders", [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}])
BL_DECODER = bytelevel(trim=True)

FAMILIES = {
    "qwen3": dict(normalizer={"type": "NFC"},
                  pre_tokenizer=seq("p", "pretokenizers", [split(QWEN_RE), bytelevel(trim=False)]),
                  post_processor=bytelevel(trim=False), decoder=bytelevel(trim=False),
                  added=[added("<|endoftext|>"), added("<|im_start|>"), added("<|im_end|>"),
                         added("<think>", special=False, normalized=False),
                         added("</think>", special=False, normalized=False),
                         added("<tool_call>", special=False, normalized=False)]),
    "deepseek_v3": dict(normalizer=None,
                        pre_tokenizer=seq("p", "pretokenizers", [split(r) for r in DS_RE] + [bytelevel()]),
                        post_processor=template("<｜begin▁of▁sentence｜>"), decoder=BL_DECODER,
                        added=[added("<｜begin▁of▁sentence｜>"), added("<｜end▁of▁sentence｜>"), added("<｜▁pad▁｜>"),
                               added("<think>", special=False, normalized=True)]),
    "olmoe": dict(normalizer={"type": "NFC"}, pre_tokenizer=bytelevel(regex=True),
                  post_processor=bytelevel(), decoder=BL_DECODER,
                  added=[added("<|endoftext|>"), added("<|padding|>")] +
                        [added(" " * k, special=False, normalized=True) for k in (24, 8, 4, 2)] +
                        [added("|||EMAIL_ADDRESS|||", special=False, normalized=True)]),
    "gpt2_prefix": dict(normalizer=None, pre_tokenizer=bytelevel(prefix=True, regex=True),
                        post_processor=bytelevel(prefix=True), decoder=BL_DECODER,
                        added=[added("<|endoftext|>"), added("<mask>", lstrip=True, normalized=False),
                               added("[word]", special=False, single_word=True, normalized=False)]),
    "roberta": dict(normalizer=None, pre_tokenizer=bytelevel(prefix=True, regex=True),
                    post_processor={"type": "RobertaProcessing", "sep": ["</s>", None], "cls": ["<s>", None],
                                    "trim_offsets": True, "add_prefix_space": True},
                    decoder=BL_DECODER,
                    added=[added("<s>"), added("</s>"), added("<mask>", lstrip=True, rstrip=True)]),
    "gpt_oss": dict(normalizer=None,
                    pre_tokenizer=seq("p", "pretokenizers", [split(O200K_RE), bytelevel()]),
                    post_processor=bytelevel(trim=False), decoder=BL_DECODER,
                    added=[added(s) for s in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>")]),
    "mixtral": dict(normalizer=seq("n", "normalizers", [{"type": "Prepend", "prepend": "▁"},
                                                       {"type": "Replace", "pattern": {"String": " "},
                                                        "content": "▁"}]),
                    pre_tokenizer=None, post_processor=template("<s>"), decoder=SP_DECODER, sp=True,
                    added=[added("<unk>"), added("<s>"), added("</s>")]),
    "llama_metaspace": dict(normalizer=None,
                            pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                                           "split": False},
                            post_processor=template("<s>"),
                            decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                                     "split": False},
                            sp=True, ignore_merges=True, added=[added("<unk>"), added("<s>"), added("</s>")]),
    "splits_a": dict(normalizer={"type": "NFKC"},
                     pre_tokenizer=seq("p", "pretokenizers", [
                         split(" ", "MergedWithPrevious", literal=True), split(r"\p{P}", "MergedWithNext"),
                         {"type": "Digits", "individual_digits": False}, bytelevel()]),
                     post_processor=None, decoder=BL_DECODER, added=[added("<|x|>")]),
    "splits_b": dict(normalizer=seq("n", "normalizers", [{"type": "NFKD"},
                                                        {"type": "Replace", "pattern": {"Regex": r"\s{2,}"},
                                                         "content": "  "}]),
                     pre_tokenizer=seq("p", "pretokenizers", [
                         split(r"\s+", "Removed"), split(r"[aeiou]+", "Contiguous", invert=True),
                         {"type": "Digits", "individual_digits": True},
                         {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]),
                     post_processor=None, decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"},
                     sp=True, added=[added("<unk>"), added("<s>"), added("[sep]", special=False, rstrip=True)]),
}


def train(cfg, texts, vocab_size):
    sp = cfg.get("sp", False)
    special = [a["content"] for a in cfg["added"]]
    if sp:
        special = special + ["<0x%02X>" % b for b in range(256)]
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>" if sp else None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": sp, "byte_fallback": sp,
             "ignore_merges": cfg.get("ignore_merges", False), "vocab": {}, "merges": []}
    pre = cfg["pre_tokenizer"]
    if sp and pre is None:  # train on words, as SentencePiece does, then drop the split
        pre = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": cfg["normalizer"],
            "pre_tokenizer": pre, "post_processor": None, "decoder": None, "model": model}
    tok = Tokenizer.from_str(json.dumps(base))
    alphabet = [] if sp else tokenizers.pre_tokenizers.ByteLevel.alphabet()
    kw = {"limit_alphabet": 300} if sp else {}
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, initial_alphabet=alphabet,
                                  show_progress=False, **kw)
    tok.train_from_iterator(texts, trainer)
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = cfg["pre_tokenizer"]
    j["decoder"] = cfg["decoder"]
    vocab = j["model"]["vocab"]
    for a in cfg["added"]:
        if a["content"] not in vocab:
            vocab[a["content"]] = len(vocab)
    j["added_tokens"] = [dict(id=vocab[a["content"]], **a) for a in cfg["added"]]
    post = json.loads(json.dumps(cfg["post_processor"]))
    if post and post["type"] == "TemplateProcessing":
        for name, st in post["special_tokens"].items():
            st["ids"] = [vocab[name]]
    if post and post["type"] == "RobertaProcessing":
        post["sep"][1] = vocab[post["sep"][0]]
        post["cls"][1] = vocab[post["cls"][0]]
    j["post_processor"] = post
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False)), j


def byte_offsets(text, offsets):
    """tokenizers' Python offsets count characters; the C API's count bytes."""
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [[pos[s], pos[e]] for s, e in offsets]


def masked_case(tok, r, specials):
    """User text (with special-looking strings) + a special: the expected ids
    when the text is user data, the special after it still matched.  The
    user text comes first so that it is encoded where it would be alone
    (Metaspace's prepend_scheme "first" looks at the position)."""
    s2 = r.choice(specials)
    mid = corpus.text(r, 6) + r.choice(corpus.SPECIAL_LIKE) + corpus.text(r, 3)
    tok.encode_special_tokens = True
    mid_ids = tok.encode(mid, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    ids = mid_ids + tok.encode(s2, add_special_tokens=False).ids
    return {"text": mid + s2, "data": [0, len(mid.encode())], "ids_data": ids}


def expect(tok, text):
    e = tok.encode(text, add_special_tokens=True)
    n = tok.encode(text, add_special_tokens=False)
    return {"text": text, "ids": e.ids, "offsets": byte_offsets(text, e.offsets),
            "ids_plain": n.ids, "offsets_plain": byte_offsets(text, n.offsets),
            "decode": tok.decode(e.ids, skip_special_tokens=False),
            "decode_skip": tok.decode(e.ids, skip_special_tokens=True)}


def write_fixture(out, name, tok, j, texts, r):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    # user-data cases put the text between specials that strip no spaces
    specials = [a["content"] for a in j["added_tokens"] if a["special"] and not (a["lstrip"] or a["rstrip"])]
    with open(os.path.join(d, "expected.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(expect(tok, t), ensure_ascii=False) + "\n")
        for _ in range(12 if specials else 0):
            f.write(json.dumps(masked_case(tok, r, specials), ensure_ascii=False) + "\n")


def test_texts(seed, n):
    import random
    r = random.Random(seed)
    texts = corpus.corpus(seed, n, 7)
    texts += ["", " ", "  ", "\n", "a", "<|im_end|>", "<s>", "x<|im_end|>y", " <mask> ", "a<mask>b", "[word] x[word]",
              "hello  world", "ſ's 'S", "\u00a0\u0085\u2028 x", "e\u0301\u0301", "ﬁ ﬁ", "１２３４", "<s> hi", "▁▁a",
              "a" * 300, "😀" * 40, " " * 30 + "x", "\t\t\n\n\r\n", "12345678901234567890", "<|im_start|>user\nhi<|im_end|>",
              "[sep]   x", "<think>\nok</think>", "  ".join(corpus.EMOJI)]
    r.shuffle(texts)
    return texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--real", action="store_true", help="OUT gets the anthropic package's real vocabulary")
    ap.add_argument("--vocab", type=int, default=1200)
    ap.add_argument("--texts", type=int, default=45)
    a = ap.parse_args()
    import random
    r = random.Random(7)
    if a.real:
        import subprocess
        import tempfile
        tmp = tempfile.mkdtemp()
        subprocess.run([sys.executable, "-m", "pip", "download", "anthropic==0.30.0", "--no-deps", "-q", "-d", tmp],
                       check=True)
        whl = [f for f in os.listdir(tmp) if f.endswith(".whl")][0]
        j = json.loads(zipfile.ZipFile(os.path.join(tmp, whl)).read("anthropic/tokenizer.json"))
        tok = Tokenizer.from_str(json.dumps(j))
        write_fixture(a.out, "anthropic_real", tok, j, test_texts(11, 300), r)
        return
    # NUL cannot be a vocabulary key in jansson (the tests' texts keep it)
    train_texts = [t.replace("\x00", "") for t in corpus.corpus(1, 4000)]
    for name, cfg in FAMILIES.items():
        tok, j = train(cfg, train_texts, a.vocab)
        write_fixture(a.out, name, tok, j, test_texts(len(name), a.texts), r)
        print(name, "vocab", tok.get_vocab_size())


if __name__ == "__main__":
    main()

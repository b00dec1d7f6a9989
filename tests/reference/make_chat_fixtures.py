#!/usr/bin/env python3
"""Chat fixtures for //tests:chat_data_test: what transformers 5 makes of
conversations with a model's tokenizer and chat template, for moetune's
`chat_template` dataset type to be held to.

For each (tokenizer, template) pair below, tests/fixtures/chat/NAME/ gets
the tokenizer.json, a tokenizer_config.json with the template and special
tokens, rows.jsonl (the conversations of text/jinja/testdata/cases.json
plus a few of the chat quick start's) and expected.jsonl, one line per row:
  text   apply_chat_template(messages, tools=..., tokenize=False) with the
         clock fixed at 1970-01-01 (moetune renders training data at that
         instant, so data never depends on the day it was read)
  ids    tokenizer(text, add_special_tokens=False).input_ids, what
         apply_chat_template(tokenize=True) returns; null for a row whose
         content spells a special token (moetune keeps such text as text)
  mask   with a {% generation %} template: return_assistant_tokens_mask
  error  the exception's message when transformers refuses the row
and formats_mixtral/ the other dataset types (completion, alpaca,
input_output) with the ids and labels axolotl's strategies give them.
Needs the reference venv (transformers, tokenizers).

    /work/venv/bin/python tests/reference/make_chat_fixtures.py
"""
import datetime
import json
import os
import shutil

import transformers
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat")
TOKS = os.path.join(ROOT, "text", "tokenizer", "testdata")
TMPL = os.path.join(ROOT, "text", "jinja", "testdata", "templates")

# name: (tokenizer.json, template file, special tokens)
PAIRS = {
    "tiny_chatml": (os.path.join(ROOT, "configs", "tokenizers", "tiny-chat", "tokenizer.json"), "chatml.jinja",
                    {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "tiny_chatml_generation": (os.path.join(ROOT, "configs", "tokenizers", "tiny-chat", "tokenizer.json"),
                               "chatml_generation.jinja", {"eos_token": "<|im_end|>"}),
    "qwen3": (os.path.join(TOKS, "qwen3", "tokenizer.json"), "Qwen-Qwen3-0.6B.jinja",
              {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "deepseek_v3": (os.path.join(TOKS, "deepseek_v3", "tokenizer.json"), "deepseek-ai-DeepSeek-V3.1.jinja",
                    {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    "gpt_oss": (os.path.join(TOKS, "gpt_oss", "tokenizer.json"), "openai-gpt-oss-120b.jinja",
                {"eos_token": "<|return|>"}),
    "mistral": (os.path.join(TOKS, "mixtral", "tokenizer.json"), "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
}
EPOCH = datetime.datetime(1970, 1, 1, 0, 0, 0)


class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return EPOCH


def rows():
    cases = json.load(open(os.path.join(ROOT, "text", "jinja", "testdata", "cases.json")))
    out = []
    for c in cases:
        r = {"messages": c["messages"]}
        if "tools" in c:
            r["tools"] = c["tools"]
        out.append(r)
    with open(os.path.join(ROOT, "configs", "data", "quickstart-chat.jsonl")) as f:
        out += [json.loads(line) for line in f.readlines()[:4]]
    return out


ALPACA_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA = ("Below is an instruction that describes a task. Write a response that appropriately completes the request."
          "\n\n### Instruction:\n{instruction}\n\n### Response:\n")


def axolotl_tokenize(tok, text, add_eos=True, strip_bos=False):
    """axolotl's PromptTokenizingStrategy._tokenize, without its length cap."""
    ids = tok(text).input_ids
    if ids and ids[-1] != tok.eos_token_id and add_eos:
        ids.append(tok.eos_token_id)
    if ids and ids[0] == tok.bos_token_id and strip_bos:
        ids = ids[1:]
    return ids


def format_rows():
    """Rows of the other text dataset types and what axolotl's strategies
    (completion, alpaca, input_output; read from its source) make of them."""
    return {
        "completion": [{"text": "Hello world, ZQX!"}, {"text": "  spaces\n\nand lines  "},
                       {"text": "日本語のテキスト 🙂"}],
        "alpaca": [{"instruction": "Add 2 and 3.", "output": "5"},
                   {"instruction": "Translate", "input": "bonjour", "output": "hello"},
                   {"instruction": "Say </s> literally", "input": "", "output": "</s> is text"}],
        "input_output": [{"segments": [{"label": False, "text": "Q: two plus two?\n"}, {"label": True, "text": "A: four"}]},
                         {"segments": [{"label": True, "text": "all trained"}]}],
    }


def format_expected(tok, kind, row):
    if kind == "completion":
        ids = axolotl_tokenize(tok, row["text"])
        return {"ids": ids, "labels": list(ids)}
    if kind == "alpaca":
        fmt = ALPACA_INPUT if row.get("input") else ALPACA
        p = axolotl_tokenize(tok, fmt.format(instruction=row["instruction"], input=row.get("input", "")), add_eos=False)
        r = axolotl_tokenize(tok, row["output"], strip_bos=True)
        return {"ids": p + r, "labels": [-100] * len(p) + r}
    ids, labels = [], []
    for seg in row["segments"]:
        t = tok(seg["text"], add_special_tokens=False).input_ids
        ids += t
        labels += t if seg["label"] else [-100] * len(t)
    return {"ids": ids, "labels": labels}


def write_formats():
    d = os.path.join(OUT, "formats_mixtral")
    os.makedirs(d, exist_ok=True)
    src = os.path.join(TOKS, "mixtral", "tokenizer.json")
    shutil.copyfile(src, os.path.join(d, "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(specials, f, indent=1)
    tok = PreTrainedTokenizerFast(tokenizer_file=src, **specials)
    for kind, rs in format_rows().items():
        with open(os.path.join(d, kind + ".jsonl"), "w") as fr, open(os.path.join(d, kind + ".expected.jsonl"), "w") as fe:
            for r in rs:
                fr.write(json.dumps(r, ensure_ascii=False) + "\n")
                fe.write(json.dumps(format_expected(tok, kind, r)) + "\n")
    print("formats_mixtral", {k: len(v) for k, v in format_rows().items()})


def main():
    write_formats()
    ctu.datetime = FixedClock
    ctu._compile_jinja_template.cache_clear()
    data = rows()
    for name, (tok_path, tmpl, specials) in PAIRS.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        shutil.copyfile(tok_path, os.path.join(d, "tokenizer.json"))
        with open(os.path.join(TMPL, tmpl), newline="") as f:
            template = f.read()
        cfg = dict(specials, chat_template=template)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=1, ensure_ascii=False)
        tok = PreTrainedTokenizerFast(tokenizer_file=tok_path, **specials)
        tok.chat_template = template
        added = [t for t in tok.get_vocab() if t in tok.added_tokens_encoder]
        with open(os.path.join(d, "rows.jsonl"), "w") as fr, open(os.path.join(d, "expected.jsonl"), "w") as fe:
            for r in data:
                fr.write(json.dumps(r, ensure_ascii=False) + "\n")
                e = {}
                try:
                    text = tok.apply_chat_template(r["messages"], tools=r.get("tools"), tokenize=False)
                    e["text"] = text
                    contents = json.dumps(r, ensure_ascii=False)
                    spelled = any(a in contents for a in added)
                    e["ids"] = None if spelled else tok(text, add_special_tokens=False).input_ids
                    if "{% generation %}" in template:
                        enc = tok.apply_chat_template(r["messages"], tools=r.get("tools"), tokenize=True,
                                                      return_dict=True, return_assistant_tokens_mask=True)
                        e["mask"] = None if spelled else enc["assistant_masks"]
                except Exception as ex:  # transformers refuses the row: so must moetune
                    e = {"error": str(ex)}
                fe.write(json.dumps(e, ensure_ascii=False) + "\n")
        print(name, len(data), "rows")
    print("transformers", transformers.__version__)


if __name__ == "__main__":
    main()

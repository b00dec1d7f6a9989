#!/usr/bin/env python3
"""Writes the chat quick start's data and tokenizer:

  configs/data/quickstart-chat.jsonl       conversations in the OpenAI
                                           "messages" format (arithmetic
                                           questions and their answers, a
                                           system prompt on some), made up
                                           here from a fixed seed
  configs/tokenizers/tiny-chat/tokenizer.json
  configs/tokenizers/tiny-chat/tokenizer_config.json

The tokenizer is a byte-level BPE in Qwen2's pipeline (its pre-tokenizer
regex, ByteLevel without a regex of its own, no normalizer), trained with
Hugging Face `tokenizers` on the conversations to a 384-token vocabulary,
with ChatML's special tokens; tokenizer_config.json carries a ChatML
template and <|im_end|> as EOS, as Qwen2.5's does.  Needs `tokenizers`
(the reference venv); the outputs are committed, so CI does not.

    python3 tools/data/make_chat_quickstart.py
"""
import json
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DATA = os.path.join(ROOT, "configs", "data", "quickstart-chat.jsonl")
TOK = os.path.join(ROOT, "configs", "tokenizers", "tiny-chat")
VOCAB = 384
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def conversations(rng, n):
    ops = [("+", lambda a, b: a + b, "plus"), ("-", lambda a, b: a - b, "minus"), ("*", lambda a, b: a * b, "times")]
    out = []
    for i in range(n):
        msgs = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": "You are a careful calculator. Answer in one sentence."})
        for _ in range(rng.choice([1, 1, 2])):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            sym, f, word = rng.choice(ops)
            q = rng.choice([f"What is {a} {sym} {b}?", f"Compute {a} {word} {b}.", f"{a} {sym} {b} = ?"])
            msgs.append({"role": "user", "content": q})
            msgs.append({"role": "assistant", "content": f"{a} {sym} {b} = {f(a, b)}."})
        out.append({"messages": msgs})
    return out


def main():
    rng = random.Random(20261126)
    rows = conversations(rng, 600)
    os.makedirs(os.path.dirname(DATA), exist_ok=True)
    with open(DATA, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [m["content"] for r in rows for m in r["messages"]]
    tok.train_from_iterator(texts, trainer)
    os.makedirs(TOK, exist_ok=True)
    tok.save(os.path.join(TOK, "tokenizer.json"))
    cfg = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "model_max_length": 512, "tokenizer_class": "Qwen2Tokenizer", "chat_template": CHATML}
    with open(os.path.join(TOK, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"{DATA}: {len(rows)} conversations; {TOK}: vocabulary {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compares `moetune tokenize --chat` with transformers' fixtures
(tests/reference/make_chat_fixtures.py); stdlib only, so CI needs no venv.

    chat_data_check.py EXPECTED.jsonl GOT.jsonl [MASK_FROM.jsonl]

Per row: ids and labels equal where the fixture has labels (completion,
alpaca, input_output rows); for conversations the rendered text equal; the ids equal where the fixture has them;
where transformers refused the row, moetune refused it too.  Labels: with
MASK_FROM (the expected.jsonl of the same conversations under a template
that marks {% generation %}, or EXPECTED itself), a token is trained
exactly where transformers' assistant mask is 1.  Prints one line per
difference and a summary; exit 1 on any difference."""
import json
import sys


def main():
    exp = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
    got = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")]
    masks = [json.loads(line) for line in open(sys.argv[3], encoding="utf-8")] if len(sys.argv) > 3 else None
    bad = 0
    if len(exp) != len(got):
        print(f"{len(got)} output lines for {len(exp)} rows")
        return 1
    checked = {"text": 0, "ids": 0, "mask": 0, "error": 0}
    for i, (e, g) in enumerate(zip(exp, got)):
        row = i + 1
        if "error" in e:
            if "error" not in g:
                bad += 1
                print(f"row {row}: transformers refuses it ({e['error'][:80]}), moetune did not")
            checked["error"] += 1
            continue
        if "error" in g:
            bad += 1
            print(f"row {row}: moetune refused it: {g['error'][:200]}")
            continue
        if "labels" in e:  # a row of another dataset type: ids and labels as axolotl's strategy gives them
            if g.get("ids") != e["ids"] or g.get("labels") != e["labels"]:
                bad += 1
                print(f"row {row}: ids or labels differ:\n  want {e['ids'][:30]} {e['labels'][:30]}\n"
                      f"  got  {g.get('ids', [])[:30]} {g.get('labels', [])[:30]}")
            else:
                checked["ids"] += 1
                checked["mask"] += 1
            continue
        if g["text"] != e["text"]:
            bad += 1
            print(f"row {row}: text differs:\n  want {e['text'][:300]!r}\n  got  {g['text'][:300]!r}")
            continue
        checked["text"] += 1
        if e.get("ids") is not None:
            if g["ids"] != e["ids"]:
                bad += 1
                print(f"row {row}: ids differ:\n  want {e['ids'][:40]}\n  got  {g['ids'][:40]}")
                continue
            checked["ids"] += 1
        m = masks[i].get("mask") if masks else None
        if m is not None:
            trained = [1 if lab != -100 else 0 for lab in g["labels"]]
            if trained != m:
                bad += 1
                print(f"row {row}: trained tokens differ from transformers' assistant mask:\n"
                      f"  want {m}\n  got  {trained}")
                continue
            checked["mask"] += 1
    print(f"{sys.argv[2]}: {checked['text']} texts, {checked['ids']} id lists, {checked['mask']} masks, "
          f"{checked['error']} refusals as transformers; {bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

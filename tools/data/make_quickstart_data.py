#!/usr/bin/env python3
"""Writes configs/data/quickstart.jsonl, the quick-start's training data.

Byte-level tokens (token id = byte value, vocabulary 128: ASCII) of the GNU
GPL version 3 text that Debian ships in /usr/share/common-licenses/GPL-3
(verbatim copying is permitted), cut into examples of SEQ tokens in the
axolotl "tokenized" JSONL format.  The last, shorter example is kept, so
padding is exercised too.  No dependencies beyond the standard library.

    python3 tools/data/make_quickstart_data.py [SOURCE] [OUT]
"""
import json
import sys

SEQ = 128


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/common-licenses/GPL-3"
    out = sys.argv[2] if len(sys.argv) > 2 else "configs/data/quickstart.jsonl"
    data = open(src, "rb").read()
    ids = [b if b < 128 else ord("?") for b in data]
    with open(out, "w") as f:
        for start in range(0, len(ids), SEQ):
            chunk = ids[start:start + SEQ]
            f.write(json.dumps({"input_ids": chunk}, separators=(",", ":")) + "\n")
    print(f"{out}: {len(ids)} tokens in {(len(ids) + SEQ - 1) // SEQ} examples")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""moetune's tokenizer against the `tokenizers` library, one core each, on
the same multi-MB text, encoded one line (document) at a time.  Prints both
rates side by side and checks that both produced the same ids.

    bazel build -c opt //tools/bench:tokenize_bench
    /work/venv/bin/python tools/bench/tokenize_bench.py TOKENIZER_JSON [--mb 8]

The text is text/tokenizer/testdata/corpus.py's generator (seeded): prose,
code, CJK, Arabic, emoji, whitespace runs, digits.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "text", "tokenizer", "testdata"))
import corpus  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_json")
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bench", default=os.path.join(ROOT, "bazel-bin", "tools", "bench", "tokenize_bench"))
    a = ap.parse_args()
    lines, size, seed = [], 0, 100
    while size < a.mb * 1e6:
        for t in corpus.corpus(seed, 1000, 12):
            t = t.replace("\n", " ") + "\n"
            lines.append(t)
            size += len(t.encode())
        seed += 1
    text = "".join(lines)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    tok = Tokenizer.from_file(a.tokenizer_json)
    best, ids_hash, tokens = 1e30, 1469598103934665603, 0
    for r in range(a.repeats):
        t0 = time.perf_counter()
        encs = [tok.encode(line, add_special_tokens=False) for line in lines]
        best = min(best, time.perf_counter() - t0)
        if r == 0:
            for e in encs:
                for i in e.ids:
                    ids_hash = ((ids_hash ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
                tokens += len(e.ids)
    nbytes = len(text.encode())
    out = subprocess.run([a.bench, a.tokenizer_json, path, str(a.repeats)], capture_output=True, text=True, check=True)
    os.unlink(path)
    c = json.loads(out.stdout.strip().splitlines()[-1])
    print("text: %.1f MB, %d lines, tokenizer %s" % (nbytes / 1e6, len(lines), a.tokenizer_json))
    print("%-22s %10s %10s %12s" % ("", "MB/s", "seconds", "tokens"))
    print("%-22s %10.2f %10.3f %12d" % ("tokenizers %s" % __import__("tokenizers").__version__, nbytes / best / 1e6,
                                        best, tokens))
    print("%-22s %10.2f %10.3f %12d" % ("moetune", c["mb_per_s"], c["seconds"], c["tokens"]))
    same = c["ids_fnv"] == "%016x" % ids_hash and c["tokens"] == tokens
    print("moetune / tokenizers: %.2fx; ids %s" % (c["mb_per_s"] / (nbytes / best / 1e6),
                                                  "identical" if same else "DIFFER"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""DeepSeek-V2/V3, GLM-4.5 and gpt-oss checkpoints as transformers 5 saves
them train in moetune, and moetune's saves load back in transformers.

1. From transformers to moetune: each reference checkpoint
   (tests/fixtures/ref_<case>/ckpt) is loaded with from_pretrained and
   written again with save_pretrained, sharded (max_shard_size 20KB), in
   fp32 and bf16, in the Hub's per-expert layout (save_original_format
   True, the default) and in transformers 5's own fused one
   (save_original_format=False).  moetune trains each with the case's run
   config: from an fp32 save its 5 losses must equal the reference's
   (expected.json, written from the same weights by transformers) within
   1e-6 relative; from a bf16 save they must equal those moetune gives on
   an fp32 copy of the same bf16-rounded weights, bit for bit (the dtype is
   converted on load, nothing else differs).
2. From moetune to transformers: moetune's output of each fp32 run, saved
   in fp32 and in bf16 (save_dtype), loads with from_pretrained(dtype=
   "auto") in the dtype config.json states, with no missing, unexpected or
   mismatched key and finite logits (check_hf_load.check).

Needs torch and transformers (a venv; CI does not run this) and a built
moetune:
    /tmp/loravenv/bin/python tests/reference/check_families_hf.py \\
        --moetune bazel-bin/tools/moetune --work /tmp/fam \\
        --out tests/reference/hf_families_results.json
"""
import json
import os
import shutil
import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf_load import check  # noqa: E402

CASES = ["deepseek_v3", "deepseek_v3_qproj", "deepseek_v2", "glm4_moe", "gpt_oss"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f if '"loss"' in line]


def train(moetune, case, base, out_dir, extra=()):
    fixture = os.path.join(ROOT, "tests", "fixtures", "ref_" + case)
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [moetune, "train", os.path.join(fixture, "run.yaml"), "--set", "base_model=" + base,
           "--set", "output_dir=" + out_dir, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return None, (r.stdout + r.stderr)[-600:]
    return losses(out_dir), None


def main(argv):
    moetune = argv[argv.index("--moetune") + 1]
    work = argv[argv.index("--work") + 1]
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    os.makedirs(work, exist_ok=True)
    rows, loads = [], []
    for case in CASES:
        fixture = os.path.join(ROOT, "tests", "fixtures", "ref_" + case)
        with open(os.path.join(fixture, "expected.json")) as f:
            ref = json.load(f)["losses"]
        for dtype in (torch.float32, torch.bfloat16):
            for original in (True, False):
                model = AutoModelForCausalLM.from_pretrained(os.path.join(fixture, "ckpt"), dtype=torch.float32)
                model = model.to(dtype)
                name = "%s_%s_%s" % (case, "per_expert" if original else "fused", str(dtype).split(".")[1])
                saved = os.path.join(work, "hf_" + name)
                shutil.rmtree(saved, ignore_errors=True)
                model.save_pretrained(saved, max_shard_size="20KB", save_original_format=original)
                shards = len([f for f in os.listdir(saved) if f.endswith(".safetensors")])
                got, err = train(moetune, case, saved, os.path.join(work, "out_" + name))
                row = {"case": name, "shards": shards, "losses": got, "error": err}
                if dtype == torch.float32:
                    rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref)) if got else None
                    row.update(reference=ref, max_rel_vs_reference=rel, ok=got is not None and rel <= 1e-6)
                else:
                    # the same bf16-rounded weights as an fp32 checkpoint
                    up = os.path.join(work, "hf_%s_upcast" % name)
                    shutil.rmtree(up, ignore_errors=True)
                    AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).save_pretrained(up)
                    want, err2 = train(moetune, case, up, os.path.join(work, "out_%s_upcast" % name))
                    row.update(fp32_copy_losses=want, ok=got is not None and got == want, error=err or err2)
                rows.append(row)
                print(json.dumps(row), flush=True)
        # moetune's own saves of the fp32 per-expert run, in both dtypes
        for save_dtype in ("float32", "bfloat16"):
            d = os.path.join(work, "moetune_%s_%s" % (case, save_dtype))
            got, err = train(moetune, case, os.path.join(fixture, "ckpt"), d, ("--set", "save_dtype=" + save_dtype))
            r = check(d) if got else {"dir": d, "ok": False, "error": err}
            r["dir"] = os.path.basename(d)
            loads.append(r)
            print(json.dumps(r), flush=True)
    ok = all(r["ok"] for r in rows) and all(r["ok"] for r in loads)
    if out:
        with open(out, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "hf_saves_in_moetune": rows, "moetune_saves_in_hf": loads, "ok": ok}, f, indent=1)
            f.write("\n")
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

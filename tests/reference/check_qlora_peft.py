"""Does PEFT load the adapters moetune saves from a QLoRA run, and do they
compute what PEFT's own adapters compute after the same training?

For each tests/fixtures/qlora_<family> (make_qlora_family_fixtures.py):
`moetune train` on its run.yaml (load_in_4bit over the fp32 reference
checkpoint) into a temporary output_dir; then over the base those fixtures
define (each projection tensor 4-bit round-tripped as stored, fp32):

  * PeftModel.from_pretrained(base, output_dir): no missing or unexpected
    adapter key in PEFT's load warnings;
  * logits of two rows with moetune's adapter against those with the
    fixture's adapter_final (PEFT's, after the reference's 10 steps): the
    largest difference relative to the largest logit (an adapter weight
    PEFT did not load would keep its initial value and show here);
  * that the output holds the adapter and no base weights.

Prints one JSON line per family, writes them to
tests/fixtures/qlora_peft_check.json, exits 1 when a key is missing or
unexpected or the logits differ by more than 1e-5.

Run: /work/venv/bin/python tests/reference/check_qlora_peft.py bazel-bin/tools/moetune
Not part of CI (needs torch, transformers 5, peft).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_qlora_family_fixtures as mk  # noqa: E402

FIX = os.path.join(HERE, "..", "fixtures")


def logits_with(base_dir, adapter_dir, rows):
    base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", dtype=torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, adapter_dir)
    problems = [str(w.message)[:300] for w in caught if "missing" in str(w.message).lower()
                or "unexpected" in str(w.message).lower()]
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(rows)).logits, problems


def check(moetune, family):
    fix = os.path.join(FIX, "qlora_" + family)
    exp = json.load(open(os.path.join(fix, "expected.json")))
    work = tempfile.mkdtemp()
    try:
        out = os.path.join(work, "out")
        r = subprocess.run([moetune, "train", os.path.join(fix, "run.yaml"), "--set", "output_dir=" + out],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            return {"family": family, "ok": False, "error": (r.stdout + r.stderr)[-400:]}
        base = os.path.join(work, "base")
        mk.quantized_checkpoint(os.path.join(FIX, "ref_" + family, "ckpt"), base, exp["bnb_4bit_quant_type"],
                                exp["bnb_4bit_use_double_quant"])
        rows = [json.loads(l)["input_ids"] for l in open(os.path.join(fix, "data.jsonl"))][:2]
        ours, p1 = logits_with(base, out, rows)
        theirs, p2 = logits_with(base, os.path.join(fix, "adapter_final"), rows)
        diff = ((ours - theirs).abs().max() / theirs.abs().max()).item()
        files = sorted(os.listdir(out))
        base_written = any(f.startswith("model") and f.endswith(".safetensors") for f in files)
        res = {"family": family, "logits_rel_diff": diff, "load_problems": p1 + p2,
               "adapter_files": [f for f in files if f.startswith("adapter")], "base_written": base_written}
        res["ok"] = diff <= 1e-5 and not p1 and not p2 and not base_written and "adapter_model.safetensors" in files
        return res
    finally:
        shutil.rmtree(work)


def main():
    moetune = os.path.abspath(sys.argv[1])
    results = [check(moetune, f) for f in sorted(mk.CASES)]
    for r in results:
        print(json.dumps(r))
    ok = all(r["ok"] for r in results)
    print(f"{sum(r['ok'] for r in results)} of {len(results)} families: moetune's QLoRA adapter loads in PEFT and "
          "matches PEFT's own" if ok else "FAILED")
    with open(os.path.join(FIX, "qlora_peft_check.json"), "w") as f:
        json.dump({"tool": "tests/reference/check_qlora_peft.py", "results": results}, f, indent=1)
        f.write("\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

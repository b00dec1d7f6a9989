"""Loads the adapters moetune saves with transformers + peft and records
PEFT's logits, so that CI (tests/lora_test.c) can compare moetune's own
forward with PEFT's on the same files without Python.

For each LoRA fixture: `moetune train` on its run.yaml (into a temporary
directory), then PeftModel.from_pretrained(HF model from ckpt/, moetune's
output_dir) and the logits of the first micro-batch (rows 0 and 1 of
data.jsonl) are written to tests/fixtures/<case>/peft_logits_moetune.safetensors.
The numbers (logits against the PyTorch reference carrying the same
adapter, which modules PEFT adapted, PEFT's scaling) go to
tests/fixtures/lora_peft_moetune.json.

Where PEFT computes something other than what the adapter file says, the
file records it: a scaling PEFT reads otherwise is noted and set back to
the adapter's own (alpha/r, alpha/sqrt(r)) before comparing, and a case
whose PEFT logits still differ gets no logits file (the test compares it
against the reference instead).  With the adapter_config.json moetune
writes for transformers 5 (engine/model/lora/peft5.h), PEFT there computes
what the file says for every fixture: Qwen3-MoE's rsLoRA experts at
alpha/sqrt(r) (their alpha_pattern), Qwen2-MoE's routed, shared-expert and
dense adapters all loaded (tests/reference/check_peft_moetune_save.py
checks every weight).

Run: /tmp/loravenv/bin/python tests/reference/check_peft_moetune.py bazel-bin/tools/moetune
(the committed files are from transformers 5.23 and peft 0.21.2).  Not part
of CI: its results are the committed files.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_peft_load as cpl  # noqa: E402
import hf_moe_ref as ref  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_lora_fixtures as mlf  # noqa: E402


def main():
    import peft
    import transformers
    if len(sys.argv) != 2:
        sys.exit("usage: check_peft_moetune.py PATH/TO/moetune")
    moetune = os.path.abspath(sys.argv[1])
    torch.set_num_threads(1)
    rows = mf.rows_from_examples(mlf.examples())
    ids, _, mask = mf.batch_tensors(rows, [0, 1])
    out = {"transformers": transformers.__version__, "peft": peft.__version__, "cases": []}
    for case in mlf.CASES:
        d = os.path.join(mlf.FIXTURES, case["name"])
        entry = {"case": case["name"]}
        with tempfile.TemporaryDirectory() as tmp:
            work = os.path.join(tmp, case["name"])
            shutil.copytree(d, work, ignore=shutil.ignore_patterns("out"))
            subprocess.run([moetune, "train", "run.yaml", "--set", "progress=false"], cwd=work, check=True,
                           stdout=subprocess.DEVNULL)
            adir = os.path.join(work, "out")
            want = cpl.ref_logits(case, os.path.join(adir, "adapter_model.safetensors"), ids, mask)
            got, base, _ = cpl.peft_logits(os.path.join(d, "ckpt"), adir, ids, mask)
            entry["max_abs_diff_peft_vs_reference"] = (got - want).abs().max().item()
            scale = case["alpha"] / (case["r"] ** 0.5 if case["rslora"] else case["r"])
            fixed, _, notes = cpl.peft_logits(os.path.join(d, "ckpt"), adir, ids, mask, fix_scaling=scale)
            if notes:
                entry["peft_scaling_differs"] = notes[:4]
                entry["max_abs_diff_with_adapter_scaling"] = (fixed - want).abs().max().item()
                got = fixed
            entry["peft_adapted_modules"] = cpl.adapted_modules(os.path.join(d, "ckpt"), adir)
            entry["adapter_effect_max_abs"] = (want - base).abs().max().item()
            final = entry.get("max_abs_diff_with_adapter_scaling", entry["max_abs_diff_peft_vs_reference"])
            entry["peft_matches_adapter"] = final < 1e-4
            path = os.path.join(d, "peft_logits_moetune.safetensors")
            if entry["peft_matches_adapter"]:
                ref.save_safetensors(path, {"logits": got.float().contiguous()})
                entry["logits_file"] = os.path.relpath(path, mlf.FIXTURES)
            elif os.path.exists(path):
                os.remove(path)
        print(json.dumps(entry))
        out["cases"].append(entry)
    with open(os.path.join(mlf.FIXTURES, "lora_peft_moetune.json"), "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()

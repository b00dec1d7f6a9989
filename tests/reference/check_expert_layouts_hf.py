#!/usr/bin/env python3
"""Checks that moetune's saves in both expert layouts load in transformers 5.

Given moetune output directories named <family>_<layout>_<dtype> (layout
per_expert or fused, dtype float32 or bfloat16), runs check_hf_load.check
on each (dtype="auto" must give the saved dtype; no missing, unexpected or
mismatched keys; finite logits) and asks that the per-expert and fused save
of the same run and dtype load as bit-identical parameters in transformers
(and logits within 1e-5).  The
committed record is tests/reference/hf_load_expert_layouts.json, made by:

    for c in mixtral qwen3_moe; do for lay in per_expert fused; do for dt in float32 bfloat16; do
      moetune train tests/fixtures/ref_$c/run.yaml --set base_model=tests/fixtures/fused/${c}_f32 \\
        --set output_dir=/tmp/fl/${c}_${lay}_${dt} --set save_expert_layout=$lay --set save_dtype=$dt \\
        --set save_max_shard_size=50KB
    done; done; done
    # and from the base checkpoints themselves: ref_qwen2_moe as qwen2_moe_<layout>_float32
    # (shared expert, a dense layer) and ref_olmoe_clip as olmoe_<layout>_bfloat16
    /tmp/loravenv/bin/python tests/reference/check_expert_layouts_hf.py /tmp/fl/* \\
        --out tests/reference/hf_load_expert_layouts.json
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf_load import check  # noqa: E402


def loaded(path):
    m = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    m.eval()
    ids = torch.arange(1, 13).unsqueeze(0) % m.config.vocab_size
    with torch.no_grad():
        return m.state_dict(), m(input_ids=ids).logits.float()


def main(argv):
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    results, pairs = [], []
    for path in sorted(argv):
        r = check(path)
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            names = json.load(f)["weight_map"]
        r["dir"] = os.path.basename(path.rstrip("/"))
        r["fused_tensors"] = any(n.endswith("experts.gate_up_proj") for n in names)
        r["ok"] = r["ok"] and r["fused_tensors"] == ("_fused_" in r["dir"])
        results.append(r)
        print(json.dumps(r))
    for path in sorted(argv):
        if "_per_expert_" not in path:
            continue
        other = path.replace("_per_expert_", "_fused_")
        if other in argv:
            (sa, la), (sb, lb) = loaded(path), loaded(other)
            same = sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
            d = (la - lb).abs().max().item()
            # The parameters must be the same numbers; the logits may differ in
            # the last bits, since torch may pick another kernel for a tensor
            # converted on load (non-contiguous) than for one read as is.
            pairs.append({"per_expert": os.path.basename(path), "fused": os.path.basename(other),
                          "same_parameters": same, "max_abs_logit_diff": d, "ok": same and d <= 1e-5})
            print(json.dumps(pairs[-1]))
    ok = all(r["ok"] for r in results) and all(p["ok"] for p in pairs) and pairs
    if out:
        with open(out, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "results": results,
                       "same_logits": pairs, "ok": bool(ok)}, f, indent=1)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

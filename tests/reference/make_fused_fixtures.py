#!/usr/bin/env python3
"""Writes checkpoints in transformers 5's fused expert layout, with the real
transformers save_pretrained, from the per-expert reference checkpoints.

transformers 5 holds routed experts as two 3-D parameters per layer,
`mlp.experts.gate_up_proj` (E, 2I, H: expert e's gate rows, then its up
rows) and `mlp.experts.down_proj` (E, H, I), and Mixtral's block is `mlp`
rather than `block_sparse_moe`.  save_pretrained converts back to the Hub's
per-expert names by default; with save_original_format=False (and whenever
a PEFT adapter is attached) it writes the fused tensors as they are.

For each of ref_mixtral and ref_qwen3_moe this writes, under
tests/fixtures/fused/:
  <case>_f32/          fused, float32, sharded (max_shard_size 40KB)
  <case>_bf16/         fused, bfloat16, sharded
  <case>_bf16_per_expert/  per-expert (the default save), bfloat16, sharded:
                       the same bf16 weights in the Hub's layout, so a test
                       can ask that both layouts give identical losses
and checks that each loads back in transformers with no missing or
unexpected keys and the same logits as the per-expert original.

Needs torch and transformers 5 (a venv):
    /tmp/loravenv/bin/python tests/reference/make_fused_fixtures.py
"""
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
CASES = ("ref_mixtral", "ref_qwen3_moe")
SHARD = "40KB"


def save(model, out, **kw):
    if os.path.exists(out):
        shutil.rmtree(out)
    model.save_pretrained(out, max_shard_size=SHARD, **kw)


def names(out):
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        return sorted(json.load(f)["weight_map"])


def logits_of(path, dtype):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    m.eval()
    ids = torch.arange(1, 13).unsqueeze(0) % m.config.vocab_size
    with torch.no_grad():
        return m(input_ids=ids).logits.float()


def main():
    torch.manual_seed(0)
    report = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": {}}
    for case in CASES:
        src = os.path.join(FIX, case, "ckpt")
        base = case[len("ref_"):]
        rec = {}
        for dtype, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype)
            out = os.path.join(FIX, "fused", f"{base}_{tag}")
            save(model, out, save_original_format=False)
            fused = names(out)
            assert any(n.endswith("mlp.experts.gate_up_proj") for n in fused), fused
            assert not any(".experts.0." in n for n in fused), fused
            if tag == "bf16":
                per = os.path.join(FIX, "fused", f"{base}_bf16_per_expert")
                save(model, per)
                assert any(".experts.0." in n for n in names(per))
            # Reloads: no missing or unexpected keys, the same logits as the source in that dtype.
            m, info = AutoModelForCausalLM.from_pretrained(out, dtype="auto", output_loading_info=True)
            bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
            assert not bad, (out, bad)
            assert {str(p.dtype) for p in m.parameters()} == {str(dtype)}, out
            diff = (logits_of(out, dtype) - logits_of(src, dtype)).abs().max().item()
            assert diff == 0.0, (out, diff)
            rec[tag] = {"dir": os.path.relpath(out, FIX), "files": sorted(os.listdir(out)),
                        "expert_tensors": [n for n in fused if ".experts." in n][:4]}
        report["cases"][case] = rec
    with open(os.path.join(FIX, "fused", "made_with.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

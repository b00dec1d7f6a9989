#!/usr/bin/env python3
"""Golden QLoRA losses for tests/qlora_test.c: the LoRA fixtures
(make_lora_fixtures.py's cases) trained over their base quantised to NF4
as bitsandbytes' quantize_4bit does, then dequantised (dequantize_4bit),
in fp32, 10 AdamW steps over the adapter alone.

The quantisation is make_quant_fixtures.py's, written from bitsandbytes'
definition independently of moetune's C code (flat blocks of 64,
absmax = max |x|, x * (1 / absmax) bucketed on the fp32 pivots of
dQuantizeNF4, code * absmax).  Quantised, as moetune and transformers'
bitsandbytes integration choose: every linear layer's weight of attention
and the MLP / experts (q/k/v/o_proj, w1/w2/w3, gate/up/down_proj); not the
embedding, norms, routers (`gate`), Qwen2-MoE's shared_expert_gate or
lm_head.

Writes tests/fixtures/<case>/expected_nf4.json (per-step losses).  Checks
first that each case's base is the fixture's ckpt/ bit for bit.

Run: /work/venv/bin/python tests/reference/make_qlora_fixtures.py
(torch, numpy, safetensors; about 10 s).
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref as ref  # noqa: E402
import lora_ref as lr  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_lora_fixtures as ml  # noqa: E402
import make_quant_fixtures as mq  # noqa: E402

LEAVES = ("q_proj", "k_proj", "v_proj", "o_proj", "w1", "w2", "w3", "gate_proj", "up_proj", "down_proj")


def quantised(name, t):
    return t.dim() == 2 and name.endswith(".weight") and name[: -len(".weight")].rsplit(".", 1)[-1] in LEAVES


def run_case(case):
    torch.set_num_threads(1)
    cfg = ref.Config(case["config"])
    base = mf.init_model(cfg, case["seed"], [])
    state = {n: p.detach().clone() for n, p in base.state_dict().items()}
    d = os.path.join(mf.FIXTURES, case["name"])
    stored = load_file(os.path.join(d, "ckpt", "model.safetensors"))
    for n, t in state.items():
        assert n in stored and np.array_equal(stored[n], t.numpy()), f"{case['name']}: {n} is not the fixture's"
    count = 0
    for n, t in state.items():
        if quantised(n, t):
            _, deq = mq.quantize_4bit(t.numpy().reshape(-1).astype(np.float32), "nf4", 64, False)
            state[n] = torch.from_numpy(deq.reshape(tuple(t.shape)).copy())
            count += 1
    base.load_state_dict(state)
    targets = lr.select_targets(base, case["targets"], case["linear"])
    model = lr.apply_lora(base, targets, case["r"], case["alpha"], case["rslora"])
    lr.init_adapter(model, case["seed"] + 1, b_std=0.05)
    rows = mf.rows_from_examples(ml.examples())
    res = ml.train(case, model, rows)
    print(f"{case['name']}: {count} matrices quantised to NF4; losses " + " ".join(f"{x:.6f}" for x in res["losses"]))
    out = {"case": case["name"], "quant": "nf4, blocks of 64, no double quantisation", "quantised_matrices": count,
           "losses": res["losses"],
           "notes": "base = dequantize_4bit(quantize_4bit(W)) per linear-layer weight, then the LoRA run of "
                    "expected.json: fp32, AdamW over lora_A/lora_B only"}
    with open(os.path.join(d, "expected_nf4.json"), "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


def main():
    for c in ml.CASES:
        run_case(c)


if __name__ == "__main__":
    main()

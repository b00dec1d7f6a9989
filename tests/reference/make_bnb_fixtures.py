"""Pre-quantized bitsandbytes 4-bit checkpoints, as transformers + bitsandbytes write them.

Loads the tiny Mixtral reference checkpoint (tests/fixtures/ref_mixtral/ckpt,
fp32) with BitsAndBytesConfig(load_in_4bit=True) -- NF4 without and with
double quantization, and FP4 without -- on the CPU, and save_pretrained's it into
tests/fixtures/bnb_<case>/ckpt: config.json with its quantization_config
and model.safetensors with, per quantized Linear, `weight` U8 [numel/2, 1],
`weight.absmax`, `weight.quant_map`, `weight.quant_state.bitsandbytes__<type>`
(and `weight.nested_absmax`, `weight.nested_quant_map` under double
quantization).  transformers 5 quantizes only plain nn.Linear modules, so the
attention projections are quantized; the routers, lm_head, embedding and the
experts (held as fused 3-D parameters in memory, written per expert) stay
fp32.

Beside the checkpoint:
  dequant.safetensors  bitsandbytes' dequantization of every quantized weight
                       (fp32, its original shape), under the weight's name
  expected.json        the quantized weights' names, the quantization settings

The reference dequantization is bitsandbytes' own pure-torch one
(backends.default.ops._dequantize_4bit_compute: code[q] * absmax[i // blocksize]
over the flattened tensor, the layout its CUDA kernels and quantize_4bit use).
bitsandbytes' CPU C kernel, which F.dequantize_4bit calls on the CPU, disagrees
with it whenever a row is not a whole number of blocks (here: rows of 32 or
24 values in blocks of 64; measured with bitsandbytes 0.50.2, shapes (8, 128)
and (64, 64) agree, (32, 32) and (24, 96) do not), so neither its output nor
the CPU forward built on it is a reference for these tiny shapes;
expected.json records how many values it gets differently
(`cpu_kernel_disagrees`).  The pure-torch table writes FP4 code 8 as +0.0
(bitsandbytes' CUDA kernel computes -0.0).

tests/bnb_prequant_test.c opens the checkpoint with moetune and compares.

Run: /work/venv/bin/python tests/reference/make_bnb_fixtures.py
(torch, transformers 5, bitsandbytes 0.50 on CPU, safetensors).
"""
import json
import os
import shutil

import bitsandbytes as bnb
import bitsandbytes.functional as F
import torch
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from bitsandbytes.backends.utils import _get_4bit_code
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")

# case -> (source checkpoint, quant type, double quantization)
CASES = {
    "mixtral_nf4": ("ref_mixtral", "nf4", False),
    "mixtral_nf4_dq": ("ref_mixtral", "nf4", True),
    "mixtral_fp4": ("ref_mixtral", "fp4", False),
}


def make(case, src, qtype, dq):
    torch.manual_seed(0)
    out = os.path.join(FIX, "bnb_" + case)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qtype, bnb_4bit_use_double_quant=dq,
                             bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(FIX, src, "ckpt"), quantization_config=cfg,
                                                 dtype=torch.float32, device_map="cpu")
    model.eval()
    model.save_pretrained(os.path.join(out, "ckpt"))
    deq, names, disagree = {}, [], 0
    for name, mod in model.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            w, qs = mod.weight, mod.weight.quant_state
            absmax = qs.absmax
            if qs.nested:  # dequantize_blockwise of the nested state, then + offset (F.dequantize_4bit's order)
                absmax = F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
            ref = _dequantize_4bit_compute(w.data.reshape(-1), absmax, _get_4bit_code(qtype, w.device), qs.blocksize,
                                           qs.shape, torch.float32)
            cpu = F.dequantize_4bit(w.data, qs).float()
            disagree += int((ref.view(torch.int32) != cpu.view(torch.int32)).sum())
            deq[name + ".weight"] = ref.float().contiguous()
            names.append(name + ".weight")
    save_file(deq, os.path.join(out, "dequant.safetensors"))
    exp = {"source": src, "quant_type": qtype, "double_quant": dq, "blocksize": 64, "compute_dtype": "float32",
           "quantized": sorted(names), "cpu_kernel_disagrees": disagree,
           "versions": {"torch": torch.__version__, "bitsandbytes": bnb.__version__}}
    import transformers
    exp["versions"]["transformers"] = transformers.__version__
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)
    print(case, len(names), "quantized weights")


if __name__ == "__main__":
    torch.set_num_threads(1)
    for c, (s, q, d) in CASES.items():
        make(c, s, q, d)

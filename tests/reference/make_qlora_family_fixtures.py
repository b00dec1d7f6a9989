"""QLoRA golden fixtures: LoRA over a 4-bit base, from transformers + PEFT.

For each family's tiny reference checkpoint (tests/fixtures/ref_<family>/ckpt,
fp32), the base is quantized as `load_in_4bit: true` asks moetune to: every
stored tensor of a linear projection (attention, routed and shared experts,
dense MLPs; 2-D `*.weight`, and gpt-oss's 3-D expert tensors) is coded with
bitsandbytes' 4-bit block-wise quantization of the tensor as stored, flattened
(blocks of 64, NF4 or FP4, optional double quantization; the numpy
implementation of make_quant_fixtures.py, written from bitsandbytes'
definitions), and replaced by its dequantization in fp32. Embeddings,
lm_head, norms, routers (`gate`, `router`), `shared_expert_gate` and biases
stay as stored. That dequantized checkpoint is loaded with transformers 5
(fp32, eager attention), PEFT LoRA (r 2, alpha 4) is put on the attention
projections with a non-zero B, and torch's AdamW trains the adapters for 10
steps (lr 0.01, weight decay 0.01, clipping at 1.0): "dequantize, then
matmul in the run's precision".

Writes tests/fixtures/qlora_<family>/: adapter_init/ and adapter_final/
(PEFT's saves before and after the 10 steps),
data.jsonl (20 rows of 16 tokens), run.yaml (base_model: the ref_<family>
checkpoint itself, load_in_4bit: true) and expected.json (per-step losses,
grad norms, the quantization settings and the quantized tensors' names).
tests/qlora_families_test.sh trains moetune on each and compares the losses.

Run: /work/venv/bin/python tests/reference/make_qlora_family_fixtures.py [--case FAMILY]
(torch, transformers 5, peft, safetensors, numpy). Seeds fixed, one thread.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_quant_fixtures as mq  # noqa: E402

FIX = os.path.join(HERE, "..", "fixtures")
R, ALPHA, LR, WD, STEPS, MB, T = 2, 4.0, 0.01, 0.01, 10, 2, 16
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLA = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]

# family -> (LoRA targets, quant type, double quantization): each setting is
# covered by at least one family
CASES = {
    "mixtral": (ATTN, "nf4", False),
    "qwen2_moe": (ATTN, "nf4", True),
    "qwen3_moe": (ATTN, "nf4", False),
    "olmoe": (ATTN, "fp4", False),
    "deepseek_v3": (MLA, "nf4", True),
    "deepseek_v2": (MLA, "nf4", False),
    "glm4_moe": (ATTN, "fp4", True),
    "gpt_oss": (ATTN, "nf4", False),
}

KEEP = re.compile(r"(embed_tokens|lm_head|norm|\.gate\.|\.router\.|shared_expert_gate|_bias$|\.bias$|sinks)")
GPT_OSS_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")


def quantized(name, shape):
    """Whether load_in_4bit codes this stored tensor (the rule in docs/quantization.md)."""
    if KEEP.search(name):
        return False
    return (len(shape) == 2 and name.endswith(".weight")) or (len(shape) == 3 and GPT_OSS_EXPERTS.search(name))


def round_trip(x, kind, nested):
    _, out = mq.quantize_4bit(x.reshape(-1).astype(np.float32), kind, 64, nested)
    return out.reshape(x.shape)


def quantized_checkpoint(src, dst, kind, nested):
    os.makedirs(dst)
    for f in os.listdir(src):
        if f.endswith(".safetensors"):
            t = load_file(os.path.join(src, f))
            names = [n for n in t if quantized(n, t[n].shape)]
            for n in names:
                t[n] = round_trip(t[n], kind, nested)
            save_file(t, os.path.join(dst, f), metadata={"format": "pt"})
        else:
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    return sorted(n for f in os.listdir(src) if f.endswith(".safetensors")
                  for n, a in load_file(os.path.join(src, f)).items() if quantized(n, a.shape))


def rows(vocab):
    """20 rows of T tokens, none special-looking, all different."""
    out = []
    for k in range(MB * STEPS):
        out.append([3 + (5 + 7 * k + (3 + k % 4) * i) % (vocab - 3) for i in range(T)])
    return out


def first_loss(ckpt, data, peft_model):
    """The first step's loss over the unquantized base with the same initial adapter."""
    plain = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager", dtype=torch.float32)
    lora = {n.replace("base_model.model.", "", 1): p for n, p in peft_model.named_parameters() if "lora_" in n}
    twin = get_peft_model(plain, peft_model.peft_config["default"])
    with torch.no_grad():
        for n, p in twin.named_parameters():
            if "lora_" in n:
                p.copy_(lora[n.replace("base_model.model.", "", 1)])
        x = torch.tensor(data[:MB])
        return twin(input_ids=x, labels=x.clone()).loss.item()


def run_case(family, write):
    targets, kind, nested = CASES[family]
    torch.manual_seed(1000 + sorted(CASES).index(family))
    torch.set_num_threads(1)
    ckpt = os.path.join(FIX, "ref_" + family, "ckpt")
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    work = tempfile.mkdtemp()
    try:
        names = quantized_checkpoint(ckpt, os.path.join(work, "q"), kind, nested)
        base = AutoModelForCausalLM.from_pretrained(os.path.join(work, "q"), attn_implementation="eager",
                                                    dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets,
                                                task_type="CAUSAL_LM"))
        with torch.no_grad():  # a non-zero B, so the adapters act from step 1
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 0.2)
        out = os.path.join(FIX, "qlora_" + family)
        if write:
            shutil.rmtree(out, ignore_errors=True)
            model.save_pretrained(os.path.join(out, "adapter_init"))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
        model.train()
        data = rows(cfg["vocab_size"])
        plain = first_loss(ckpt, data, model)
        losses, norms = [], []
        for step in range(STEPS):
            x = torch.tensor(data[step * MB:(step + 1) * MB])
            loss = model(input_ids=x, labels=x.clone()).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0).item())
            opt.step()
            losses.append(loss.item())
        assert all(np.isfinite(losses)), losses
        if write:
            model.save_pretrained(os.path.join(out, "adapter_final"))
        shift = abs(losses[0] - plain) / plain
        assert shift > 1e-4, f"{family}: 4 bits barely move the first loss ({shift:.1e}): the test would not see them"
        print(f"{family}: {kind}{' double-quant' if nested else ''}, {len(names)} tensors quantized; first loss "
              f"{losses[0]:.6f} ({plain:.6f} unquantized); losses "
              + " ".join(f"{v:.6f}" for v in losses))
    finally:
        shutil.rmtree(work)
    if not write:
        return
    for sub in ("adapter_init", "adapter_final"):
        p = os.path.join(out, sub, "adapter_config.json")
        c = json.load(open(p))
        c["base_model_name_or_path"] = "../ref_" + family + "/ckpt"
        c["target_modules"] = sorted(c["target_modules"])  # PEFT writes a set, in hash order
        json.dump(c, open(p, "w"), indent=2)
        rm = os.path.join(out, sub, "README.md")
        if os.path.exists(rm):
            os.remove(rm)  # PEFT's model card
    with open(os.path.join(out, "data.jsonl"), "w") as f:
        for r in data:
            f.write(json.dumps({"input_ids": r}) + "\n")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"case": "qlora_" + family, "model_type": cfg["model_type"], "steps": STEPS,
                   "bnb_4bit_quant_type": kind, "bnb_4bit_use_double_quant": nested, "blocksize": 64,
                   "lora_r": R, "lora_alpha": ALPHA, "adapted_modules": targets, "quantized_tensors": names,
                   "losses": losses, "grad_norm": norms, "first_loss_unquantized": plain,
                   "notes": "base tensors 4-bit round-tripped as stored (make_quant_fixtures.quantize_4bit), "
                            "then transformers + PEFT LoRA in fp32, eager; written by "
                            "tests/reference/make_qlora_family_fixtures.py"}, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "run.yaml"), "w") as f:
        f.write(
            "# moetune QLoRA run for this reference case (tests/reference/make_qlora_family_fixtures.py).\n"
            f"base_model: ../ref_{family}/ckpt\ndatasets:\n  - path: data.jsonl\n"
            f"sequence_len: {T}\nmicro_batch_size: {MB}\ngradient_accumulation_steps: 1\nmax_steps: {STEPS}\n"
            f"learning_rate: {LR}\nlr_scheduler: constant\nwarmup_steps: 0\n"
            "adam_beta1: 0.9\nadam_beta2: 0.999\nadam_epsilon: 1.0e-8\n"
            f"weight_decay: {WD}\nmax_grad_norm: 1.0\nshuffle: false\nseed: 1\nlogging_steps: 1\nbf16: false\n"
            f"backend: cpu\nadapter: lora\nlora_r: {R}\nlora_alpha: {ALPHA}\nlora_dropout: 0.0\n"
            "lora_target_modules:\n" + "".join(f"  - {t}\n" for t in targets) +
            "use_rslora: false\nlora_model_dir: adapter_init\n"
            f"load_in_4bit: true\nbnb_4bit_quant_type: {kind}\n"
            f"bnb_4bit_use_double_quant: {'true' if nested else 'false'}\noutput_dir: out\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--check-only", action="store_true")
    a = ap.parse_args()
    for family in sorted(CASES):
        if not a.case or a.case == family:
            run_case(family, not a.check_only)


if __name__ == "__main__":
    main()

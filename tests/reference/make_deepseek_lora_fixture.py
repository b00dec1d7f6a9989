"""LoRA on DeepSeek-V3's MLA projections, from transformers + PEFT themselves.

Writes tests/fixtures/lora_deepseek_v3_mla/ for tests/lora_test.c: the base
checkpoint is ref_deepseek_v3's (make_deepseek_fixtures.py), adapters of
rank 2 (alpha 4) on q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj and
o_proj, started from a PEFT adapter with non-zero B (adapter_init/), trained
5 steps with torch's AdamW (lr 0.01, weight decay 0.01, clipping at 1.0)
over the adapters only; adapter_final/ is PEFT's save_pretrained after
them, expected.json the losses and the scale.

Run: /tmp/loravenv/bin/python tests/reference/make_deepseek_lora_fixture.py
"""
import json
import os
import shutil
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import DeepseekV3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
BASE = os.path.join(FIX, "ref_deepseek_v3")
OUT = os.path.join(FIX, "lora_deepseek_v3_mla")
TARGETS = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
R, ALPHA, LR, WD, STEPS, MB = 2, 4.0, 0.01, 0.01, 5, 2


def main():
    torch.manual_seed(99)
    torch.set_num_threads(1)
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    shutil.copytree(os.path.join(BASE, "ckpt"), os.path.join(OUT, "ckpt"))
    shutil.copy(os.path.join(BASE, "data.jsonl"), os.path.join(OUT, "data.jsonl"))
    ids = [json.loads(l)["input_ids"] for l in open(os.path.join(OUT, "data.jsonl"))]
    base = DeepseekV3ForCausalLM.from_pretrained(os.path.join(OUT, "ckpt"), attn_implementation="eager").float()
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg)
    with torch.no_grad():  # a non-zero B, so the adapters act from step 1
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(os.path.join(OUT, "adapter_init"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    model.train()
    losses, norms = [], []
    for step in range(STEPS):
        x = torch.tensor([ids[step * MB + i] for i in range(MB)])
        out = model(input_ids=x, labels=x.clone())
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0).item())
        opt.step()
        losses.append(out.loss.item())
        print(f"step {step + 1}: loss {losses[-1]:.7f} grad norm {norms[-1]:.4f}", file=sys.stderr)
    model.save_pretrained(os.path.join(OUT, "adapter_final"))
    # moetune reads the adapter from a directory path; PEFT records the base it was made from
    for d in ("adapter_init", "adapter_final"):
        p = os.path.join(OUT, d, "adapter_config.json")
        c = json.load(open(p))
        c["base_model_name_or_path"] = "ckpt"
        json.dump(c, open(p, "w"), indent=2)
        os.remove(os.path.join(OUT, d, "README.md"))  # PEFT's model card
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"case": "lora_deepseek_v3_mla", "model_type": "deepseek_v3", "steps": STEPS, "lora_r": R,
                   "lora_alpha": ALPHA, "use_rslora": False, "scaling": ALPHA / R, "adapted_modules": TARGETS,
                   "losses": losses, "lr": [LR] * STEPS, "grad_norm": norms,
                   "notes": "DeepseekV3ForCausalLM + PEFT LoRA (eager, fp32), written by "
                            "tests/reference/make_deepseek_lora_fixture.py"}, f, indent=1)
    with open(os.path.join(OUT, "run.yaml"), "w") as f:
        f.write(
            "# moetune LoRA run for this reference case (tests/reference/make_deepseek_lora_fixture.py).\n"
            "base_model: ckpt\ndatasets:\n  - path: data.jsonl\n"
            f"sequence_len: 16\nmicro_batch_size: {MB}\ngradient_accumulation_steps: 1\nmax_steps: {STEPS}\n"
            f"learning_rate: {LR}\nlr_scheduler: constant\nwarmup_steps: 0\n"
            "adam_beta1: 0.9\nadam_beta2: 0.999\nadam_epsilon: 1.0e-8\n"
            f"weight_decay: {WD}\nmax_grad_norm: 1.0\nshuffle: false\nseed: 1\nlogging_steps: 1\nbf16: false\n"
            f"backend: cpu\nadapter: lora\nlora_r: {R}\nlora_alpha: {ALPHA}\nlora_dropout: 0.0\n"
            "lora_target_modules:\n" + "".join(f"  - {t}\n" for t in TARGETS) +
            "use_rslora: false\nlora_model_dir: adapter_init\noutput_dir: out\n"
        )


if __name__ == "__main__":
    main()

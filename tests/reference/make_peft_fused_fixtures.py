"""Fixtures made by real PEFT on transformers 5 for fused expert adapters.

PEFT on transformers 5 adapts a model's fused experts with its ParamWrapper
(peft/tuners/lora/layer.py) over the 3-D parameters `mlp.experts.gate_up_proj`
(E, 2I, H) and `mlp.experts.down_proj` (E, H, I), whether the user names them
in `target_parameters` or names the old per-expert modules (w1/w2/w3,
gate_proj/up_proj/down_proj) in `target_modules`, which PEFT rewrites to
target_parameters with a `rank_pattern` / `alpha_pattern` of 2r / 2·alpha for
gate_up_proj (peft/utils/transformers_weight_conversion.py).  What PEFT
trains there (written down in tests/reference/lora_README.md, "PEFT's fused
gate_up parametrization"): per expert e one A_e (rank rf, H) shared by the
gate rows and the up rows of one B_e (2I, rf),

    gate_up_e' = gate_up_e + s · B_e A_e,   s = alpha' / rf  (rsLoRA: alpha' / sqrt(rf))

with rf and alpha' from the patterns, stored lora_A (E·rf, H) read as
(E, rf, H) and lora_B (2I, E·rf) read as (2I, rf, E).

Cases, each under tests/fixtures/<name>/:

  lora_peft_mixtral_fused  Mixtral; LoraConfig(target_modules=[q_proj, v_proj,
                           w1, w2, w3], r 4, alpha 8): PEFT writes
                           rank_pattern {.*\\.gate_up_proj: 8} and
                           alpha_pattern {.*\\.gate_up_proj: 16}
  lora_peft_qwen3_fused    Qwen3-MoE; target_parameters=[mlp.experts.gate_up_proj,
                           mlp.experts.down_proj] and target_modules=[q_proj,
                           o_proj], r 4, alpha 16, rsLoRA, user patterns:
                           rank_pattern {down_proj: 2,
                           model.layers.1.self_attn.q_proj: 6},
                           alpha_pattern {o_proj: 8}
  lora_qwen3_dense_first   Qwen3-MoE with a dense first layer (mlp_only_layers
                           [0]): a base and a run.yaml only, for what moetune
                           saves (tests/reference/check_peft_moetune_save.py)

Each fused case: ckpt/ (config.json, model.safetensors in the per-expert
layout moetune reads), data.jsonl, adapter_init/ (PEFT's save_pretrained
after get_peft_model with B drawn normal(0, 0.2), so B is dense across gate,
up and every rank column), adapter_final/ (PEFT's save after 5 steps),
expected.json (per-step loss, grad norm before clipping, PEFT's rank and
scale per adapted module, the experts each step routed tokens to) and
run.yaml (continue adapter_init for 5 steps).  Training: torch AdamW (lr
1e-2, betas 0.9/0.999, eps 1e-8, weight decay 0.01) over the adapters,
clip_grad_norm_ 1.0, micro-batch 2, the rows of data.jsonl in order, loss =
HF's (cross entropy + router_aux_loss_coef · load-balancing loss).

Self-checks that fail the script:
  * PEFT's step-0 loss equals the plain-torch reference model
    (hf_moe_ref.py) with the adapter merged per the parametrization above
    (each expert's gate and up weights + s·B_gate,e A_e, s·B_up,e A_e), to
    1e-6 relative: the written-down parametrization is PEFT's;
  * every expert of every MoE layer receives a token in every step, so
    PEFT's fused tensors (whose untouched experts would still get AdamW's
    weight decay) and moetune's per-expert steps see the same updates;
  * every tensor of PEFT's save is loaded back by PeftModel.from_pretrained
    (compared value for value).

Run: /work/venv/bin/python tests/reference/make_peft_fused_fixtures.py
(torch, transformers 5, peft 0.21.2; a few seconds, one thread, fixed seeds).
"""

import json
import math
import os
import re
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref as ref  # noqa: E402
import make_fixtures as mf  # noqa: E402
import lora_ref as lr  # noqa: E402
import make_lora_fixtures as mlf  # noqa: E402

STEPS, MB, LR, WD, B_STD = 5, 2, 1e-2, 0.01, 0.2
PREFIX = "base_model.model."

CASES = [
    {"name": "lora_peft_mixtral_fused", "config": mlf.MIXTRAL, "seed": 6101,
     "lora": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "w1", "w2", "w3"]),
     "run_targets": ["q_proj", "v_proj", "w1", "w2", "w3"]},
    {"name": "lora_peft_qwen3_fused", "config": mlf.QWEN3, "seed": 6203,
     "lora": dict(r=4, lora_alpha=16, use_rslora=True, target_modules=["q_proj", "o_proj"],
                  target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                  rank_pattern={"down_proj": 2, "model.layers.1.self_attn.q_proj": 6},
                  alpha_pattern={"o_proj": 8}),
     "run_targets": None},  # the run takes the adapter's own targets
]
DENSE = {"name": "lora_qwen3_dense_first", "config": dict(mlf.QWEN3, mlp_only_layers=[0]), "seed": 6307}


def write_base(d, config, seed):
    os.makedirs(os.path.join(d, "ckpt"))
    with open(os.path.join(d, "ckpt", "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    base = mf.init_model(ref.Config(config), seed, [])
    ref.save_safetensors(os.path.join(d, "ckpt", "model.safetensors"),
                         {n: p.detach().clone() for n, p in base.state_dict().items()})
    with open(os.path.join(d, "data.jsonl"), "w") as fh:
        for e in mlf.examples():
            fh.write(json.dumps(e, separators=(", ", ": ")) + "\n")


def run_yaml(d, lines_extra, r, alpha, rslora, note):
    lines = [f"# {note}", "base_model: ckpt", "datasets:", "  - path: data.jsonl",
             f"sequence_len: {mf.T}", f"micro_batch_size: {MB}", "gradient_accumulation_steps: 1",
             f"max_steps: {STEPS}", f"learning_rate: {LR}", "lr_scheduler: constant", "warmup_steps: 0",
             "adam_beta1: 0.9", "adam_beta2: 0.999", "adam_epsilon: 1.0e-8", f"weight_decay: {WD}",
             "max_grad_norm: 1.0", "shuffle: false", "seed: 1", "logging_steps: 1", "bf16: false",
             "backend: cpu", "adapter: lora", f"lora_r: {r}", f"lora_alpha: {alpha}", "lora_dropout: 0.0",
             f"use_rslora: {'true' if rslora else 'false'}"] + lines_extra + ["output_dir: out"]
    with open(os.path.join(d, "run.yaml"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


def tidy_save(model, path):
    """PEFT's save_pretrained, with the base recorded as the fixture's ckpt/
    (moetune reads adapters from a directory), the target lists sorted and
    without PEFT's model card."""
    model.save_pretrained(path)
    p = os.path.join(path, "adapter_config.json")
    c = json.load(open(p))
    c["base_model_name_or_path"] = "ckpt"
    for k in ("target_modules", "target_parameters"):  # sets in PEFT: sorted, so a rerun writes the same bytes
        if isinstance(c.get(k), list):
            c[k] = sorted(c[k])
    with open(p, "w") as fh:
        json.dump(c, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.remove(os.path.join(path, "README.md"))


def peft_modules(model):
    """PEFT's rank and scale for every adapted module or parameter, by the
    name PEFT matched its patterns against."""
    out = {}
    for n, m in model.named_modules():
        if hasattr(m, "r") and isinstance(getattr(m, "r"), dict) and "default" in m.r:
            key = n.removeprefix("base_model.model.")
            if type(m).__name__ == "ParamWrapper":
                key = re.sub(r"(\.base_layer)+$", "", key) + "." + m.parameter_name
            out[key] = {"r": m.r["default"], "scaling": m.scaling["default"],
                        "kind": type(m).__name__}
    return dict(sorted(out.items()))


def expert_hits(router_logits, E, k):
    """Per MoE layer, the sorted experts that got at least one token."""
    return [sorted(set(torch.topk(rl, k, dim=-1).indices.reshape(-1).tolist())) for rl in router_logits]


def merged_reference_loss(case, d, adapter_path, ids, labels, mask):
    """The plain-torch reference (hf_moe_ref) with PEFT's adapter merged
    into the base by the parametrization this file documents."""
    cfg = ref.Config(case["config"])
    state, _ = ref.load_safetensors(os.path.join(d, "ckpt", "model.safetensors"))
    ad, _ = ref.load_safetensors(adapter_path)
    mods = json.load(open(os.path.join(d, "expected.json")))["peft_modules"]
    moe = "block_sparse_moe" if case["config"]["model_type"] == "mixtral" else "mlp"
    names = {"mixtral": ("w1", "w3", "w2")}.get(case["config"]["model_type"], ("gate_proj", "up_proj", "down_proj"))
    E = cfg.num_experts
    for key, info in mods.items():
        s = info["scaling"]
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", key)
        if not m:
            A = ad[f"{PREFIX}{key}.lora_A.weight"].double()
            B = ad[f"{PREFIX}{key}.lora_B.weight"].double()
            state[f"{key}.weight"] = (state[f"{key}.weight"].double() + s * B @ A).float()
            continue
        li, which = int(m.group(1)), m.group(2)
        wrapper = f"{PREFIX}model.layers.{li}.mlp.experts" + (".base_layer" if which == "gate_up_proj" else "")
        A = ad[f"{wrapper}.lora_A.weight"].double()
        B = ad[f"{wrapper}.lora_B.weight"].double()
        rf = A.shape[0] // E
        assert rf == info["r"], f"{key}: lora_A rank {rf}, PEFT's r {info['r']}"
        A = A.reshape(E, rf, -1)                       # (E, rf, in): experts outermost
        B = B.reshape(B.shape[0], rf, E)               # (out, rf, E): experts innermost
        for e in range(E):
            delta = s * B[:, :, e] @ A[e]              # (out, in)
            pre = f"model.layers.{li}.{moe}.experts.{e}"
            if which == "gate_up_proj":  # gate rows, then up rows; one A_e for both
                half = delta.shape[0] // 2
                for nm, part in ((names[0], delta[:half]), (names[1], delta[half:])):
                    state[f"{pre}.{nm}.weight"] = (state[f"{pre}.{nm}.weight"].double() + part).float()
            else:
                state[f"{pre}.{names[2]}.weight"] = (state[f"{pre}.{names[2]}.weight"].double() + delta).float()
    model = ref.MoeForCausalLM(cfg)
    model.load_state_dict(state)
    with torch.no_grad():
        return model(ids, mask, labels)["loss"].item()


def reference_model(case, d, adapter_path, shared_a=True):
    """The plain-torch reference (hf_moe_ref + lora_ref's LoraLinear) carrying
    PEFT's adapter per expert: gate and up of expert e each a LoraLinear of
    rank rf whose B is its half of B_e, and whose A is one module shared by
    both (PEFT's parametrization) or, with shared_a False, two copies of A_e
    (moetune's separate gate and up adapters, started from the same values)."""
    cfg = ref.Config(case["config"])
    model = ref.MoeForCausalLM(cfg)
    state, _ = ref.load_safetensors(os.path.join(d, "ckpt", "model.safetensors"))
    model.load_state_dict(state)
    for p in model.parameters():
        p.requires_grad_(False)
    ad, _ = ref.load_safetensors(adapter_path)
    mods = json.load(open(os.path.join(d, "expected.json")))["peft_modules"]
    moe = "block_sparse_moe" if case["config"]["model_type"] == "mixtral" else "mlp"
    names = {"mixtral": ("w1", "w3", "w2")}.get(case["config"]["model_type"], ("gate_proj", "up_proj", "down_proj"))
    E = cfg.num_experts

    def wrap(name, A, B, alpha_over_r_scale, shared=None):
        parent, leaf = name.rsplit(".", 1)
        base = getattr(model.get_submodule(parent), leaf)
        lm = lr.LoraLinear(base, A.shape[0], 1.0)
        lm.scaling = alpha_over_r_scale
        with torch.no_grad():
            lm.lora_A.weight.copy_(A)
            lm.lora_B.weight.copy_(B)
        if shared is not None:
            lm.lora_A = shared
        setattr(model.get_submodule(parent), leaf, lm)
        return lm

    for key, info in mods.items():
        s = info["scaling"]
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", key)
        if not m:
            wrap(key, ad[f"{PREFIX}{key}.lora_A.weight"], ad[f"{PREFIX}{key}.lora_B.weight"], s)
            continue
        li, which = int(m.group(1)), m.group(2)
        wrapper = f"{PREFIX}model.layers.{li}.mlp.experts" + (".base_layer" if which == "gate_up_proj" else "")
        rf = info["r"]
        A = ad[f"{wrapper}.lora_A.weight"].reshape(E, rf, -1)
        B = ad[f"{wrapper}.lora_B.weight"].reshape(-1, rf, E)
        for e in range(E):
            pre = f"model.layers.{li}.{moe}.experts.{e}"
            if which == "down_proj":
                wrap(f"{pre}.{names[2]}", A[e], B[:, :, e], s)
                continue
            half = B.shape[0] // 2
            g = wrap(f"{pre}.{names[0]}", A[e], B[:half, :, e], s)
            wrap(f"{pre}.{names[1]}", A[e], B[half:, :, e], s, g.lora_A if shared_a else None)
    return model


def reference_losses(case, d, shared_a):
    """5 steps of the reference model under the fixture's training loop."""
    model = reference_model(case, d, os.path.join(d, "adapter_init", "adapter_model.safetensors"), shared_a)
    params = [p for p in model.parameters() if p.requires_grad]  # a shared A once
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    rows = mf.rows_from_examples(mlf.examples())
    it = mf.micro_batches(rows, MB)
    losses = []
    for _ in range(STEPS):
        ids, labels, mask = mf.batch_tensors(rows, next(it))
        loss = model(ids, mask, labels)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def check_reload(d, sub, saved_model):
    """PeftModel.from_pretrained on PEFT's own save: every tensor of the file
    lands in the model with its value."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(os.path.join(d, "ckpt"), dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, os.path.join(d, sub))
    got = {n.replace(".default", ""): p for n, p in loaded.named_parameters() if "lora_" in n}
    file = load_file(os.path.join(d, sub, "adapter_model.safetensors"))
    assert set(got) == set(file), f"{sub}: PEFT loaded {sorted(set(got) ^ set(file))} differently"
    for k, v in file.items():
        assert torch.equal(got[k].detach(), v), f"{sub}: {k} differs after loading"


def make_case(case):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    d = os.path.join(mf.FIXTURES, case["name"])
    if os.path.exists(d):
        shutil.rmtree(d)
    write_base(d, case["config"], case["seed"])
    torch.manual_seed(case["seed"] + 1)
    base = AutoModelForCausalLM.from_pretrained(os.path.join(d, "ckpt"), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(lora_dropout=0.0, task_type="CAUSAL_LM", **case["lora"]))
    g = torch.Generator().manual_seed(case["seed"] + 2)
    with torch.no_grad():  # a dense non-zero B: gate and up rows over every rank column
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(B_STD * torch.randn(p.shape, generator=g))
    tidy_save(model, os.path.join(d, "adapter_init"))
    check_reload(d, "adapter_init", model)
    cfg = ref.Config(case["config"])
    rows = mf.rows_from_examples(mlf.examples())
    it = mf.micro_batches(rows, MB)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    model.train()
    losses, norms, hits = [], [], []
    first = None
    for step in range(STEPS):
        ids, labels, mask = mf.batch_tensors(rows, next(it))
        if first is None:
            first = (ids, labels, mask)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, output_router_logits=True)
        h = expert_hits(out.router_logits, cfg.num_experts, cfg.num_experts_per_tok)
        assert all(len(x) == cfg.num_experts for x in h), f"{case['name']} step {step}: idle expert {h}"
        hits.append(h)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0).item())
        opt.step()
        losses.append(out.loss.item())
    tidy_save(model, os.path.join(d, "adapter_final"))
    check_reload(d, "adapter_final", model)
    lc = dict(case["lora"])
    exp = {"case": case["name"], "model_type": case["config"]["model_type"], "steps": STEPS,
           "lora_config": lc, "peft_modules": peft_modules(model), "losses": losses, "lr": [LR] * STEPS,
           "grad_norm": norms, "experts_hit": hits, "trainable_parameters": sum(p.numel() for p in params),
           "notes": "transformers 5 + PEFT ParamWrapper on the fused experts (fp32, eager); AdamW over the "
                    "adapters, clip 1.0; written by tests/reference/make_peft_fused_fixtures.py"}
    with open(os.path.join(d, "expected.json"), "w") as fh:
        json.dump(exp, fh, indent=1)
        fh.write("\n")
    ids, labels, mask = first
    merged = merged_reference_loss(case, d, os.path.join(d, "adapter_init", "adapter_model.safetensors"),
                                   ids, labels, mask)
    rel = abs(merged - losses[0]) / abs(losses[0])
    assert rel < 1e-6, f"{case['name']}: PEFT step-0 loss {losses[0]!r}, merged reference {merged!r} ({rel:.2e})"
    shared = reference_losses(case, d, True)
    worst = max(abs(a - b) / abs(b) for a, b in zip(shared, losses))
    assert worst < 1e-6, f"{case['name']}: reference with a shared A {shared}, PEFT {losses} ({worst:.2e})"
    separate = reference_losses(case, d, False)
    apart = max(abs(a - b) / abs(b) for a, b in zip(separate, losses))
    assert apart > 1e-4, f"{case['name']}: separate gate and up A barely change the losses ({apart:.2e})"
    exp["reference_shared_a_losses"] = shared
    exp["reference_separate_a_losses"] = separate
    with open(os.path.join(d, "expected.json"), "w") as fh:
        json.dump(exp, fh, indent=1)
        fh.write("\n")
    r, alpha, rs = lc["r"], lc["lora_alpha"], lc.get("use_rslora", False)
    extra = ["lora_model_dir: adapter_init"]
    if case["run_targets"]:
        extra = ["lora_target_modules: [" + ", ".join(case["run_targets"]) + "]"] + extra
    run_yaml(d, extra, r, alpha, rs, "moetune continues PEFT's adapter_init (make_peft_fused_fixtures.py)")
    print(f"{case['name']}: step-0 loss {losses[0]:.9f} (merged reference {rel:.1e} relative); losses "
          + " ".join(f"{x:.7f}" for x in losses))
    print(f"  reference, A shared by gate and up: within {worst:.1e} relative over {STEPS} steps; "
          f"gate and up with their own A: {apart:.1e} apart")


def make_dense():
    d = os.path.join(mf.FIXTURES, DENSE["name"])
    if os.path.exists(d):
        shutil.rmtree(d)
    write_base(d, DENSE["config"], DENSE["seed"])
    run_yaml(d, ["lora_target_modules: [q_proj, gate_proj, up_proj, down_proj]"], 2, 4.0, False,
             "a fresh adapter on the dense first layer, the experts and q_proj (make_peft_fused_fixtures.py)")
    print(f"{DENSE['name']}: base and run.yaml")


def main():
    import peft
    import transformers
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, peft {peft.__version__}")
    for c in CASES:
        make_case(c)
    make_dense()


if __name__ == "__main__":
    main()

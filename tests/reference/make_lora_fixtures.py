"""Writes the LoRA golden fixtures tests/fixtures/lora_* from lora_ref.py.

Each case: a tiny base checkpoint (ckpt/), an initial PEFT adapter
(adapter_init/: adapter_config.json + adapter_model.safetensors, A
Kaiming-uniform, B small non-zero), data.jsonl, run.yaml, and what 10 AdamW
steps over the adapter alone give (expected.json: per-step loss, lr, grad
norm; expected_logits.safetensors: step-0 logits of the first micro-batch
with the initial adapter; adapter_final/adapter_model.safetensors).

Cases:
  lora_mixtral_attn     Mixtral, q/k/v/o_proj, constant LR
  lora_qwen3_experts    Qwen3-MoE, gate/up/down_proj (routed experts only),
                        rsLoRA, gradient accumulation 2; also the initial
                        adapter in PEFT's fused transformers-5 layout
                        (adapter_init/adapter_model_fused.safetensors)
  lora_qwen2_all        Qwen2-MoE, lora_target_linear (attention, routed,
                        shared expert, dense MLP; not the routers), cosine
                        schedule with warmup

Self-checks (the script fails if one fails): the LoRA forward equals the
merged model W + s B A; autograd vs central differences in float64 on A and B
of several modules; the fused layout run through PEFT's own delta formula
gives back each expert's s B A; the loss falls; routing never near a tie.

Run: /tmp/loravenv/bin/python tests/reference/make_lora_fixtures.py [--check-only]
(torch, numpy; about 10 s).  Seeds are fixed; torch on one thread.
"""

import argparse
import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref as ref  # noqa: E402
import lora_ref as lr  # noqa: E402
import make_fixtures as mf  # noqa: E402

FIXTURES = mf.FIXTURES
VOCAB = 48
STEPS = 10

COMMON = {"bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 16,
          "initializer_range": 0.02, "max_position_embeddings": 64, "num_attention_heads": 2,
          "num_key_value_heads": 1, "num_experts_per_tok": 2, "rope_theta": 10000.0,
          "router_aux_loss_coef": 0.02, "tie_word_embeddings": False, "torch_dtype": "float32",
          "use_cache": True, "vocab_size": VOCAB, "attention_dropout": 0.0}

MIXTRAL = dict(COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=8,
               num_hidden_layers=2, num_local_experts=4, output_router_logits=True, rms_norm_eps=1e-05,
               router_jitter_noise=0.0, sliding_window=None, transformers_version="4.46.0")
QWEN2 = dict(COMMON, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", decoder_sparse_step=1,
             intermediate_size=24, max_window_layers=2, mlp_only_layers=[1], moe_intermediate_size=8,
             norm_topk_prob=False, num_experts=4, num_hidden_layers=2, output_router_logits=False,
             rms_norm_eps=1e-06, shared_expert_intermediate_size=12, sliding_window=4096,
             use_sliding_window=False, transformers_version="4.46.0")
QWEN3 = dict(COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", attention_bias=False,
             decoder_sparse_step=1, head_dim=8, intermediate_size=24, max_window_layers=2, mlp_only_layers=[],
             moe_intermediate_size=8, norm_topk_prob=True, num_experts=4, num_hidden_layers=2,
             output_router_logits=True, rms_norm_eps=1e-06, rope_scaling=None, sliding_window=None,
             use_sliding_window=False, transformers_version="4.51.0")

RUN = {"sequence_len": mf.T, "micro_batch_size": 2, "max_steps": STEPS, "learning_rate": 1e-2,
       "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.01,
       "max_grad_norm": 1.0}

CASES = [
    {"name": "lora_mixtral_attn", "config": MIXTRAL, "seed": 5101, "ga": 1, "sched": "constant", "warmup": 0,
     "targets": ["q_proj", "k_proj", "v_proj", "o_proj"], "linear": False, "r": 4, "alpha": 8.0,
     "rslora": False},
    {"name": "lora_qwen3_experts", "config": QWEN3, "seed": 5203, "ga": 2, "sched": "constant", "warmup": 0,
     "targets": ["gate_proj", "up_proj", "down_proj"], "linear": False, "r": 4, "alpha": 16.0,
     "rslora": True, "fused": True},
    {"name": "lora_qwen2_all", "config": QWEN2, "seed": 5307, "ga": 1, "sched": "cosine", "warmup": 2,
     "targets": None, "linear": True, "r": 2, "alpha": 4.0, "rslora": False},
]


def examples():
    """Eight tokenized examples: label masking, absent labels, short (padded) rows."""
    def seq(start, stride, n):
        return [1 + (start + i * stride) % (VOCAB - 1) for i in range(n)]
    ex = []
    for k in range(8):
        ids = seq(3 + 7 * k, 2 + (k % 5), 16 if k % 3 else 12)
        e = {"input_ids": ids}
        if k % 2 == 0:
            e["labels"] = [-100] * (k % 4 + 1) + ids[k % 4 + 1:]
        ex.append(e)
    return ex


def lr_at(case, step):
    """engine/config/lr_schedule.c / HF get_scheduler, optimizer step `step` (0-based)."""
    base, w, n = RUN["learning_rate"], case["warmup"], STEPS
    if case["sched"] == "constant":
        return base
    if step < w:
        return base * step / max(1, w)
    p = (step - w) / max(1, n - w)
    import math
    return base * max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * p)))


def build(case, dtype=torch.float32):
    cfg = ref.Config(case["config"])
    base = mf.init_model(cfg, case["seed"], [])
    base_state = {n: p.detach().clone() for n, p in base.state_dict().items()}
    targets = lr.select_targets(base, case["targets"], case["linear"])
    model = lr.apply_lora(base, targets, case["r"], case["alpha"], case["rslora"])
    lr.init_adapter(model, case["seed"] + 1, b_std=0.05)
    return cfg, model.to(dtype), base_state, targets


def train(case, model, rows):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=RUN["learning_rate"], betas=(RUN["adam_beta1"], RUN["adam_beta2"]),
                            eps=RUN["adam_epsilon"], weight_decay=RUN["weight_decay"])
    it = mf.micro_batches(rows, RUN["micro_batch_size"])
    ga = case["ga"]
    res = {"losses": [], "micro_losses": [], "lr": [], "grad_norm": [], "min_topk_margin": 1.0}
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(case, step)
        opt.zero_grad(set_to_none=True)
        mls = []
        for a in range(ga):
            ids, labels, mask = mf.batch_tensors(rows, next(it))
            out = model(ids, mask, labels)
            (out["loss"] / ga).backward()
            mls.append(out["loss"].item())
            if step == 0 and a == 0:
                res["logits0"] = out["logits"].detach().clone()
            for _, b in model.moe_blocks():
                res["min_topk_margin"] = min(res["min_topk_margin"], b.last["topk_margin"])
        total = float(torch.nn.utils.clip_grad_norm_(params, RUN["max_grad_norm"]))
        opt.step()
        res["losses"].append(sum(mls) / len(mls))
        res["micro_losses"].append(mls)
        res["lr"].append(opt.param_groups[0]["lr"])
        res["grad_norm"].append(total)
    return res


def check_merged(model, rows):
    ids, labels, mask = mf.batch_tensors(rows, [0, 1])
    with torch.no_grad():
        a = model(ids, mask, labels)["logits"]
        b = lr.merged_copy(model)(ids, mask, labels)["logits"]
        base_only = copy.deepcopy(model)
        for _, m in lr.lora_modules(base_only):
            m.lora_B.weight.zero_()
        c = base_only(ids, mask, labels)["logits"]
    d = (a - b).abs().max().item()
    moved = (a - c).abs().max().item()
    assert d < 1e-10, f"LoRA forward differs from the merged model by {d}"
    assert moved > 1e-3, f"the initial adapter barely changes the logits ({moved})"
    return d, moved


def check_fd(model, rows):
    ids, labels, mask = mf.batch_tensors(rows, [0, 1])
    model.zero_grad(set_to_none=True)
    model(ids, mask, labels)["loss"].backward()
    worst = 0.0
    picks = [(n, m) for n, m in lr.lora_modules(model)][::3][:6]
    for n, m in picks:
        for p in (m.lora_A.weight, m.lora_B.weight):
            if p.grad is None:
                continue
            k = int(torch.argmax(p.grad.abs().reshape(-1)))
            g = p.grad.reshape(-1)[k].item()
            h = 1e-6
            with torch.no_grad():
                o = p.reshape(-1)[k].item()
                p.reshape(-1)[k] = o + h
                lp = model(ids, mask, labels)["loss"].item()
                p.reshape(-1)[k] = o - h
                lm = model(ids, mask, labels)["loss"].item()
                p.reshape(-1)[k] = o
            worst = max(worst, abs((lp - lm) / (2 * h) - g) / max(abs(g), 1e-4))
    assert worst < 1e-5, f"finite differences disagree with autograd: {worst}"
    return worst


def fused_adapter(model, cfg, scaling):
    """PEFT's transformers-5 layout for the routed experts: per layer the inner
    wrapper (experts.base_layer) over gate_up_proj (E, 2I, H) at rank 2r, the
    outer (experts) over down_proj (E, H, I); checked against PEFT's delta formula."""
    mods = dict(lr.lora_modules(model))
    out = {}
    E = cfg.num_experts
    for li, blk in model.moe_blocks():
        pre = f"model.layers.{li}.mlp.experts"
        g = [mods[f"{pre}.{e}.gate_proj"] for e in range(E)]
        u = [mods[f"{pre}.{e}.up_proj"] for e in range(E)]
        dn = [mods[f"{pre}.{e}.down_proj"] for e in range(E)]
        A, B = lr.gate_up_fused([m.lora_A.weight.detach() for m in g], [m.lora_B.weight.detach() for m in g],
                                [m.lora_A.weight.detach() for m in u], [m.lora_B.weight.detach() for m in u])
        delta = lr.fused_delta(A, B, E, scaling)
        for e in range(E):
            want = torch.cat([g[e].delta_weight(), u[e].delta_weight()], 0)
            assert torch.allclose(delta[e], want, atol=1e-6, rtol=0), "fused gate_up delta"
        out[f"{lr.PEFT_PREFIX}{pre}.base_layer.lora_A.weight"] = A
        out[f"{lr.PEFT_PREFIX}{pre}.base_layer.lora_B.weight"] = B
        A, B = lr.to_fused([m.lora_A.weight.detach() for m in dn], [m.lora_B.weight.detach() for m in dn])
        delta = lr.fused_delta(A, B, E, scaling)
        for e in range(E):
            assert torch.allclose(delta[e], dn[e].delta_weight(), atol=1e-6, rtol=0), "fused down delta"
        out[f"{lr.PEFT_PREFIX}{pre}.lora_A.weight"] = A
        out[f"{lr.PEFT_PREFIX}{pre}.lora_B.weight"] = B
    return out


def adapter_config(case, targets_written):
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "ckpt",
            "r": case["r"], "lora_alpha": case["alpha"], "lora_dropout": 0.0,
            "target_modules": targets_written, "bias": "none", "fan_in_fan_out": False,
            "use_rslora": case["rslora"], "use_dora": False, "init_lora_weights": True,
            "modules_to_save": None, "inference_mode": True}


LEAF_ORDER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate", "w1", "w2", "w3", "gate_proj", "up_proj",
              "down_proj", "shared_expert_gate"]


def write_yaml(path, case):
    lines = ["# moetune LoRA run for this reference case (see tests/reference/lora_README.md).",
             "base_model: ckpt", "datasets:", "  - path: data.jsonl",
             f"sequence_len: {RUN['sequence_len']}", f"micro_batch_size: {RUN['micro_batch_size']}",
             f"gradient_accumulation_steps: {case['ga']}", f"max_steps: {STEPS}",
             f"learning_rate: {RUN['learning_rate']}", f"lr_scheduler: {case['sched']}",
             f"warmup_steps: {case['warmup']}", "adam_beta1: 0.9", "adam_beta2: 0.999",
             "adam_epsilon: 1.0e-8", f"weight_decay: {RUN['weight_decay']}",
             f"max_grad_norm: {RUN['max_grad_norm']}", "shuffle: false", "seed: 1", "logging_steps: 1",
             "bf16: false", "backend: cpu", "adapter: lora", f"lora_r: {case['r']}",
             f"lora_alpha: {case['alpha']}", "lora_dropout: 0.0"]
    if case["linear"]:
        lines.append("lora_target_linear: true")
    else:
        lines.append("lora_target_modules: [" + ", ".join(case["targets"]) + "]")
    lines += [f"use_rslora: {'true' if case['rslora'] else 'false'}", "lora_model_dir: adapter_init",
              "output_dir: out"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run_case(case, write):
    torch.set_num_threads(1)
    cfg, model, base_state, targets = build(case)
    rows = mf.rows_from_examples(examples())
    m64 = copy.deepcopy(model).double()
    merged_err, moved = check_merged(m64, rows)
    fd = check_fd(m64, rows)
    scaling = (case["alpha"] / (case["r"] ** 0.5) if case["rslora"] else case["alpha"] / case["r"])
    fused = fused_adapter(model, cfg, scaling) if case.get("fused") else None
    init_state = lr.adapter_state(model)
    res = train(case, model, rows)
    assert res["losses"][-1] < res["losses"][0], f"{case['name']}: loss did not fall {res['losses']}"
    assert res["min_topk_margin"] > 1e-4, f"{case['name']}: routing near a tie ({res['min_topk_margin']})"
    print(f"{case['name']}: {len(targets)} adapted modules, merged diff {merged_err:.1e}, "
          f"step-0 logit shift {moved:.3f}, FD rel {fd:.1e}, min top-k margin {res['min_topk_margin']:.1e}")
    print("  losses " + " ".join(f"{x:.6f}" for x in res["losses"]))
    if not write:
        return
    d = os.path.join(FIXTURES, case["name"])
    for sub in ("ckpt", "adapter_init", "adapter_final"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    with open(os.path.join(d, "ckpt", "config.json"), "w") as fh:
        json.dump(case["config"], fh, indent=2)
        fh.write("\n")
    ref.save_safetensors(os.path.join(d, "ckpt", "model.safetensors"), base_state)
    with open(os.path.join(d, "data.jsonl"), "w") as fh:
        for e in examples():
            fh.write(json.dumps(e, separators=(", ", ": ")) + "\n")
    write_yaml(os.path.join(d, "run.yaml"), case)
    # lora_target_linear is written as the leaf names it selected, not "all-linear":
    # PEFT's all-linear would also take shared_expert_gate, which moetune leaves out
    tm = case["targets"] or sorted({t.rsplit(".", 1)[1] for t in targets}, key=LEAF_ORDER.index)
    for sub in ("adapter_init", "adapter_final"):
        with open(os.path.join(d, sub, "adapter_config.json"), "w") as fh:
            json.dump(adapter_config(case, tm), fh, indent=2)
            fh.write("\n")
    ref.save_safetensors(os.path.join(d, "adapter_init", "adapter_model.safetensors"), init_state)
    if fused is not None:
        ref.save_safetensors(os.path.join(d, "adapter_init", "adapter_model_fused.safetensors"), fused)
    ref.save_safetensors(os.path.join(d, "adapter_final", "adapter_model.safetensors"), lr.adapter_state(model))
    ref.save_safetensors(os.path.join(d, "expected_logits.safetensors"), {"logits": res["logits0"]})
    exp = {"case": case["name"], "model_type": case["config"]["model_type"], "steps": STEPS,
           "lora_r": case["r"], "lora_alpha": case["alpha"], "use_rslora": case["rslora"], "scaling": scaling,
           "adapted_modules": targets, "trainable_parameters": sum(
               p.numel() for p in model.parameters() if p.requires_grad),
           "losses": res["losses"], "micro_losses": res["micro_losses"], "lr": res["lr"],
           "grad_norm": res["grad_norm"], "min_topk_margin": res["min_topk_margin"],
           "notes": "AdamW over lora_A/lora_B only; zero_grad(set_to_none) so an expert with no token "
                    "keeps its adapter untouched; clip_grad_norm_ each step; logits0 = first micro-batch, "
                    "step 0, initial adapter"}
    with open(os.path.join(d, "expected.json"), "w") as fh:
        json.dump(exp, fh, indent=1)
        fh.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--case")
    a = ap.parse_args()
    for c in CASES:
        if a.case and c["name"] != a.case:
            continue
        run_case(c, not a.check_only)


if __name__ == "__main__":
    main()

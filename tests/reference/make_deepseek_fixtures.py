"""Golden fixtures for DeepSeek-V3 from transformers' own modeling code.

Unlike hf_moe_ref.py (an independent re-implementation), this runs the real
DeepseekV3ForCausalLM of the installed transformers (5.x): MLA attention,
the grouped sigmoid router with e_score_correction_bias, shared experts and
first_k_dense_replace dense layers, eager attention, fp32.

Writes tests/fixtures/<case>/ (CASES below) in the layout reference_test.c reads:
  ckpt/config.json, ckpt/model.safetensors   (the Hub's key layout: per-expert
                                              mlp.experts.E.{gate,up,down}_proj)
  data.jsonl, run.yaml
  expected.safetensors      logits, loss, ce_loss, aux_loss (0: DeepSeek-V3
                            adds none) of micro-batch 0; grad.<name> = the
                            pre-clip gradients of optimizer step 1 (experts
                            without a token have none)
  expected.json             losses of the 5 steps, grad norms, margins
  expected_final.safetensors the weights after 5 AdamW steps

Optimizer: torch.optim.AdamW over per-expert tensors, an expert whose
gradient is absent (no token in the step) skipped, as moetune does (and
transformers 4's per-expert nn.Linear did); clip_grad_norm_ at 1.0.

Checks: the checkpoint re-loads through from_pretrained with the same
logits; routing is never near a tie (the choice's k-th vs (k+1)-th and the
group scores' kept vs dropped, both >= 1e-4, reported in expected.json).

Run: /tmp/loravenv/bin/python tests/reference/make_deepseek_fixtures.py [CASE]
(a venv with torch and transformers 5; CI does not need it).
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                          Glm4MoeConfig, Glm4MoeForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 48,
    "hidden_size": 16,
    "intermediate_size": 24,
    "moe_intermediate_size": 8,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 8,
    "q_lora_rank": 12,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "qk_nope_head_dim": 8,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rope_interleave": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "torch_dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 1,
}
BASE = dict(CONFIG)

# GLM-4.5 (glm4_moe): GQA attention with q/k/v biases, per-head q/k norm,
# half of each head rotated, DeepSeek-V3's router and shared experts
GLM = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "vocab_size": 48,
    "hidden_size": 16,
    "intermediate_size": 24,
    "moe_intermediate_size": 8,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "partial_rotary_factor": 0.5,
    "attention_bias": True,
    "use_qk_norm": True,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "routed_scaling_factor": 2.5,
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "torch_dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 1,
    # recorded but unused: transformers' GLM-4.5 adds no load-balancing loss
    "output_router_logits": True,
}
# DeepSeek-V2: MLA as V3 (RoPE on adjacent pairs through complex products),
# softmax router with group_limited_greedy, no bias buffer, no renormalisation
V2 = {k: v for k, v in BASE.items() if k not in ("scoring_func", "rope_interleave", "num_nextn_predict_layers")}
V2.update({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "topk_method": "group_limited_greedy",
           "n_routed_experts": 12, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3, "norm_topk_prob": False,
           "routed_scaling_factor": 2.0, "n_shared_experts": 2})
MODELS = {"deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM), "glm4_moe": (Glm4MoeConfig, Glm4MoeForCausalLM),
          "deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM)}
SEQ, MB, STEPS, LR, WD = 16, 2, 5, 1e-3, 0.01

# Each case: its base config, the changes to it and the seed, chosen so that
# routing keeps a margin >= 1e-4 in every step and no weight's step-1
# gradient is pure rounding noise that AdamW would blow up to an update of
# about lr in an arbitrary direction (reference_test compares final weights
# to 5e-5; with seed 13 ref_deepseek_v3_qproj has an o_proj element whose
# gradient is 3e-7 of the tensor's largest, and fails for that reason).
CASES = {
    # the layout DeepSeek-V3 ships: q through its latent, interleaved RoPE,
    # v_head_dim < qk head dim (v is zero-padded to the attention width)
    "ref_deepseek_v3": (BASE, {}, 1237),
    # V2-Lite's q_proj (q_lora_rank null), rotate_half RoPE, v_head_dim >
    # qk head dim (q and k zero-padded, q rescaled), 4 groups keep 2, top-3,
    # no renormalisation
    "ref_deepseek_v3_qproj": (BASE, {"q_lora_rank": None, "rope_interleave": False, "v_head_dim": 16,
                               "n_routed_experts": 12, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3,
                               "norm_topk_prob": False, "routed_scaling_factor": 1.5, "n_shared_experts": 2}, 12),
    # YaRN as DeepSeek-V3 ships it (rope_scaling with mscale / mscale_all_dim),
    # scaled so that the 16 positions reach past original_max_position_embeddings
    "ref_deepseek_v3_yarn": (BASE, {"qk_rope_head_dim": 8, "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32, "beta_slow": 1,
        "mscale": 0.707, "mscale_all_dim": 1.0}}, 3),
    # DeepSeek-V2 (group_limited_greedy) and V2-Lite's shape (q_proj, greedy)
    "ref_deepseek_v2": (V2, {}, 24),
    "ref_deepseek_v2_lite": (V2, {"q_lora_rank": None, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                                  "routed_scaling_factor": 1.0, "v_head_dim": 16}, 22),
    # GLM-4.5: one group (as published), head_dim 16 != hidden / heads, rotary 8 of 16
    "ref_glm4_moe": (GLM, {}, 5),
    # GLM-4.5 with YaRN: the table over the 4 rotated dims, cos/sin scaled
    # by the attention factor, the softmax scale left at 1/sqrt(head_dim)
    "ref_glm4_moe_yarn": (GLM, {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 8}}, 6),
}


def hub_state(model):
    """The model's weights under the Hub's names (experts split per expert)."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().clone().contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            I = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = t[e, :I].clone()
                out[f"{pre}{e}.up_proj.weight"] = t[e, I:].clone()
        elif name.endswith("mlp.experts.down_proj"):
            pre = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = t[e].clone()
        else:
            out[name] = t
    return out


def hub_grads(model, used):
    """Gradients under the Hub's names; experts of `used` == False have none."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().clone()
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            layer = int(name.split(".")[2])
            pre = name[: name.rindex(".") + 1]
            I = CONFIG["moe_intermediate_size"]
            for e in range(g.shape[0]):
                if not used[layer][e]:
                    continue
                if name.endswith("gate_up_proj"):
                    out[f"{pre}{e}.gate_proj.weight"] = g[e, :I].clone()
                    out[f"{pre}{e}.up_proj.weight"] = g[e, I:].clone()
                else:
                    out[f"{pre}{e}.down_proj.weight"] = g[e].clone()
        else:
            out[name] = g
    return out


def load_hub(model, sd):
    """Copies Hub-named tensors into the model's (fused) parameters."""
    with torch.no_grad():
        own = dict(model.named_parameters())
        own.update(dict(model.named_buffers()))
        for name, t in own.items():
            if name.endswith("mlp.experts.gate_up_proj"):
                pre = name[: -len("gate_up_proj")]
                for e in range(t.shape[0]):
                    t[e].copy_(torch.cat([sd[f"{pre}{e}.gate_proj.weight"], sd[f"{pre}{e}.up_proj.weight"]], 0))
            elif name.endswith("mlp.experts.down_proj"):
                pre = name[: -len("down_proj")]
                for e in range(t.shape[0]):
                    t[e].copy_(sd[f"{pre}{e}.down_proj.weight"])
            elif name in sd:
                t.copy_(sd[name])


class Probe:
    """Records each router's choice margins and which experts got tokens."""

    def __init__(self, model):
        self.min_margin = float("inf")
        self.used = {}
        for layer_idx, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.register_forward_hook(self.hook(layer_idx))

    def hook(self, layer_idx):
        def f(mod, inp, out):
            _, _, idx = out
            with torch.no_grad():
                x = inp[0].reshape(-1, mod.hidden_dim).float()
                v2 = not hasattr(mod, "e_score_correction_bias")
                if v2:
                    # softmax is monotonic in a row: margins on the logits, whose
                    # fp32 noise does not shrink with the probabilities
                    ch = x @ mod.weight.float().t()
                    grouped = mod.topk_method == "group_limited_greedy"
                    G = mod.num_group if grouped else 1
                    keep_g = mod.topk_group if grouped else 1
                else:
                    ch = torch.sigmoid(x @ mod.weight.float().t()) + mod.e_score_correction_bias
                    G, keep_g = mod.num_group, mod.topk_group
                per = mod.num_experts // G
                gs = ch.view(-1, G, per).max(-1)[0] if v2 else ch.view(-1, G, per).topk(2, dim=-1)[0].sum(-1)
                sg = gs.sort(dim=-1, descending=True)[0]
                m1 = (sg[:, keep_g - 1] - sg[:, keep_g]).min().item() if G > keep_g else 1.0
                keep = gs.topk(keep_g, dim=-1)[1]
                mask = torch.zeros_like(gs).scatter_(1, keep, 1).repeat_interleave(per, dim=1).bool()
                chm = ch.masked_fill(~mask, float("-inf")).sort(dim=-1, descending=True)[0]
                k = mod.top_k
                m2 = (chm[:, k - 1] - chm[:, k]).min().item()
                self.min_margin = min(self.min_margin, m1, m2)
                u = self.used.setdefault(layer_idx, [False] * mod.num_experts)
                for e in idx.flatten().tolist():
                    u[e] = True
        return f


def batch(rows, ids):
    x = torch.tensor([ids[r] for r in rows], dtype=torch.long)
    return x, x.clone()


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for name, (base, changes, seed) in CASES.items():
        if only and name != only:
            continue
        CONFIG.clear()
        CONFIG.update(base)
        CONFIG.update(changes)
        make(os.path.join(FIXTURES, name), int(os.environ.get("SEED", seed)))


def make(OUT, seed):
    print(f"== {os.path.basename(OUT)}", file=sys.stderr)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    config_cls, model_cls = MODELS[CONFIG["model_type"]]
    cfg = config_cls(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "torch_dtype", "model_type")})
    cfg._attn_implementation = "eager"
    model = model_cls(cfg).float()
    if CONFIG.get("rope_scaling"):  # YaRN reached the rotary embedding
        assert model.model.rotary_emb.attention_scaling != 1.0, model.model.rotary_emb.attention_scaling
    if CONFIG["model_type"] == "glm4_moe":  # the partial rotary factor reached the rotary embedding
        rd = int(CONFIG["head_dim"] * CONFIG["partial_rotary_factor"])
        assert model.model.rotary_emb.inv_freq.numel() == rd // 2, model.model.rotary_emb.inv_freq.shape
    # A spread of weights that makes routing decisive and attention non-trivial:
    # N(0, 0.02) everywhere leaves every sigmoid score at 0.5 +- 1e-3.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:  # every RMSNorm (GLM's q/k norms too)
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.15)
        for layer in model.model.layers:
            if hasattr(getattr(layer.mlp, "gate", None), "e_score_correction_bias"):
                layer.mlp.gate.e_score_correction_bias.copy_(0.05 * torch.randn(CONFIG["n_routed_experts"]))
    model.train()

    g = torch.Generator().manual_seed(7)
    nrows = MB * STEPS
    ids = [torch.randint(0, CONFIG["vocab_size"], (SEQ,), generator=g).tolist() for _ in range(nrows)]

    os.makedirs(os.path.join(OUT, "ckpt"), exist_ok=True)
    init = hub_state(model)
    save_file(init, os.path.join(OUT, "ckpt", "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "ckpt", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(OUT, "data.jsonl"), "w") as f:
        for r in ids:
            f.write(json.dumps({"input_ids": r}) + "\n")
    with open(os.path.join(OUT, "run.yaml"), "w") as f:
        f.write(
            "# moetune run config for the DeepSeek-V3 reference case (tests/reference/make_deepseek_fixtures.py).\n"
            "base_model: ckpt\ndatasets:\n  - path: data.jsonl\n"
            f"sequence_len: {SEQ}\nmicro_batch_size: {MB}\ngradient_accumulation_steps: 1\n"
            f"max_steps: {STEPS}\nlearning_rate: {LR}\nlr_scheduler: constant\nwarmup_steps: 0\n"
            "adam_beta1: 0.9\nadam_beta2: 0.999\nadam_epsilon: 1.0e-8\n"
            f"weight_decay: {WD}\nmax_grad_norm: 1.0\nshuffle: false\nseed: 1\nlogging_steps: 1\n"
            "bf16: false\nbackend: cpu\noutput_dir: out\n"
            "# made under transformers 4 semantics (per-expert grads None): idle experts skipped\n"
            "idle_experts: skip\n"
        )

    # the checkpoint as written loads back through transformers' own loader
    probe_model = model_cls.from_pretrained(os.path.join(OUT, "ckpt"), attn_implementation="eager").float()
    x0, y0 = batch([0, 1], ids)
    with torch.no_grad():
        a = model(input_ids=x0).logits
        b = probe_model(input_ids=x0).logits
    assert torch.equal(a, b), f"reloaded checkpoint differs: {(a - b).abs().max()}"
    del probe_model

    # per-expert optimizer tensors (moetune's homes), fused into the model each step
    hub = {k: v.clone() for k, v in init.items() if not k.endswith("e_score_correction_bias")}
    params = {k: torch.nn.Parameter(v) for k, v in hub.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    probe = Probe(model)
    losses, norms, expected = [], [], {}
    for step in range(STEPS):
        load_hub(model, {k: p.detach() for k, p in params.items()})
        model.zero_grad(set_to_none=True)
        probe.used = {}
        rows = [step * MB + i for i in range(MB)]
        x, y = batch(rows, ids)
        out = model(input_ids=x, labels=y)
        out.loss.backward()
        grads = hub_grads(model, probe.used)
        if step == 0:
            expected["logits"] = out.logits.detach().reshape(-1, CONFIG["vocab_size"]).clone()
            expected["loss"] = out.loss.detach().reshape(1).clone()
            expected["ce_loss"] = out.loss.detach().reshape(1).clone()
            expected["aux_loss"] = torch.zeros(1)
            for k, v in grads.items():
                expected["grad." + k] = v.clone()  # clipping below scales the grads in place
        for k, p in params.items():
            p.grad = grads.get(k)
        norm = torch.nn.utils.clip_grad_norm_([p for p in params.values() if p.grad is not None], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        norms.append(norm.item())
        print(f"step {step + 1}: loss {losses[-1]:.7f} grad norm {norms[-1]:.5f}", file=sys.stderr)

    assert probe.min_margin >= 1e-4, f"routing margin {probe.min_margin} too small"
    final = {k: p.detach().clone() for k, p in params.items()}
    for k, v in init.items():
        if k.endswith("e_score_correction_bias"):
            final[k] = v  # a buffer: never trained, saved as loaded
    save_file(expected, os.path.join(OUT, "expected.safetensors"), metadata={"format": "pt"})
    save_file(final, os.path.join(OUT, "expected_final.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"losses": losses, "lr": [LR] * STEPS, "grad_norm": norms,
                   "min_routing_margin": probe.min_margin,
                   "notes": f"{CONFIG['model_type']} reference from transformers' {model_cls.__name__} (eager, fp32), "
                            "written by tests/reference/make_deepseek_fixtures.py"}, f, indent=1)
    print(f"min routing margin {probe.min_margin:.3g}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Writes tests/fixtures/ref_gpt_oss/ from transformers' own GptOssForCausalLM
(transformers 5, eager attention with sinks), in the layout reference_test.c
reads (see README.md beside this script):

    ckpt/config.json, ckpt/model.safetensors   a tiny gpt-oss in the Hub's key names
    data.jsonl, run.yaml                      the same data and run as the other cases
    expected.safetensors                      micro-batch 0: logits, loss, ce_loss,
                                              aux_loss; grad.<name>: step 1's gradients
    expected.json                             5 AdamW steps: losses, grad norms
    expected_final.safetensors                weights after the 5 steps

    /tmp/loravenv/bin/python tests/reference/make_gpt_oss_fixture.py

The model: 2 layers (sliding window 4, then full attention), 4 heads / 2 kv
heads of 8, 4 experts top-2, width 24, sinks, biases everywhere,
the load-balancing loss in the loss (output_router_logits, coef 0.02), YaRN
RoPE as the released models have it (truncate false; theta 10 and 16
original positions so that the ramp between the scaled and unscaled
frequencies has an interior point at head_dim 8), and swiglu_limit 1.0 so the clamps of the experts' SwiGLU are active on both of
its sides (the released 7.0 never binds at these scales).

Self-checks: routing is never near a tie (the k-th and (k+1)-th router logits
differ by >= 1e-4 in every forward), the clamp binds for a share of gate and
up values, the sliding window changes the result, and the loss falls.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (data, run config and micro-batch order of the other cases)

OUT = os.path.join(mf.FIXTURES, "ref_gpt_oss")
SEED = 7411
AUX_COEF = 0.02

CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 2,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 24,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 64,
    "model_type": "gpt_oss",
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "output_router_logits": True,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
    "rope_theta": 10.0,
    "router_aux_loss_coef": AUX_COEF,
    "sliding_window": 4,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 1.0,
    "tie_word_embeddings": False,
    "dtype": "float32",
    "vocab_size": mf.VOCAB,
}


def build(sliding_window=None):
    kw = {k: v for k, v in CONFIG.items() if k not in ("architectures", "rope_scaling", "rope_theta", "dtype")}
    kw["rope_parameters"] = dict(CONFIG["rope_scaling"], rope_theta=CONFIG["rope_theta"])
    if sliding_window is not None:
        kw["sliding_window"] = sliding_window
    cfg = GptOssConfig(**kw)
    cfg._attn_implementation = "eager"
    return GptOssForCausalLM(cfg).float()


def init_weights(model):
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name == "model.embed_tokens.weight":
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g))  # sinks that matter: O(1) against the scores
            elif name.endswith("router.weight"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "bias" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("gate_up_proj") or name.endswith("down_proj"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


class Probe:
    """Router logits and the experts' gate_up of every forward, for the self-checks."""

    def __init__(self, model):
        self.min_margin = float("inf")
        self.gate_clamped = self.up_clamped = self.total = 0
        self.limit = model.config.swiglu_limit
        for layer in model.model.layers:
            layer.mlp.router.register_forward_hook(self.router_hook)
            layer.mlp.experts.register_forward_hook(self.experts_hook)

    def router_hook(self, mod, inp, out):
        logits = out[0].detach()
        top = torch.topk(logits, mod.top_k + 1, dim=-1).values
        self.min_margin = min(self.min_margin, float((top[:, -2] - top[:, -1]).min()))

    def experts_hook(self, mod, inp, out):
        x, idx = inp[0].detach(), inp[1]
        for e in range(mod.num_experts):
            rows = (idx == e).any(dim=-1)
            gu = x[rows] @ mod.gate_up_proj[e].detach() + mod.gate_up_proj_bias[e].detach()
            self.gate_clamped += int((gu[:, ::2] > self.limit).sum())
            self.up_clamped += int((gu[:, 1::2].abs() > self.limit).sum())
            self.total += gu.shape[0] * gu.shape[1] // 2


def ce_of(model, logits, labels):
    return model.loss_function(logits, labels, model.config.vocab_size)


def train(model, rows, run, probe=None):
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    opt = torch.optim.AdamW(params, lr=run["learning_rate"], betas=(run["adam_beta1"], run["adam_beta2"]),
                            eps=run["adam_epsilon"], weight_decay=run["weight_decay"])
    it = mf.micro_batches(rows, run["micro_batch_size"])
    res = {"losses": [], "grad_norm": [], "micro_batches": []}
    for step in range(run["max_steps"]):
        opt.zero_grad(set_to_none=True)
        idx = next(it)
        ids, labels, mask = mf.batch_tensors(rows, idx)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        if step == 0:
            res["first"] = {"logits": out.logits.detach().reshape(-1, mf.VOCAB).clone(),
                            "loss": out.loss.item(), "aux_loss": out.aux_loss.item(),
                            "ce_loss": ce_of(model, out.logits.detach(), labels).item(), "rows": idx}
            res["grads1"] = {n: p.grad.detach().clone() for n, p in zip(names, params) if p.grad is not None}
        total = float(torch.nn.utils.clip_grad_norm_(params, run["max_grad_norm"]))
        opt.step()
        res["losses"].append(out.loss.item())
        res["grad_norm"].append(total)
        res["micro_batches"].append([idx])
    res["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return res


def main():
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    run = dict(mf.RUN_BASE)
    rows = mf.rows_from_examples(mf.make_examples())
    model = build()
    init_weights(model)
    init_state = {n: p.detach().clone().contiguous() for n, p in model.state_dict().items()}
    probe = Probe(model)
    res = train(model, rows, run, probe)

    # self-checks
    assert probe.min_margin >= 1e-4, f"routing near a tie: margin {probe.min_margin}"
    g_share, u_share = probe.gate_clamped / probe.total, probe.up_clamped / probe.total
    assert 0.02 < g_share < 0.6 and 0.02 < u_share < 0.6, (g_share, u_share)
    assert res["losses"][-1] < res["losses"][0], res["losses"]
    other = build(sliding_window=16)
    other.load_state_dict(init_state)
    ids, labels, mask = mf.batch_tensors(rows, res["first"]["rows"])
    with torch.no_grad():
        full = other(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    assert abs(full - res["first"]["loss"]) > 1e-3, "the sliding window changes nothing"

    os.makedirs(os.path.join(OUT, "ckpt"), exist_ok=True)
    with open(os.path.join(OUT, "ckpt", "config.json"), "w") as fh:
        json.dump(CONFIG, fh, indent=2)
        fh.write("\n")
    save_file(init_state, os.path.join(OUT, "ckpt", "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "data.jsonl"), "w") as fh:
        for e in mf.make_examples():
            fh.write(json.dumps(e, separators=(", ", ": ")) + "\n")
    mf.write_yaml(os.path.join(OUT, "run.yaml"), run, 1)
    first = res["first"]
    exp = {"logits": first["logits"].contiguous(), "loss": torch.tensor([first["loss"]]),
           "ce_loss": torch.tensor([first["ce_loss"]]), "aux_loss": torch.tensor([first["aux_loss"]])}
    for n, g in res["grads1"].items():
        exp["grad." + n] = g.contiguous()
    save_file(exp, os.path.join(OUT, "expected.safetensors"), metadata={"format": "pt"})
    save_file({n: t.contiguous() for n, t in res["final"].items()},
              os.path.join(OUT, "expected_final.safetensors"), metadata={"format": "pt"})
    meta = {"losses": res["losses"], "grad_norm": res["grad_norm"], "micro_batches": res["micro_batches"],
            "note": "transformers GptOssForCausalLM (eager), fp32; grad.* = step 1's pre-clip gradients",
            "min_topk_logit_margin": probe.min_margin, "gate_clamped_share": g_share, "up_clamped_share": u_share}
    with open(os.path.join(OUT, "expected.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
        fh.write("\n")
    print("ref_gpt_oss written:", res["losses"], "margin", probe.min_margin, "clamped", g_share, u_share)


if __name__ == "__main__":
    main()

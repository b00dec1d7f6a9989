"""Writes the golden fixtures
tests/fixtures/ref_{mixtral,qwen2_moe,qwen3_moe,mixtral_padded}/ from the
independent torch reference in hf_moe_ref.py, and checks the reference
itself (finite differences in float64, float32 vs float64 trajectories, loss
falls, padding-mask independence, or for the padded case, that the padding
mask matters).

    /usr/bin/python3 tests/reference/make_fixtures.py [--check-only] [--case NAME]...

--case limits the run to the named cases (the others' files are left as
they are).

Deterministic: fixed torch seeds, one thread. See README.md beside it for the
files and the tolerances a C test should use.
"""

import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref as ref  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures")

T = 16
VOCAB = 96

# ---------------------------------------------------------------------------
# the three cases
# ---------------------------------------------------------------------------

MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 24,
    "max_position_embeddings": 64,
    "model_type": "mixtral",
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "output_router_logits": True,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.02,
    "router_jitter_noise": 0.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.46.0",
    "use_cache": True,
    "vocab_size": VOCAB,
}

QWEN2_MOE_CONFIG = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_sparse_step": 1,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "max_window_layers": 3,
    "mlp_only_layers": [1],
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 24,
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.02,
    "shared_expert_intermediate_size": 40,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.46.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB,
}

QWEN3_MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_sparse_step": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "max_window_layers": 2,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 24,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "output_router_logits": True,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB,
}

OLMOE_CONFIG = {
    "architectures": ["OlmoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "clip_qkv": None,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 24,
    "max_position_embeddings": 64,
    "model_type": "olmoe",
    "norm_topk_prob": False,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "output_router_logits": True,
    "pad_token_id": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.46.0",
    "use_cache": True,
    "vocab_size": VOCAB,
}

RUN_BASE = {
    "sequence_len": T,
    "micro_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "max_steps": 5,
    "learning_rate": 1e-3,
    "lr_scheduler": "constant",
    "warmup_steps": 0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "shuffle": False,
    "seed": 1,
    "logging_steps": 1,
    "bf16": False,
    "backend": "cpu",
}

# force_unused: (layer, expert) whose router row gets a large negative weight on
# the embedding's offset dimension, so no token (real or padding) picks it.
CASES = [
    {"name": "ref_mixtral", "config": MIXTRAL_CONFIG, "seed": 1003, "ga": 2,
     "force_unused": [(0, 3)]},
    {"name": "ref_qwen2_moe", "config": QWEN2_MOE_CONFIG, "seed": 2111, "ga": 1,
     "force_unused": [(2, 1)]},
    {"name": "ref_qwen3_moe", "config": QWEN3_MOE_CONFIG, "seed": 3239, "ga": 1,
     "force_unused": [(1, 5)]},
    # OLMoE: q/k norm over the whole projection, GQA, norm_topk_prob false
    {"name": "ref_olmoe", "config": OLMOE_CONFIG, "seed": 5102, "ga": 1,
     "force_unused": [(1, 5)]},
    # OLMoE with clip_qkv: about a third of q and k and a tenth of v clamped (step 1)
    {"name": "ref_olmoe_clip", "config": {**OLMOE_CONFIG, "clip_qkv": 1.0}, "seed": 5102, "ga": 1,
     "force_unused": [(1, 5)]},
    # right-padded rows with attention_mask, some with counted labels on the
    # padding, so HF's key-padding mask changes losses and gradients
    {"name": "ref_mixtral_padded", "config": MIXTRAL_CONFIG, "seed": 4059, "ga": 1,
     "force_unused": [(0, 3)], "examples": "padded"},
]

# Embedding: every row carries this constant on dimension 0, so the router
# input of every token has a large positive component there; a router row
# with weight FORCE_W there scores far below the others.
EMB_OFFSET = 1.5
ROUTER_STD = 0.3
FORCE_W = -8.0


def tok_seq(start, stride, n):
    return [1 + (start + i * stride) % (VOCAB - 1) for i in range(n)]


def make_examples():
    """Seven tokenized examples (axolotl 'tokenized' JSONL), covering: explicit
    labels with -100 (prompt masking), labels absent, shorter than T (padded),
    longer than T (truncated, with an explicit attention_mask)."""
    ex = []
    ids = tok_seq(5, 3, 16)
    ex.append({"input_ids": ids, "labels": [-100] * 4 + ids[4:]})
    ex.append({"input_ids": tok_seq(2, 7, 11)})
    ids = tok_seq(40, 3, 21)
    ex.append({"input_ids": ids, "attention_mask": [1] * 21})
    ids = tok_seq(17, 5, 12)
    ex.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    ex.append({"input_ids": tok_seq(60, 7, 16)})
    ids = tok_seq(11, 3, 14)
    ex.append({"input_ids": ids, "labels": [-100] * 6 + ids[6:]})
    ex.append({"input_ids": tok_seq(80, 5, 13)})
    return ex


def make_padded_examples():
    """Six right-padded examples for ref_mixtral_padded. Explicit padding is
    pad id 0 with attention_mask 0 inside input_ids. With labels -100 on the
    padding (rows 1, 4) or no explicit padding (row 2, padded by the loader),
    nothing flows back from padded positions; with labels absent (rows 0, 5)
    labels = input_ids, so the padded positions count in the loss as in HF,
    and their logits depend on the key-padding mask. Micro-batch 0 (rows 0,
    1) has both kinds, so its loss and step 1's gradients depend on the
    mask too."""
    ex = []
    ex.append({"input_ids": tok_seq(50, 3, 12) + [0] * 4, "attention_mask": [1] * 12 + [0] * 4})
    ids = tok_seq(7, 5, 10)
    ex.append({"input_ids": ids + [0] * 6, "attention_mask": [1] * 10 + [0] * 6,
               "labels": ids + [-100] * 6})
    ex.append({"input_ids": tok_seq(30, 11, 7)})
    ex.append({"input_ids": tok_seq(13, 7, 16)})
    ids = tok_seq(71, 9, 5)
    ex.append({"input_ids": ids + [0] * 11, "attention_mask": [1] * 5 + [0] * 11,
               "labels": [-100] * 2 + ids[2:] + [-100] * 11})
    ex.append({"input_ids": tok_seq(24, 13, 9) + [0] * 7, "attention_mask": [1] * 9 + [0] * 7})
    return ex


def rows_from_examples(examples):
    """moetune's engine/data/data.h semantics, as HF's model sees them: truncate to
    T, pad with id 0 / label -100 / mask 0; labels absent -> input_ids."""
    rows = []
    for e in examples:
        ids = list(e["input_ids"])[:T]
        labels = list(e.get("labels", e["input_ids"]))[:T]
        mask = list(e.get("attention_mask", [1] * len(e["input_ids"])))[:T]
        n = len(ids)
        rows.append({"input_ids": ids + [0] * (T - n),
                     "labels": labels + [ref.IGNORE_INDEX] * (T - n),
                     "attention_mask": mask + [0] * (T - n)})
    return rows


def micro_batches(rows, mb):
    """Rows in file order (shuffle false), micro-batches of mb, the last of an
    epoch smaller, wrapping to the next epoch. Yields lists of row indices."""
    while True:
        for s in range(0, len(rows), mb):
            yield list(range(s, min(s + mb, len(rows))))


def batch_tensors(rows, idx):
    ids = torch.tensor([rows[i]["input_ids"] for i in idx], dtype=torch.int64)
    labels = torch.tensor([rows[i]["labels"] for i in idx], dtype=torch.int64)
    mask = torch.tensor([rows[i]["attention_mask"] for i in idx], dtype=torch.int64)
    return ids, labels, mask


def shifted_targets(labels):
    """What engine/data/data.h calls targets: labels[t+1], -100 at the end."""
    t = torch.full_like(labels, ref.IGNORE_INDEX)
    t[:, :-1] = labels[:, 1:]
    return t


# ---------------------------------------------------------------------------
# model init
# ---------------------------------------------------------------------------

def init_model(cfg, seed, force_unused):
    torch.manual_seed(seed)
    model = ref.MoeForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):        # RMSNorms incl. q_norm / k_norm
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name == "model.embed_tokens.weight":
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
                p[:, 0] += EMB_OFFSET
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".gate.weight"):     # router: decisive enough that top-k
                p.copy_(ROUTER_STD * torch.randn(p.shape, generator=g))  # is far from ties
            else:                                   # every Linear weight, router included
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for (layer, e) in force_unused:
            moe = model.model.layers[layer].moe()
            moe.gate.weight[e, 0] = FORCE_W
    return model


# ---------------------------------------------------------------------------
# training (the semantics the C engine must reproduce)
# ---------------------------------------------------------------------------

def train(model, rows, run, pad_mask=True, keep_step1=True):
    """torch.optim.AdamW over all parameters, clip_grad_norm_ each optimizer
    step, constant LR, gradient accumulation dividing each micro-batch loss by
    the number of micro-batches. zero_grad(set_to_none=True) so experts that
    got no token have grad None and AdamW skips them entirely (no decay, no
    moment update, their per-parameter step count does not advance)."""
    params = [p for _, p in model.named_parameters()]
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.AdamW(params, lr=run["learning_rate"],
                            betas=(run["adam_beta1"], run["adam_beta2"]),
                            eps=run["adam_epsilon"], weight_decay=run["weight_decay"])
    ga = run["gradient_accumulation_steps"]
    it = micro_batches(rows, run["micro_batch_size"])
    res = {"losses": [], "micro_losses": [], "micro_batches": [], "grad_norm": [], "lr": [],
           "clip_coef": [], "unused": [], "routing": [], "min_topk_margin": float("inf"),
           "pad_only_hits": []}
    for step in range(run["max_steps"]):
        opt.zero_grad(set_to_none=True)
        mls, mbs = [], []
        for a in range(ga):
            idx = next(it)
            ids, labels, mask = batch_tensors(rows, idx)
            out = model(ids, mask, labels, pad_mask_in_attention=pad_mask)
            (out["loss"] / ga).backward()
            mls.append(out["loss"].item())
            mbs.append(idx)
            if step == 0 and a == 0 and keep_step1:
                res["first"] = {"ids": ids, "labels": labels, "mask": mask,
                                "logits": out["logits"].detach().clone(),
                                "loss": out["loss"].item(), "ce_loss": out["ce_loss"].item(),
                                "aux_loss": 0.0 if out["aux_loss"] is None else out["aux_loss"].item(),
                                "router": {l: dict(b.last) for l, b in model.moe_blocks()}}
            real = mask.reshape(-1).bool()
            for l, b in model.moe_blocks():
                res["routing"].append((step, a, l, b.last["selected"].clone()))
                res["min_topk_margin"] = min(res["min_topk_margin"], b.last["topk_margin"])
                real_hits = set(torch.unique(b.last["selected"][real]).tolist())
                pad_only = sorted(set(b.last["hit"]) - real_hits)
                if pad_only:
                    res["pad_only_hits"].append({"step": step + 1, "micro": a, "layer": l,
                                                 "experts": pad_only})
        if step == 0 and keep_step1:
            res["grads1"] = {n: p.grad.detach().clone() for n, p in zip(names, params)
                             if p.grad is not None}
        unused = set()
        for n, p in zip(names, params):
            le = ref.expert_param_index(n)
            if le is not None and p.grad is None:
                unused.add(le)
        for n, p in zip(names, params):   # all of an expert or none of it
            le = ref.expert_param_index(n)
            if le in unused:
                assert p.grad is None, n
        total = torch.nn.utils.clip_grad_norm_(params, run["max_grad_norm"])
        total = float(total)
        opt.step()
        res["losses"].append(sum(mls) / len(mls))
        res["micro_losses"].append(mls)
        res["micro_batches"].append(mbs)
        res["grad_norm"].append(total)
        res["clip_coef"].append(min(1.0, run["max_grad_norm"] / (total + 1e-6)))
        res["lr"].append(opt.param_groups[0]["lr"])
        res["unused"].append(sorted([list(x) for x in unused]))
    res["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return res


def eval_loss(model, rows, idx):
    ids, labels, mask = batch_tensors(rows, idx)
    with torch.no_grad():
        return model(ids, mask, labels)["loss"].item()


# ---------------------------------------------------------------------------
# self-checks
# ---------------------------------------------------------------------------

def finite_difference_check(model32, rows, first_idx, n_checks=10):
    """Central differences in float64 on a few parameters against autograd."""
    m = copy.deepcopy(model32).double()
    ids, labels, mask = batch_tensors(rows, first_idx)
    m.zero_grad(set_to_none=True)
    out = m(ids, mask, labels)
    out["loss"].backward()
    sel0 = [b.last["selected"].clone() for _, b in m.moe_blocks()]
    named = dict(m.named_parameters())
    # pick: the largest-|grad| element of a spread of parameter kinds
    wanted = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
              ".self_attn.q_proj.weight", ".self_attn.k_proj.bias", ".self_attn.q_norm.weight",
              ".self_attn.k_norm.weight", ".input_layernorm.weight", ".gate.weight",
              ".experts.0.", ".experts.1.w2", ".experts.2.down_proj", ".shared_expert.up_proj",
              ".shared_expert_gate.weight", ".mlp.down_proj.weight", ".self_attn.v_proj.weight"]
    picks = []
    for w in wanted:
        for n, p in named.items():
            if w in n and p.grad is not None:
                flat = p.grad.abs().reshape(-1)
                picks.append((n, int(torch.argmax(flat))))
                break
    picks = picks[:n_checks + 6]
    h = 1e-6
    worst = 0.0
    lines = []
    for n, k in picks:
        p = named[n]
        g = p.grad.reshape(-1)[k].item()
        with torch.no_grad():
            orig = p.reshape(-1)[k].item()
            p.reshape(-1)[k] = orig + h
            lp = m(ids, mask, labels)["loss"].item()
            selp = [b.last["selected"].clone() for _, b in m.moe_blocks()]
            p.reshape(-1)[k] = orig - h
            lm = m(ids, mask, labels)["loss"].item()
            selm = [b.last["selected"].clone() for _, b in m.moe_blocks()]
            p.reshape(-1)[k] = orig
        assert all(torch.equal(a, b) for a, b in zip(sel0, selp)), "routing flipped in FD"
        assert all(torch.equal(a, b) for a, b in zip(sel0, selm)), "routing flipped in FD"
        fd = (lp - lm) / (2 * h)
        err = abs(fd - g) / max(abs(g), 1e-4)
        worst = max(worst, err)
        lines.append(f"    {n}[{k}]: autograd {g:+.10e}  fd {fd:+.10e}  rel {err:.1e}")
    return worst, lines


def max_rel(a, b):
    d = (a.double() - b.double()).abs().max().item()
    s = b.double().abs().max().item()
    return d / max(s, 1e-30), d


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------

def write_yaml(path, run, ga):
    r = dict(run)
    r["gradient_accumulation_steps"] = ga
    lines = ["# moetune run config for this reference case (see tests/reference/README.md).",
             "base_model: ckpt",
             "datasets:",
             "  - path: data.jsonl"]
    order = ["sequence_len", "micro_batch_size", "gradient_accumulation_steps", "max_steps",
             "learning_rate", "lr_scheduler", "warmup_steps", "adam_beta1", "adam_beta2",
             "adam_epsilon", "weight_decay", "max_grad_norm", "shuffle", "seed", "logging_steps",
             "bf16", "backend"]
    for k in order:
        v = r[k]
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, float):
            # "1.0e-8", not Python's "1e-08": YAML 1.1 readers want a dot
            v = repr(v) if "e" not in repr(v) else f"{v:.1e}".replace("e-0", "e-").replace("e+0", "e+")
        lines.append(f"{k}: {v}")
    lines.append("output_dir: out")
    # this reference gives an expert with no token grad None (train() below)
    lines.append("# made under transformers 4 semantics (per-expert grads None): idle experts skipped")
    lines.append("idle_experts: skip")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def run_case(case, write=True):
    name = case["name"]
    cfg_dict = case["config"]
    cfg = ref.Config(cfg_dict)
    run = dict(RUN_BASE)
    run["gradient_accumulation_steps"] = case["ga"]
    padded = case.get("examples") == "padded"
    examples = make_padded_examples() if padded else make_examples()
    rows = rows_from_examples(examples)
    torch.set_num_threads(1)

    model = init_model(cfg, case["seed"], case["force_unused"])
    init_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    first_idx = next(micro_batches(rows, run["micro_batch_size"]))
    loss0_batch0 = eval_loss(model, rows, first_idx)

    # reference trajectory (float32, HF padding semantics)
    res = train(model, rows, run)
    loss5_batch0 = eval_loss(model, rows, first_idx)

    # same in float64 from the same start: scale of float32 rounding noise
    m64 = init_model(cfg, case["seed"], case["force_unused"]).double()
    res64 = train(m64, rows, run)
    # same in float32 with pure causal attention (padded keys visible to padded
    # queries): moetune's attention kernel has no padding mask
    mnp = init_model(cfg, case["seed"], case["force_unused"])
    resnp = train(mnp, rows, run, pad_mask=False)
    with torch.no_grad():
        f = res["first"]
        logits_nopad = init_model(cfg, case["seed"], case["force_unused"])(
            f["ids"], f["mask"], f["labels"], pad_mask_in_attention=False)["logits"]

    # --- checks ---
    report = {}
    same_routing = all(torch.equal(a[3], b[3]) for a, b in zip(res["routing"], res64["routing"]))
    assert same_routing, f"{name}: float32 and float64 route differently"
    assert res["unused"] == res64["unused"], f"{name}: unused sets differ (fp32 vs fp64)"
    assert padded or res["unused"] == resnp["unused"], f"{name}: unused sets differ (pad mask)"
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(res["losses"], res64["losses"]))
    gn_rel = max(abs(a - b) / abs(b) for a, b in zip(res["grad_norm"], res64["grad_norm"]))
    grad_rel = 0.0
    grad_elem = 0.0
    for n, g in res["grads1"].items():
        r_, _ = max_rel(g, res64["grads1"][n])
        grad_rel = max(grad_rel, r_)
        d = (g.double() - res64["grads1"][n]).abs() / (res64["grads1"][n].abs() + 1e-3 * res64["grads1"][n].abs().max())
        grad_elem = max(grad_elem, d.max().item())
    w_abs = max((res["final"][n].double() - res64["final"][n]).abs().max().item() for n in res["final"])
    logits_rel, _ = max_rel(res["first"]["logits"], res64["first"]["logits"])
    np_w = max((res["final"][n] - resnp["final"][n]).abs().max().item() for n in res["final"])
    np_loss = max(abs(a - b) for a, b in zip(res["losses"], resnp["losses"]))
    real = res["first"]["mask"].bool()
    np_logit_real = (res["first"]["logits"][real] - logits_nopad[real]).abs().max().item()
    np_logit_pad = (res["first"]["logits"][~real] - logits_nopad[~real]).abs().max().item() if (~real).any() else 0.0
    fd_worst, fd_lines = finite_difference_check(init_model(cfg, case["seed"], case["force_unused"]),
                                                 rows, first_idx)
    report.update({
        "fp32_vs_fp64_loss_rel": loss_rel, "fp32_vs_fp64_grad_norm_rel": gn_rel,
        "fp32_vs_fp64_step1_grad_rel_to_tensor_max": grad_rel,
        "fp32_vs_fp64_step1_grad_rel_elementwise": grad_elem,
        "fp32_vs_fp64_logits_rel": logits_rel, "fp32_vs_fp64_final_weight_abs": w_abs,
        "padmask_vs_nopadmask_final_weight_abs": np_w, "padmask_vs_nopadmask_loss_abs": np_loss,
        "padmask_vs_nopadmask_logits_real_abs": np_logit_real,
        "padmask_vs_nopadmask_logits_pad_abs": np_logit_pad,
        "fd_worst_rel": fd_worst, "min_topk_margin": res["min_topk_margin"],
        "loss_batch0_before": loss0_batch0, "loss_batch0_after": loss5_batch0,
    })
    assert fd_worst < 1e-5, f"{name}: finite differences disagree ({fd_worst})"
    assert loss5_batch0 < loss0_batch0 - 0.01, f"{name}: loss on batch 0 did not fall"
    assert res["losses"][-1] < res["losses"][0], f"{name}: logged loss did not fall"
    assert res["min_topk_margin"] > 1e-4, f"{name}: routing too close to a tie"
    if padded:  # the fixture must tell key masking from pure causal attention
        assert np_loss > 1e-3 and np_w > 1e-5 and np_logit_pad > 1e-2, \
            f"{name}: the padding mask hardly changes training ({np_loss}, {np_w}, {np_logit_pad})"
    else:
        assert not res["pad_only_hits"], f"{name}: experts hit only by padding {res['pad_only_hits']}"
        assert np_w < 1e-6 and np_loss < 1e-6, f"{name}: padding mask changes training"
    assert any(g > 1.0 for g in res["grad_norm"]), f"{name}: clipping never active"
    for le in case["force_unused"]:
        assert list(le) in res["unused"][0], f"{name}: forced unused expert {le} got tokens"

    # print summary
    print(f"== {name} ({cfg.model_type}, {sum(p.numel() for p in model.parameters())} params, "
          f"moe layers {[i for i, x in enumerate(cfg.layer_is_moe) if x]}, GA {case['ga']})")
    print("  losses    " + " ".join(f"{x:.6f}" for x in res["losses"]))
    print("  grad_norm " + " ".join(f"{x:.4f}" for x in res["grad_norm"]))
    print(f"  batch-0 loss before {loss0_batch0:.6f} after 5 steps {loss5_batch0:.6f}")
    print(f"  unused experts per step {res['unused']}")
    print(f"  step1: loss {res['first']['loss']:.7f} ce {res['first']['ce_loss']:.7f} "
          f"aux {res['first']['aux_loss']:.7f}")
    print(f"  fp32 vs fp64: loss rel {loss_rel:.1e}, grad_norm rel {gn_rel:.1e}, "
          f"step1 grads rel {grad_rel:.1e} (elementwise {grad_elem:.1e}), logits rel {logits_rel:.1e}, "
          f"final weights abs {w_abs:.1e}")
    print(f"  pad mask vs pure causal: final weights {np_w:.1e}, losses {np_loss:.1e}, "
          f"logits real {np_logit_real:.1e} pad {np_logit_pad:.1e}")
    if res["pad_only_hits"]:
        print(f"  experts hit only by padding (zero gradient, AdamW still steps): {res['pad_only_hits']}")
    print(f"  min top-k margin {res['min_topk_margin']:.2e}; finite differences (float64) worst rel {fd_worst:.1e}")
    for ln in fd_lines:
        print(ln)

    if not write:
        return report

    d = os.path.join(FIXTURES, name)
    os.makedirs(os.path.join(d, "ckpt"), exist_ok=True)
    with open(os.path.join(d, "ckpt", "config.json"), "w") as fh:
        json.dump(cfg_dict, fh, indent=2)
        fh.write("\n")
    ref.save_safetensors(os.path.join(d, "ckpt", "model.safetensors"), init_state)
    with open(os.path.join(d, "data.jsonl"), "w") as fh:
        for e in examples:
            fh.write(json.dumps(e, separators=(", ", ": ")) + "\n")
    write_yaml(os.path.join(d, "run.yaml"), run, case["ga"])

    f = res["first"]
    exp = {}
    exp["input_ids"] = f["ids"].to(torch.int32)
    exp["labels"] = f["labels"].to(torch.int32)
    exp["attention_mask"] = f["mask"].to(torch.int32)
    exp["targets"] = shifted_targets(f["labels"]).to(torch.int32)
    exp["logits"] = f["logits"]
    exp["logits_nopadmask"] = logits_nopad.detach()
    exp["loss"] = torch.tensor([f["loss"]], dtype=torch.float32)
    exp["ce_loss"] = torch.tensor([f["ce_loss"]], dtype=torch.float32)
    exp["aux_loss"] = torch.tensor([f["aux_loss"]], dtype=torch.float32)
    for l, r in f["router"].items():
        exp[f"router.{l}.logits"] = r["router_logits"]
        exp[f"router.{l}.selected"] = r["selected"].to(torch.int32)
        exp[f"router.{l}.weights"] = r["weights"]
    for n, g in res["grads1"].items():
        exp["grad." + n] = g
    ref.save_safetensors(os.path.join(d, "expected.safetensors"), exp)
    ref.save_safetensors(os.path.join(d, "expected_final.safetensors"), res["final"])

    aux_on = bool(cfg.output_router_logits)
    notes = (
        f"{cfg.model_type} reference, float32, written by tests/reference/make_fixtures.py. "
        f"expected.safetensors: micro-batch 0 = rows {first_idx} (logits, loss, ce_loss, aux_loss, router.*); "
        "grad.* = accumulated pre-clip gradients of optimizer step 1"
        + (f" (sum over its {case['ga']} micro-batches of grad(loss_mb / {case['ga']}))" if case["ga"] > 1 else "")
        + "; experts with no token in step 1 have no grad.* entry. "
        f"Aux loss {'added as router_aux_loss_coef * aux' if aux_on else 'not added (output_router_logits false); aux_loss = 0'}. "
        f"Experts [layer, expert] pushed out of step 1's routing (router weight {FORCE_W} on the embedding's "
        f"offset dimension 0): {[list(x) for x in case['force_unused']]}; unused_experts_per_step lists what actually got no token. "
        "never_updated_experts got no token in any step: their final weights equal the initial ones bit for bit. "
        "logits follow HF (padded keys masked in attention); logits_nopadmask = pure causal attention; "
        "both agree at attention_mask == 1 positions, and "
        + ("training differs: padded positions with labels count in the loss, so the key-padding mask "
           "changes losses, gradients and final weights (self_check.padmask_vs_nopadmask_*). "
           if padded else "training is identical either way. ")
        + 
        "AdamW step counts are per parameter (torch state['step']): a skipped expert's first update "
        "uses bias correction for t = 1."
    )
    meta = {
        "losses": res["losses"], "lr": res["lr"], "grad_norm": res["grad_norm"],
        "unused_experts_step1": res["unused"][0],
        "unused_experts_per_step": res["unused"],
        "never_updated_experts": [le for le in res["unused"][0] if all(le in u for u in res["unused"])],
        "micro_batches": res["micro_batches"], "micro_losses": res["micro_losses"],
        "clip_coef": res["clip_coef"],
        "first_micro_batch": {"rows": first_idx, "loss": f["loss"], "ce_loss": f["ce_loss"],
                              "aux_loss": f["aux_loss"],
                              "counted_tokens": int((shifted_targets(f["labels"]) != -100).sum())},
        "aux_in_loss": aux_on, "router_aux_loss_coef": cfg.router_aux_loss_coef,
        "moe_layers": [i for i, x in enumerate(cfg.layer_is_moe) if x],
        "forced_unused_experts": [list(x) for x in case["force_unused"]],
        "self_check": report,
        "notes": notes,
    }
    if padded:  # the other cases assert there are none
        meta["pad_only_hits"] = res["pad_only_hits"]
    with open(os.path.join(d, "expected.json"), "w") as fh:
        # one key per line, values compact: easy to read and to diff
        fh.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items())
                 + "\n}\n")
    # round-trip the files through the reader
    back, _ = ref.load_safetensors(os.path.join(d, "ckpt", "model.safetensors"))
    assert all(torch.equal(back[n], init_state[n]) for n in init_state)
    back, _ = ref.load_safetensors(os.path.join(d, "expected.safetensors"))
    assert set(back) == set(exp)
    return report


def main():
    write = "--check-only" not in sys.argv
    only = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--case"]
    unknown = set(only) - {c["name"] for c in CASES}
    assert not unknown, f"unknown --case {sorted(unknown)}; cases: {[c['name'] for c in CASES]}"
    for case in CASES:
        if not only or case["name"] in only:
            run_case(case, write=write)
    print("all reference self-checks passed" + ("; fixtures written under " + FIXTURES if write else ""))


if __name__ == "__main__":
    main()

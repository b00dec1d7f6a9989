"""Writes tests/fixtures/tf5_idle_{mixtral,qwen3_moe}_{step,skip}/ from real
transformers 5 (fused routed experts: mlp.experts.gate_up_proj (E, 2I, H),
down_proj (E, H, I)) and torch's AdamW, for the run config key idle_experts.

    /work/venv/bin/python tests/reference/make_tf5_idle_fixtures.py

Model, weights and data are those of tests/fixtures/ref_{mixtral,qwen3_moe}
(their run.yaml's hyper-parameters); both have experts that get no token in
some steps (tests/reference/README.md).

* step: torch.optim.AdamW over model.parameters() as transformers 5 holds
  them: an idle expert's slice of the fused gradient is zero and AdamW steps
  it (moments decay, the step count advances, weight decay moves it).
* skip: the same, but every expert's slice is its own torch parameter whose
  .grad is None in a step where its slice of the fused gradient is zero (no
  token, from the router's top-k; an expert reached only where the loss does
  not look still has a gradient, zero): AdamW skips it, as transformers 4's per-expert modules were.

Written per case: run.yaml (pointing at the ref_ case's ckpt and data),
expected.json (losses, grad_norm, idle experts per step) and
expected_final.safetensors: the per-expert HF names (the checkpoint's) of
every expert idle in some step and of expert 0 of each layer, after 5 steps.
Deterministic (one thread, no randomness).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (data semantics: rows, micro-batches)

FIX = mf.FIXTURES
CASES = {
    "mixtral": ("ref_mixtral", "block_sparse_moe", ("w1", "w3", "w2")),
    "qwen3_moe": ("ref_qwen3_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
}


def experts_of(model):
    """[(layer, experts module)] of the fused routed experts."""
    out = []
    for l, layer in enumerate(model.model.layers):
        ex = getattr(layer.mlp, "experts", None)
        if ex is not None and hasattr(ex, "gate_up_proj"):
            out.append((l, ex))
    return out


def per_expert(model, mod, names):
    """The fused tensors as the checkpoint's per-expert names."""
    res = {}
    for l, ex in experts_of(model):
        gu, dn = ex.gate_up_proj.detach(), ex.down_proj.detach()
        inter = dn.shape[-1]
        for e in range(gu.shape[0]):
            pre = f"model.layers.{l}.{mod}.experts.{e}."
            res[pre + names[0] + ".weight"] = gu[e, :inter].clone()
            res[pre + names[1] + ".weight"] = gu[e, inter:].clone()
            res[pre + names[2] + ".weight"] = dn[e].clone()
    return res


def train(case, mode):
    src, mod, names = CASES[case]
    ckpt = os.path.join(FIX, src, "ckpt")
    exp = json.load(open(os.path.join(FIX, src, "expected.json")))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    model.train()
    init = load_file(os.path.join(ckpt, "model.safetensors"))
    for n, t in per_expert(model, mod, names).items():   # the fused layout is read as we think
        assert torch.equal(t, init[n]), n
    run = dict(mf.RUN_BASE)
    ga = len(exp["micro_batches"][0])
    rows = mf.rows_from_examples(mf.make_examples())
    fused = {id(p) for _, ex in experts_of(model) for p in (ex.gate_up_proj, ex.down_proj)}
    dense = [p for p in model.parameters() if id(p) not in fused]
    slices = {}  # (layer, e) -> (gate_up slice param, down slice param)
    if mode == "skip":
        for l, ex in experts_of(model):
            for e in range(ex.gate_up_proj.shape[0]):
                slices[(l, e)] = (torch.nn.Parameter(ex.gate_up_proj.detach()[e].clone()),
                                  torch.nn.Parameter(ex.down_proj.detach()[e].clone()))
        params = dense + [p for pair in slices.values() for p in pair]
    else:
        params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=run["learning_rate"], betas=(run["adam_beta1"], run["adam_beta2"]),
                            eps=run["adam_epsilon"], weight_decay=run["weight_decay"])
    out = {"losses": [], "grad_norm": [], "idle_per_step": []}
    for step, mbs in enumerate(exp["micro_batches"]):
        opt.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)  # the fused experts, outside opt when skipping
        for s in slices.values():
            for p in s:
                p.grad = None
        mls, hit = [], set()
        for idx in mbs:
            ids, labels, mask = mf.batch_tensors(rows, idx)
            o = model(input_ids=ids, attention_mask=mask, labels=labels,
                      output_router_logits=True)
            (o.loss / ga).backward()
            mls.append(o.loss.item())
            k = model.config.num_experts_per_tok
            for (l, _), rl in zip(experts_of(model), o.router_logits):
                hit |= {(l, e) for e in rl.topk(k, dim=-1).indices.reshape(-1).tolist()}
        idle = []
        for l, ex in experts_of(model):
            for e in range(ex.gate_up_proj.shape[0]):
                if (l, e) not in hit:  # no token (padding included): grad None when skipping
                    idle.append([l, e])
                    continue
                if mode == "skip":
                    slices[(l, e)][0].grad = ex.gate_up_proj.grad[e].clone()
                    slices[(l, e)][1].grad = ex.down_proj.grad[e].clone()
        total = float(torch.nn.utils.clip_grad_norm_(params, run["max_grad_norm"]))
        opt.step()
        if mode == "skip":
            with torch.no_grad():
                for (l, e), (gu, dn) in slices.items():
                    ex = dict(experts_of(model))[l]
                    ex.gate_up_proj[e].copy_(gu)
                    ex.down_proj[e].copy_(dn)
        out["losses"].append(sum(mls) / len(mls))
        out["grad_norm"].append(total)
        out["idle_per_step"].append(idle)
    keep = {(l, e) for idle in out["idle_per_step"] for l, e in idle}
    keep |= {(l, 0) for l, _ in experts_of(model)}
    final = {n: t for n, t in per_expert(model, mod, names).items()
             if (int(n.split(".")[2]), int(n.split(".")[5])) in keep}
    return out, final, src, ga


def write(case, mode):
    out, final, src, ga = train(case, mode)
    d = os.path.join(FIX, f"tf5_idle_{case}_{mode}")
    os.makedirs(d, exist_ok=True)
    out["transformers"] = transformers.__version__
    out["torch"] = torch.__version__
    out["mode"] = mode
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(out, f, indent=1)
    save_file({k: v.contiguous() for k, v in sorted(final.items())},
              os.path.join(d, "expected_final.safetensors"))
    with open(os.path.join(FIX, src, "run.yaml")) as f:
        y = f.read()
    y = y.replace("base_model: ckpt", f"base_model: ../{src}/ckpt")
    y = y.replace("path: data.jsonl", f"path: ../{src}/data.jsonl")
    y = y.replace("# moetune run config for this reference case",
                  f"# written by tests/reference/make_tf5_idle_fixtures.py: transformers 5, idle experts: {mode}\n#")
    y = "".join(ln for ln in y.splitlines(True) if "idle_experts" not in ln)  # the ref_ case's own (skip)
    y += f"idle_experts: {mode}\n"
    with open(os.path.join(d, "run.yaml"), "w") as f:
        f.write(y)
    print(case, mode, "losses", out["losses"], "idle", out["idle_per_step"])


def write_pad():
    """tf5_pad_gpt_oss: the ref_gpt_oss model (pad_token_id 0) on
    ref_mixtral_padded's data, whose rows 0 and 5 pad explicitly with id 0
    and count those positions in the loss, so the embedding's row 0 would get
    a gradient; transformers' nn.Embedding(padding_idx=0) gives it zero.
    Written: losses, grad norms, the final embedding table, and
    row0_moved_by_gradient (how far row 0 would move without padding_idx)."""
    ckpt = os.path.join(FIX, "ref_gpt_oss", "ckpt")
    rows = mf.rows_from_examples(mf.make_padded_examples())
    run = dict(mf.RUN_BASE)
    res = {}
    for padding in (True, False):
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
        model.train()
        assert model.model.embed_tokens.padding_idx == 0
        if not padding:
            model.model.embed_tokens.padding_idx = None
        opt = torch.optim.AdamW(model.parameters(), lr=run["learning_rate"],
                                betas=(run["adam_beta1"], run["adam_beta2"]),
                                eps=run["adam_epsilon"], weight_decay=run["weight_decay"])
        it = mf.micro_batches(rows, run["micro_batch_size"])
        out = {"losses": [], "grad_norm": [], "row0_grad_abs_max": []}
        for step in range(run["max_steps"]):
            opt.zero_grad(set_to_none=True)
            ids, labels, mask = mf.batch_tensors(rows, next(it))
            o = model(input_ids=ids, attention_mask=mask, labels=labels, output_router_logits=True)
            o.loss.backward()
            out["row0_grad_abs_max"].append(float(model.model.embed_tokens.weight.grad[0].abs().max()))
            out["losses"].append(o.loss.item())
            out["grad_norm"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), run["max_grad_norm"])))
            opt.step()
        res[padding] = (out, model.model.embed_tokens.weight.detach().clone())
    out, emb = res[True]
    assert all(g == 0 for g in out["row0_grad_abs_max"])
    assert max(res[False][0]["row0_grad_abs_max"]) > 0, "row 0 never gets a gradient without padding_idx"
    out["row0_moved_by_gradient"] = float((res[False][1][0] - emb[0]).abs().max())
    out["transformers"] = transformers.__version__
    d = os.path.join(FIX, "tf5_pad_gpt_oss")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(out, f, indent=1)
    save_file({"model.embed_tokens.weight": emb.contiguous()}, os.path.join(d, "expected_final.safetensors"))
    with open(os.path.join(FIX, "ref_gpt_oss", "run.yaml")) as f:
        y = f.read()
    y = y.replace("base_model: ckpt", "base_model: ../ref_gpt_oss/ckpt")
    y = y.replace("path: data.jsonl", "path: ../ref_mixtral_padded/data.jsonl")
    y = "# written by tests/reference/make_tf5_idle_fixtures.py: transformers 5, padding_idx\n" + y
    with open(os.path.join(d, "run.yaml"), "w") as f:
        f.write(y)
    print("pad: losses", out["losses"], "row 0 moved by", out["row0_moved_by_gradient"])


if __name__ == "__main__":
    torch.set_num_threads(1)
    for c in CASES:
        for m in ("step", "skip"):
            write(c, m)
    write_pad()

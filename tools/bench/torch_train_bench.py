#!/usr/bin/python3
"""Trains a run config's model with PyTorch eager on the CPU and reports
tokens/s, achieved GFLOP/s and the fraction of this machine's sgemm rate,
to compare with `moetune train` on the same config (tools/bench/train_bench.sh
runs both).

What it runs, and why it is the same work as moetune's step:
  - the model: the run config's base_model_init (an HF config.json), built
    with the independent HF-Mixtral/Qwen reference in
    tests/reference/hf_moe_ref.py (per-expert loop + index_add_, as HF);
    when base_model/model.safetensors exists its weights are loaded, so both
    sides start from the same weights and route alike at first;
  - the data: the run config's dataset (tokenized JSONL), truncated/padded to
    sequence_len, micro_batch_size rows per step, a per-epoch shuffle when
    the config says so; the last micro-batch of an epoch is smaller, as in
    moetune's loader;
  - the step: forward, loss (+ router aux loss when the config asks for it),
    backward, clip_grad_norm_(max_grad_norm), torch.optim.AdamW (torch's
    default implementation for CPU in this version), zero_grad. fp32, eager.

Timing: time.perf_counter() around each whole step; tokens/s of a step is
(rows * sequence_len) / step time (padding positions count, as moetune's
metrics.jsonl "tokens" does); the report is the median over the steps after
--warmup.

FLOPs of a step (stated, the same formula is used for moetune's numbers):
  6 * N_active * tokens + 12 * L * n_heads * head_dim * rows * T^2
where N_active = the matrix parameters one token goes through (q, k, v, o,
router, top-k experts' three matrices (or a dense MLP's), shared expert and
its gate, lm_head; the embedding lookup is not a matmul and is left out),
and the second term is attention's QK^T and PV products, forward (2 products
* 2 FLOPs) and backward (x2), over the full T x T square (PaLM's convention,
appendix B; the causal half is not subtracted).

sgemm rate: torch.mm of two --sgemm-n square fp32 matrices on
--sgemm-threads threads (default: all cores), median of --sgemm-reps
products, measured in a fresh process before and after the training steps
(both printed; the percentage uses their median). torch and moetune link
the same OpenBLAS (Debian's openblas-pthread).

Usage:
  /usr/bin/python3 tools/bench/torch_train_bench.py configs/quickstart.yaml
      [--steps 40] [--warmup 5] [--threads 2] [--json]
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))


def load_run_config(path):
    import yaml
    with open(path) as f:
        rc = yaml.safe_load(f)
    base = os.path.dirname(os.path.abspath(path))

    def rel(p):
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(base, p))

    out = {
        "model_json": rel(rc["base_model_init"]) if rc.get("base_model_init") else
        os.path.join(rel(rc["base_model"]), "config.json"),
        "base_model": rel(rc["base_model"]),
        "data": rel(rc["datasets"][0]["path"]),
        "T": int(rc.get("sequence_len", 512)),
        "B": int(rc.get("micro_batch_size", 1)),
        "lr": float(rc.get("learning_rate", 1e-4)),
        "beta1": float(rc.get("adam_beta1", 0.9)),
        "beta2": float(rc.get("adam_beta2", 0.999)),
        "eps": float(rc.get("adam_epsilon", 1e-8)),
        "wd": float(rc.get("weight_decay", 0.0)),
        "max_grad_norm": float(rc.get("max_grad_norm", 1.0)),
        "shuffle": bool(rc.get("shuffle", True)),
        "seed": int(rc.get("seed", 42)),
        "ga": int(rc.get("gradient_accumulation_steps", 1)),
    }
    if rc.get("bf16"):
        raise SystemExit(f"{path}: bf16 is true; this benchmark compares fp32 training")
    return out


def load_rows(path, T):
    """(input_ids, labels, attention_mask) per row, truncated/padded to T as
    engine/data/data.h does: pad id 0, label -100, mask 0."""
    rows = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            ex = json.loads(line)
            ids = list(ex["input_ids"])[:T]
            labels = list(ex.get("labels", ids))[:T]
            mask = list(ex.get("attention_mask", [1] * len(ids)))[:T]
            n = len(ids)
            rows.append((ids + [0] * (T - n), labels + [-100] * (T - n), mask + [0] * (T - n)))
    return rows


def active_matrix_params(cfg):
    """Matrix parameters one token goes through (see the module docstring)."""
    H, hd = cfg.hidden_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer_attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H
    n = 0
    for moe in cfg.layer_is_moe:
        n += per_layer_attn
        if moe:
            n += H * cfg.num_experts  # router
            n += cfg.num_experts_per_tok * 3 * H * cfg.moe_intermediate_size
            if cfg.shared_expert_intermediate_size:
                n += 3 * H * cfg.shared_expert_intermediate_size + H
        else:
            n += 3 * H * cfg.intermediate_size
    n += H * cfg.vocab_size  # lm_head
    return n


def step_flops(cfg, rows, T):
    attn = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * rows * T * T
    return 6 * active_matrix_params(cfg) * rows * T + attn


SGEMM_CODE = """
import statistics, sys, time, torch
n, reps, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
a = torch.randn(n, n, dtype=torch.float32)
b = torch.randn(n, n, dtype=torch.float32)
c = torch.empty(n, n, dtype=torch.float32)
torch.mm(a, b, out=c)  # warm-up: threads started, pages touched
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    torch.mm(a, b, out=c)
    times.append(time.perf_counter() - t0)
print(2.0 * n ** 3 / statistics.median(times) / 1e9)
"""


def measure_sgemm(n, reps, threads):
    """GFLOP/s of torch.mm on two n x n fp32 matrices, median of reps, in a
    fresh process: torch.set_num_threads is sticky in odd ways (the first
    call also fixes OpenBLAS's thread count), so the measurement must not
    share a process with a training run that uses a different count."""
    out = subprocess.run([sys.executable, "-c", SGEMM_CODE, str(n), str(reps), str(threads)],
                         check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_config", help="moetune run config (YAML), e.g. configs/quickstart.yaml")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps timed (default 40)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch intra-op threads (default: one per core)")
    ap.add_argument("--sgemm-n", type=int, default=2048, help="sgemm matrix size (default 2048)")
    ap.add_argument("--sgemm-reps", type=int, default=5, help="sgemm products timed (default 5)")
    ap.add_argument("--sgemm-threads", type=int, default=os.cpu_count() or 1,
                    help="threads for the sgemm measurement (default: one per core)")
    ap.add_argument("--random-init", action="store_true",
                    help="ignore base_model's weights and start from a random init")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")

    import torch
    import hf_moe_ref as ref

    torch.set_num_threads(a.threads)
    rc = load_run_config(a.run_config)
    with open(rc["model_json"]) as f:
        cfg = ref.Config(json.load(f))
    torch.manual_seed(rc["seed"])
    model = ref.MoeForCausalLM(cfg)
    st_path = os.path.join(rc["base_model"], "model.safetensors")
    weights = "random init"
    if not a.random_init and os.path.exists(st_path):
        tensors, _ = ref.load_safetensors(st_path)
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise SystemExit(f"{st_path}: missing {missing[:3]} unexpected {unexpected[:3]}")
        weights = st_path
    model.train()

    rows = load_rows(rc["data"], rc["T"])
    T, B = rc["T"], rc["B"]
    opt = torch.optim.AdamW(model.parameters(), lr=rc["lr"], betas=(rc["beta1"], rc["beta2"]),
                            eps=rc["eps"], weight_decay=rc["wd"])
    rng = random.Random(rc["seed"])

    def batches():
        while True:
            order = list(range(len(rows)))
            if rc["shuffle"]:
                rng.shuffle(order)
            for s in range(0, len(order), B):
                sel = [rows[i] for i in order[s:s + B]]
                yield (torch.tensor([r[0] for r in sel], dtype=torch.long),
                       torch.tensor([r[1] for r in sel], dtype=torch.long),
                       torch.tensor([r[2] for r in sel], dtype=torch.long))

    gen = batches()
    sgemm_before = measure_sgemm(a.sgemm_n, a.sgemm_reps, a.sgemm_threads)
    tok_s, gflops, losses = [], [], []
    for step in range(a.warmup + a.steps):
        mbs = [next(gen) for _ in range(rc["ga"])]
        t0 = time.perf_counter()
        ntok, flops = 0, 0
        for ids, labels, mask in mbs:
            out = model(ids, mask, labels)
            (out["loss"] / rc["ga"]).backward()
            ntok += ids.shape[0] * T
            flops += step_flops(cfg, ids.shape[0], T)
        torch.nn.utils.clip_grad_norm_(model.parameters(), rc["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        losses.append(float(out["loss"]))
        if step >= a.warmup:
            tok_s.append(ntok / dt)
            gflops.append(flops / dt / 1e9)
    sgemm_after = measure_sgemm(a.sgemm_n, a.sgemm_reps, a.sgemm_threads)
    sgemm = statistics.median([sgemm_before, sgemm_after])

    res = {
        "impl": "pytorch-eager",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "weights": weights,
        "steps_timed": a.steps,
        "warmup": a.warmup,
        "tokens_per_step": B * T,
        "tokens_per_s_median": statistics.median(tok_s),
        "tokens_per_s_steps": tok_s,
        "gflops_median": statistics.median(gflops),
        "active_matrix_params": active_matrix_params(cfg),
        "flops_per_full_step": step_flops(cfg, B, T),
        "flops_formula": "6*N_active*tokens + 12*L*n_heads*head_dim*rows*T^2",
        "sgemm_gflops": sgemm,
        "sgemm_gflops_before": sgemm_before,
        "sgemm_gflops_after": sgemm_after,
        "sgemm_n": a.sgemm_n,
        "sgemm_threads": a.sgemm_threads,
        "pct_of_sgemm": 100.0 * statistics.median(gflops) / sgemm,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(f"pytorch {res['torch']} eager, {res['threads']} threads, weights: {weights}")
        print(f"  {a.steps} steps after {a.warmup} warm-up: median {res['tokens_per_s_median']:.0f} "
              f"tokens/s, {res['gflops_median']:.2f} GFLOP/s "
              f"({res['pct_of_sgemm']:.1f}% of sgemm)")
        print(f"  FLOPs/step = {res['flops_formula']} = {res['flops_per_full_step'] / 1e9:.3f} GFLOP "
              f"(N_active = {res['active_matrix_params']})")
        print(f"  sgemm (torch.mm {a.sgemm_n}^3 fp32, {a.sgemm_threads} threads): {sgemm:.1f} GFLOP/s "
              f"(before {sgemm_before:.1f}, after {sgemm_after:.1f})")
        print(f"  loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if not all(math.isfinite(x) for x in losses):
        print("torch_train_bench: loss is not finite", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

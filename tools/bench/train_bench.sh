#!/bin/bash
# moetune's CPU training against PyTorch eager on the same model, data and
# machine, in one run.
#
#   tools/bench/train_bench.sh [RUN.yaml] [--steps N] [--rounds R] [--json FILE]
#
# What it does
#   1. builds //tools:moetune (bazel, default config);
#   2. R rounds, each running, one after the other:
#        moetune train RUN.yaml (logging every step, output in a temp dir),
#        moetune the same with OPENBLAS_NUM_THREADS=1 (OpenBLAS on one thread:
#          then moetune's kernels split the products over its own pool),
#        tools/bench/torch_train_bench.py RUN.yaml with torch on 2 threads and
#          on 1 thread (Debian's torch 1.13, fp32, eager; it also measures the
#          machine's sgemm rate with torch.mm, before and after its steps);
#      interleaving the variants spreads the load of a shared machine evenly
#      over them;
#   3. prints, per variant, the median tokens/s over all timed steps of all
#      rounds (steps after the first 5 of each run, full micro-batches only),
#      the achieved GFLOP/s and the % of the sgemm rate (the median of all
#      sgemm measurements), and the ratios moetune / torch.
#
# FLOPs per token, the same for both (torch_train_bench.py states it):
#   6 * N_active + 12 * layers * heads * head_dim * sequence_len
# (matrix parameters one token goes through; attention's QK^T and PV over
# the full T x T square, forward and backward; PaLM's convention).
#
# The machine may be shared: the script prints the load average before and
# after, and each round's medians so the spread is visible.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
CONFIG=configs/quickstart.yaml
STEPS=60
ROUNDS=3
JSON_OUT=
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --json) JSON_OUT=$2; shift 2 ;;
    -h | --help) sed -n '2,33p' "$0"; exit 0 ;;
    -*) echo "train_bench: unknown option $1" >&2; exit 2 ;;
    *) CONFIG=$1; shift ;;
    esac
done
WARMUP=5
if [ "$STEPS" -le "$WARMUP" ]; then echo "train_bench: --steps must be > $WARMUP" >&2; exit 2; fi
TORCH_PY=/usr/bin/python3 # Debian's python, the one with torch
PY=$(command -v python3)

echo "== building //tools:moetune"
bazel build //tools:moetune 2>&1 | tail -1
MOETUNE="$(bazel info output_path 2>/dev/null)/k8-fastbuild/bin/tools/moetune"
[ -x "$MOETUNE" ] || { echo "train_bench: $MOETUNE not found" >&2; exit 1; }

WORK=$(mktemp -d /tmp/train_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

echo "== $("$MOETUNE" --version)"
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== $CONFIG: $STEPS steps per run ($WARMUP warm-up), $ROUNDS rounds"

run_moetune() { # name, env assignments...
    local name=$1 round=$2; shift 2
    local out="$WORK/$name.$round"
    env "$@" "$MOETUNE" train "$CONFIG" --set "output_dir=$out" --set "max_steps=$STEPS" \
        --set logging_steps=1 >"$WORK/$name.$round.log" 2>&1 ||
        { echo "train_bench: moetune ($name) failed:" >&2; tail -5 "$WORK/$name.$round.log" >&2; exit 1; }
    cp "$out/metrics.jsonl" "$WORK/$name.$round.metrics"
    rm -rf "$out"
}

run_torch() { # name, round, threads
    "$TORCH_PY" tools/bench/torch_train_bench.py "$CONFIG" --steps $((STEPS - WARMUP)) \
        --warmup "$WARMUP" --threads "$3" --json >"$WORK/$1.$2.json"
}

for r in $(seq 1 "$ROUNDS"); do
    echo "-- round $r/$ROUNDS"
    run_moetune moetune "$r"
    run_moetune moetune_blas1 "$r" OPENBLAS_NUM_THREADS=1
    run_torch torch_t2 "$r" 2
    run_torch torch_t1 "$r" 1
done
echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$WORK" "$ROUNDS" "$WARMUP" "$JSON_OUT" <<'EOF'
import json, statistics, sys
work, rounds, warmup, json_out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch0 = json.load(open(f"{work}/torch_t2.1.json"))
tok_per_step = torch0["tokens_per_step"]
flops_per_token = torch0["flops_per_full_step"] / tok_per_step
sgemm = []
variants = {
    "moetune": "moetune (default: OpenBLAS threaded)",
    "moetune_blas1": "moetune, OPENBLAS_NUM_THREADS=1",
    "torch_t2": "pytorch eager, 2 threads",
    "torch_t1": "pytorch eager, 1 thread",
}
res = {}
for key in variants:
    steps, per_round = [], []
    for r in range(1, rounds + 1):
        if key.startswith("moetune"):
            rows = [x for x in map(json.loads, open(f"{work}/{key}.{r}.metrics")) if "step" in x]  # not the run header
            t = [x["tokens_per_s"] for x in rows[warmup:] if x["tokens"] == tok_per_step]
        else:
            j = json.load(open(f"{work}/{key}.{r}.json"))
            t = j["tokens_per_s_steps"]
            sgemm += [j["sgemm_gflops_before"], j["sgemm_gflops_after"]]
        steps += t
        per_round.append(statistics.median(t))
    res[key] = {"tokens_per_s": statistics.median(steps), "per_round": per_round, "steps": len(steps),
                "p90": sorted(steps)[int(0.9 * (len(steps) - 1))]}
sg = statistics.median(sgemm)
print(f"\nsgemm (torch.mm 2048^3 fp32, 2 threads): median {sg:.1f} GFLOP/s "
      f"(min {min(sgemm):.1f}, max {max(sgemm):.1f}, {len(sgemm)} measurements)")
print(f"FLOPs per token: {flops_per_token / 1e6:.4f} MFLOP "
      f"(6 * N_active + 12 * L * n_heads * head_dim * T)\n")
print(f"{'variant':42s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'% sgemm':>8s}  per-round medians (p90 of steps)")
for key, label in variants.items():
    v = res[key]
    g = v["tokens_per_s"] * flops_per_token / 1e9
    v["gflops"], v["pct_sgemm"] = g, 100 * g / sg
    print(f"{label:42s} {v['tokens_per_s']:9.0f} {g:8.2f} {v['pct_sgemm']:7.1f}%  "
          f"{' '.join('%.0f' % x for x in v['per_round'])} ({v['p90']:.0f})")
best_torch = max(("torch_t2", "torch_t1"), key=lambda k: res[k]["tokens_per_s"])
print()
for m in ("moetune", "moetune_blas1"):
    for t in ("torch_t2", "torch_t1"):
        print(f"ratio {variants[m]} / {variants[t]}: {res[m]['tokens_per_s'] / res[t]['tokens_per_s']:.2f}x")
print(f"(best torch setting on this machine: {variants[best_torch]})")
if json_out:
    json.dump({"sgemm_gflops": sg, "flops_per_token": flops_per_token, "variants": res}, open(json_out, "w"), indent=1)
EOF

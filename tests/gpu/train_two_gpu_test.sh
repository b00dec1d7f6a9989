#!/usr/bin/env bash
# Data parallel on two GPUs, through the real `moetune` binary and a tiny
# Mixtral (K = 2 micro-batches per step, 6 steps, fp32):
#   1. `devices: 2` in one process (kern_comm over NCCL) against one GPU;
#   2. `mpirun -np 2`, one GPU per rank (NCCL across the ranks, bootstrapped
#      through MPI: kernels/cuda/comm_nccl_ranks.c) against one GPU;
#   3. the same two ranks started torchrun-style (RANK, WORLD_SIZE,
#      MASTER_ADDR, MASTER_PORT: NCCL bootstrapped over TCP).
# Each step's loss, ce_loss, aux_loss and grad_norm must agree within 1e-6
# relative: with one micro-batch per device the sum is the single add one
# GPU does (bit-identical on the CPU backend, tests/mpi_train_test), but the
# two GPUs' cuBLASLt may pick different algorithms for the same product, so
# the micro-batch gradients themselves may round differently; 1e-6 is the
# bound the CPU backend's multi_device_test states for reordered sums.  The
# script also says whether they were bit-identical.
# Fewer than two GPUs (or no nvidia-smi): prints SKIPPED and exits 0, as
# the rest of the GPU suite does; tagged manual + gpu.
set -u
MOETUNE="$1"; HW="$2"
[ -x "$MOETUNE" ] || { echo "usage: train_two_gpu_test.sh MOETUNE HW.yaml"; exit 2; }
ngpu=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ')
if [ "$ngpu" -lt 2 ]; then echo "SKIPPED: $ngpu GPU(s) visible (nvidia-smi -L), this test needs 2"; exit 0; fi
HW="$(cd "$(dirname "$HW")" && pwd)/$(basename "$HW")"
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
T="${TEST_TMPDIR:-$(mktemp -d)}/two_gpu"
rm -rf "$T"; mkdir -p "$T/logs"; cd "$T" || exit 2
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

mkdir -p data
cat > tiny.json <<'JSON'
{"model_type": "mixtral", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 96,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": false, "output_router_logits": true}
JSON
for i in $(seq 1 48); do
  echo "{\"input_ids\": [$((i % 64)), 5, 9, 13, $(((i * 7) % 64)), 21, 25, 29, 33, $(((i * 3) % 64)), 41, 45]}"
done > data/train.jsonl
cat > run.yaml <<YAML
base_model: $T/ckpt
base_model_init: $T/tiny.json
datasets:
  - path: $T/data/train.jsonl
sequence_len: 16
micro_batch_size: 3
gradient_accumulation_steps: 2
max_steps: 6
learning_rate: 1.0e-3
warmup_steps: 1
seed: 11
output_dir: out
backend: cuda
logging_steps: 1
progress: false
hardware: $HW
YAML
"$MOETUNE" init run.yaml >logs/init.out 2>&1 || { echo "FAIL moetune init"; cat logs/init.out; exit 1; }
steps() {
  grep '"step":' "$1/metrics.jsonl" | sed -E \
    's/.*("step":[0-9]+).*("loss":[^,]*).*("ce_loss":[^,]*).*("aux_loss":[^,]*).*("grad_norm":[^,]*).*/\1 \2 \3 \4 \5/'
}
# close NAME A B: 6 steps each, every number within 1e-6 relative
close() {
  steps "$2" > "logs/$1.a"; steps "$3" > "logs/$1.b"
  if [ "$(wc -l < "logs/$1.a")" != 6 ] || [ "$(wc -l < "logs/$1.b")" != 6 ]; then fail "$1: want 6 steps each"; return; fi
  local worst
  worst=$(paste -d' ' "logs/$1.a" "logs/$1.b" | awk '{
      for (f = 2; f <= 5; f++) { split($f, a, ":"); split($(f + 5), b, ":");
        d = a[2] - b[2]; if (d < 0) d = -d; m = a[2] < 0 ? -a[2] : a[2];
        r = m > 0 ? d / m : d; if (r > w) w = r } }
    END { printf "%.3g", w }')
  if awk -v w="$worst" 'BEGIN { exit !(w <= 1e-6) }'; then
    echo "ok   $1: within $worst relative of one GPU$(cmp -s "logs/$1.a" "logs/$1.b" && echo ' (bit-identical)')"
  else
    fail "$1: differs from one GPU by $worst relative (> 1e-6)"
  fi
}
timeout 300 "$MOETUNE" train run.yaml --set output_dir=one >logs/one.out 2>&1 || { fail "one GPU"; cat logs/one.out; }
timeout 300 "$MOETUNE" train run.yaml --set output_dir=dev2 --set devices=2 >logs/dev2.out 2>&1 \
  || { fail "devices: 2"; cat logs/dev2.out; }
close "devices: 2" one dev2
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  timeout 300 mpirun -np 2 "$MOETUNE" train run.yaml --set output_dir=rk2 >logs/rk2.out 2>&1 \
    || { fail "mpirun -np 2"; cat logs/rk2.out; }
  close "mpirun -np 2 (NCCL across ranks)" one rk2
else
  echo "SKIPPED (mpirun -np 2): mpirun not found on this machine (Debian's openmpi-bin); devices: 2 was checked"
fi
port=$((20000 + (RANDOM * 7 + $$) % 40000))
for r in 1 0; do
  WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 300 "$MOETUNE" train run.yaml --set output_dir=tr2 >"logs/tr2.r$r" 2>&1 &
  pid[r]=$!
done
wait "${pid[0]}" || { fail "torchrun-style rank 0"; cat logs/tr2.r0; }
wait "${pid[1]}" || { fail "torchrun-style rank 1"; cat logs/tr2.r1; }
close "torchrun-style 2 ranks (NCCL across ranks, bootstrapped over TCP)" one tr2
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all passed"

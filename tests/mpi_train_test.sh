#!/usr/bin/env bash
# Data parallel across processes started by `mpirun -np 2` (engine/parallel/ranks.h),
# on the real `moetune` binary with a tiny Mixtral, against one process:
#   1. K = 2 micro-batches per step over 2 ranks of one device each: every
#      step's loss, ce_loss, aux_loss, grad_norm and token count in rank 0's
#      metrics.jsonl, and the final model's tensor bytes, are bit-identical
#      to `devices: 2` in one process and to one device (K = N sums the same
#      single add), under plans with device- and host-resident gradients and
#      with streamed weights;
#   2. K = 4 over 2 ranks: bit-identical to `devices: 2` in one process
#      (each side sums (g0 + g1) + (g2 + g3)); K = 8 over 2 ranks of
#      `devices: 2` each against `devices: 4` in one process: the ranks sum
#      (d0 + d1) + (d2 + d3), one process ((d0 + d1) + d2) + d3, so the
#      first step's losses and token counts are bit-identical (the forward
#      before any update) and every step's loss, ce_loss, aux_loss and
#      grad_norm agree within 1e-6 relative (fp32 sums of 8 gradients in
#      two orders, compounded over 6 AdamW steps; measured about 1e-9);
#   3. only rank 0 writes: with rank 1 started in another working directory
#      (mpirun's MPMD form, absolute input paths, relative output_dir), rank
#      1's directory is left as it was and rank 0's holds the run;
#   4. resume: a 2-rank run with a checkpoint at step 3, resumed by 2 ranks
#      from it, logs the uninterrupted run's steps 4..6 and ends with its
#      final tensor bytes;
#   5. SIGTERM to rank 1 alone: both ranks stop after the same step, rank
#      0 saves that step's checkpoint and reports it, mpirun exits non-zero;
#   6. refusals, none of which hangs: K not a multiple of ranks x devices
#      (names both keys and the ranks), a failure on rank 1 alone (a missing
#      dataset: every rank stops, the message names rank 1 and the file),
#      base_model_init under mpirun (names `moetune init`), `moetune
#      profile` under mpirun.
# (torchrun-style launches are torchrun_train_test.sh's.)  Without an mpirun
# that can start 2 ranks here (test_lib.sh's mpirun_usable) it says
# `SKIPPED: mpirun WHY` and passes.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$1"; DIGEST="$2"; HW="$3"
for b in "$MOETUNE" "$DIGEST"; do [ -x "$b" ] || { echo "usage: mpi_train_test.sh MOETUNE CKPT_DIGEST HW.yaml"; exit 2; }; done
HW="$(cd "$(dirname "$HW")" && pwd)/$(basename "$HW")"
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
DIGEST="$(cd "$(dirname "$DIGEST")" && pwd)/$(basename "$DIGEST")"
T="${TEST_TMPDIR:-$(mktemp -d)}/mpi"
rm -rf "$T"; mkdir -p "$T/w" "$T/logs" "$T/other"; cd "$T/w" || exit 2
W="$T/w"; L="$T/logs"

# CI runs as root, which Open MPI refuses unless told; 2 ranks may exceed the
# machine's cores.  Open MPI's own allocations outlive MPI_Finalize, so a
# sanitized build's ranks run without LeakSanitizer (single-process runs in
# this file keep it); its other checks stay on.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# every part starts its ranks with mpirun
mpirun_usable 2 "every part of this test" || exit 0
RANK_ASAN="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpi() { ASAN_OPTIONS="$RANK_ASAN" timeout 120 mpirun -np 2 "$@"; }

write_tiny_mixtral 48
write_ranks_run "$HW" "$MOETUNE" || exit 1

train1() { timeout 120 "$MOETUNE" train run.yaml "$@"; }

# --- 1. K = 2 over 2 ranks = devices: 2 = one device, per plan ---------------------------
declare -A PLAN=(
  [grads_device]="--set scheduler.grads=device --set scheduler.optimizer=device"
  [grads_host]="--set scheduler.grads=host --set scheduler.optimizer=host"
  [stream]="--set scheduler.weights=stream --set scheduler.optimizer=host"
)
for plan in grads_device grads_host stream; do
  opts=${PLAN[$plan]}
  # shellcheck disable=SC2086
  train1 --set output_dir=one_$plan $opts >"$L/one_$plan.out" 2>&1 || { fail "$plan: one device failed"; cat "$L/one_$plan.out"; continue; }
  # shellcheck disable=SC2086
  train1 --set output_dir=dev2_$plan --set devices=2 $opts >"$L/dev2_$plan.out" 2>&1 \
    || { fail "$plan: devices: 2 failed"; cat "$L/dev2_$plan.out"; continue; }
  # shellcheck disable=SC2086
  mpi "$MOETUNE" train run.yaml --set output_dir=rk2_$plan $opts >"$L/rk2_$plan.out" 2>&1 \
    || { fail "$plan: mpirun -np 2 failed"; cat "$L/rk2_$plan.out"; continue; }
  grep -q "data parallel across 2 ranks (mpirun), 1 micro-batches each" "$L/rk2_$plan.out" \
    || fail "$plan: rank 0 did not report 2 ranks"
  same_run "k2_$plan" dev2_$plan rk2_$plan && same_run "k2_one_$plan" one_$plan rk2_$plan \
    && ok "$plan: K=2, 2 ranks = devices: 2 = one device (6 steps' losses, grad norms, tokens; final tensors)"
done

# --- 2. K = 4 over 2 ranks; K = 8 over 2 ranks x 2 devices ---------------------------------
train1 --set output_dir=dev2_k4 --set devices=2 --set gradient_accumulation_steps=4 >"$L/dev2_k4.out" 2>&1 \
  || fail "K=4: devices: 2 failed"
mpi "$MOETUNE" train run.yaml --set output_dir=rk2_k4 --set gradient_accumulation_steps=4 >"$L/rk2_k4.out" 2>&1 \
  || { fail "K=4: mpirun failed"; cat "$L/rk2_k4.out"; }
same_run k4 dev2_k4 rk2_k4 && ok "K=4: 2 ranks = devices: 2 in one process"
train1 --set output_dir=dev4_k8 --set devices=4 --set gradient_accumulation_steps=8 >"$L/dev4_k8.out" 2>&1 \
  || fail "K=8: devices: 4 failed"
mpi "$MOETUNE" train run.yaml --set output_dir=rk2d2_k8 --set devices=2 --set gradient_accumulation_steps=8 \
  >"$L/rk2d2_k8.out" 2>&1 || { fail "K=8: mpirun with devices: 2 failed"; cat "$L/rk2d2_k8.out"; }
steps dev4_k8 > "$L/k8.a"; steps rk2d2_k8 > "$L/k8.b"
if [ "$(wc -l < "$L/k8.a")" != 6 ] || [ "$(wc -l < "$L/k8.b")" != 6 ]; then
  fail "K=8: want 6 logged steps on both sides"
elif [ "$(head -n1 "$L/k8.a")" != "$(head -n1 "$L/k8.b" | sed -E 's/"grad_norm":[^ ]*/'"$(head -n1 "$L/k8.a" | grep -o '"grad_norm":[^ ]*')"'/')" ]; then
  fail "K=8: step 1's losses or tokens differ:"; head -n1 "$L/k8.a" "$L/k8.b"
else
  worst=$(paste -d' ' "$L/k8.a" "$L/k8.b" | awk '{
      for (f = 2; f <= 5; f++) { split($f, a, ":"); split($(f + 6), b, ":");
        d = a[2] - b[2]; if (d < 0) d = -d; m = a[2] < 0 ? -a[2] : a[2];
        r = m > 0 ? d / m : d; if (r > w) w = r } }
    END { printf "%.3g", w }')
  if awk -v w="$worst" 'BEGIN { exit !(w <= 1e-6) }'; then
    ok "K=8: 2 ranks x devices: 2 vs devices: 4: step 1 identical, every step within $worst relative (<= 1e-6)"
  else
    fail "K=8: 2 ranks x devices: 2 vs devices: 4 differ by $worst relative (> 1e-6)"
  fi
fi

# --- 3. only rank 0 writes output_dir ------------------------------------------------------
touch "$T/other/marker"
ASAN_OPTIONS="$RANK_ASAN" timeout 120 mpirun -np 1 --wdir "$W" "$MOETUNE" train "$W/run.yaml" --set output_dir=gate \
  : -np 1 --wdir "$T/other" "$MOETUNE" train "$W/run.yaml" --set output_dir=gate >"$L/gate.out" 2>&1 \
  || { fail "gate: mpirun failed"; cat "$L/gate.out"; }
if [ "$(cd "$T/other" && find . | sort | tr '\n' ' ')" != ". ./marker " ]; then
  fail "rank 1 wrote into its working directory: $(cd "$T/other" && find . | tr '\n' ' ')"
elif [ ! -f gate/metrics.jsonl ] || [ ! -f gate/model.safetensors ]; then
  fail "rank 0 did not write gate/metrics.jsonl and gate/model.safetensors"
elif [ "$(grep -c '"run_start"' gate/metrics.jsonl)" != 1 ]; then
  fail "gate/metrics.jsonl has $(grep -c '"run_start"' gate/metrics.jsonl) run headers, not 1"
else
  same_run gate dev2_grads_device gate && ok "only rank 0 wrote output_dir (rank 1's directory untouched), same run"
fi
if [ "$(grep -c '^trained 6 steps' "$L/gate.out")" != 1 ]; then
  fail "the job printed $(grep -c '^trained 6 steps' "$L/gate.out") summaries, not rank 0's alone"
fi

# --- 4. resume from a 2-rank checkpoint ----------------------------------------------------
mpi "$MOETUNE" train run.yaml --set output_dir=stop --set save_steps=3 --set save_final=false >"$L/stop.out" 2>&1 \
  || { fail "resume: the run with a checkpoint failed"; cat "$L/stop.out"; }
if [ ! -f stop/checkpoint-3/optimizer.safetensors ]; then
  fail "resume: stop/checkpoint-3/optimizer.safetensors missing"
else
  mpi "$MOETUNE" train run.yaml --set output_dir=res --set resume_from_checkpoint="$W/stop/checkpoint-3" \
    >"$L/res.out" 2>&1 || { fail "resume: the resumed run failed"; cat "$L/res.out"; }
  steps rk2_grads_device | tail -n 3 > "$L/res.ref"
  steps res > "$L/res.got"
  if [ "$(grep -c 'resuming from' "$L/res.out")" != 2 ]; then
    fail "resume: $(grep -c 'resuming from' "$L/res.out") of 2 ranks said they resumed"
  elif ! cmp -s "$L/res.ref" "$L/res.got"; then
    fail "resume: steps 4..6 differ from the uninterrupted 2-rank run:"; diff "$L/res.ref" "$L/res.got" | head -4
  elif [ "$(tensor_bytes res)" != "$(tensor_bytes rk2_grads_device)" ]; then
    fail "resume: final tensor bytes differ from the uninterrupted run's"
  elif [ "$("$DIGEST" res)" != "$("$DIGEST" rk2_grads_device)" ]; then
    fail "resume: the loader's digests differ"
  else
    ok "resume: 2 ranks from checkpoint-3 = the uninterrupted 2-rank run (steps 4..6, final tensors)"
  fi
fi

# --- 5. SIGTERM to rank 1 alone stops both ranks at the same step -------------------------
# (the ranks agree on a pending signal every step; rank 0 saves the checkpoint)
mpi "$MOETUNE" train run.yaml --set output_dir=sig --set max_steps=100000 >"$L/sig.out" 2>&1 &
job=$!
for _ in $(seq 1 600); do grep -q '"step":' sig/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
r1=""
for p in $(pgrep -f "output_dir=sig --set max_steps=100000"); do
  [ "$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep '^OMPI_COMM_WORLD_RANK=')" = OMPI_COMM_WORLD_RANK=1 ] && r1=$p
done
if [ -z "$r1" ]; then
  fail "signal: rank 1's process not found"; kill "$job" 2>/dev/null; wait "$job"
else
  kill -TERM "$r1"
  wait "$job"; rc=$?
  n=$(grep -o 'stopped by SIGTERM after step [0-9]*' "$L/sig.out" | grep -o '[0-9]*$')
  if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
    fail "signal: mpirun exit $rc (want the ranks' 143, not success or a hang)"
  elif [ "$(grep -c 'stopped by SIGTERM after step' "$L/sig.out")" != 1 ] || [ -z "$n" ]; then
    fail "signal: want one 'stopped by SIGTERM after step N' line (rank 0's):"; tail -5 "$L/sig.out"
  elif [ ! -f "sig/checkpoint-$n/optimizer.safetensors" ]; then
    fail "signal: rank 0 stopped after step $n but sig/checkpoint-$n is incomplete"
  elif [ "$(steps sig | tail -n1 | grep -o '"step":[0-9]*')" != "\"step\":$n" ]; then
    fail "signal: metrics.jsonl's last step is not $n"
  else
    ok "SIGTERM to rank 1 alone: both ranks stopped after step $n, rank 0 saved checkpoint-$n (exit $rc)"
  fi
fi

# --- 6. refusals that must not hang ----------------------------------------------------------
mpi "$MOETUNE" train run.yaml --set output_dir=bad_k --set gradient_accumulation_steps=3 >"$L/bad_k.out" 2>&1
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
  fail "K=3 over 2 ranks: exit $rc (want a failure, not success or a hang)"
elif ! grep -q "gradient_accumulation_steps (3) must be a multiple of the ranks (2" "$L/bad_k.out"; then
  fail "K=3 over 2 ranks: no message naming gradient_accumulation_steps and the ranks:"; tail -5 "$L/bad_k.out"
elif [ -f bad_k/model.safetensors ] || [ -f bad_k/metrics.jsonl ]; then
  fail "K=3 over 2 ranks: output written"
else
  ok "K=3 over 2 ranks refused naming both (exit $rc)"
fi

sed "s|$W/data/train.jsonl|$W/data/missing.jsonl|" run.yaml > run_missing.yaml
ASAN_OPTIONS="$RANK_ASAN" timeout 120 mpirun -np 1 "$MOETUNE" train run.yaml --set output_dir=bad_r1 \
  : -np 1 "$MOETUNE" train run_missing.yaml --set output_dir=bad_r1 >"$L/bad_r1.out" 2>&1
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
  fail "a failure on rank 1 alone: exit $rc (want a failure, not success or a hang)"
elif ! grep -q "rank 1 of 2: error: .*missing.jsonl" "$L/bad_r1.out"; then
  fail "a failure on rank 1 alone: no message naming rank 1 and the file:"; tail -5 "$L/bad_r1.out"
elif [ -f bad_r1/model.safetensors ]; then
  fail "a failure on rank 1 alone: rank 0 still saved a model"
else
  ok "a failure on rank 1 alone stops both ranks, naming rank 1 and the file (exit $rc)"
fi

mpi "$MOETUNE" train run.yaml --set output_dir=noinit --set base_model="$W/models/absent" >"$L/noinit.out" 2>&1
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q "moetune init" "$L/noinit.out" || [ -e models/absent ]; then
  fail "base_model_init under mpirun: exit $rc, want a refusal naming moetune init and nothing created:"
  tail -3 "$L/noinit.out"
else
  ok "base_model_init under mpirun refused (every rank would create the model), naming moetune init"
fi

mpi "$MOETUNE" profile run.yaml --set output_dir=prof >"$L/prof.out" 2>&1
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q "profile runs in one process" "$L/prof.out" || [ -e prof ]; then
  fail "moetune profile under mpirun: exit $rc, want a refusal and nothing written:"; tail -3 "$L/prof.out"
else
  ok "moetune profile under mpirun refused, nothing written"
fi

if [ "$failures" -gt 0 ]; then echo "$failures failure(s); logs in $L"; exit 1; fi
echo "all passed"

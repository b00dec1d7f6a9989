#!/usr/bin/env bash
# Data parallel across processes started the way torchrun starts them (each
# told RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the ranks meet over TCP at
# rank 0: kernels/cpu/comm_tcp.h), on the real `moetune` binary with a tiny
# Mixtral:
#   1. K = 2 over 2 ranks: every step's loss, ce_loss, aux_loss, grad_norm
#      and tokens, and the final tensor bytes, equal `devices: 2` in one
#      process bit for bit, with gradients on the device and with streamed
#      weights; K = 4 over 2 ranks likewise;
#   2. a rank started before rank 0 waits for it; LOCAL_RANK unset is fine;
#   3. a failure on rank 1 alone (its dataset is missing) ends both ranks,
#      rank 1 naming the file, rank 0 naming rank 1; kill -9 of rank 1 in the
#      middle of a run ends rank 0 too, naming rank 1; neither hangs;
#   4. SIGTERM to rank 1 alone: both stop after the same step, rank 0 saves
#      that step's checkpoint;
#   5. refusals at the rendezvous, each exit 1 with a message naming the
#      variable or rank at fault and nothing written: MASTER_ADDR unset, RANK
#      out of range, rank 0 alone (rank 1 never comes), ranks disagreeing on
#      WORLD_SIZE, two processes claiming RANK=1, a MASTER_PORT in use;
#   6. as torchrun itself starts ranks (TORCHELASTIC_USE_AGENT_STORE=True:
#      MASTER_PORT is the agent's store, so rank 0 publishes its address
#      there), against store_standin (the store's protocol, this repository's
#      stand-in): equal to devices: 2; rank 1 without a rank 0 gives up
#      naming the store.  Where torchrun (on PATH, or TORCHRUN=path) takes
#      the options README gives (test_lib.sh's torchrun_usable), also under
#      `torchrun --standalone --nproc-per-node 2`; elsewhere that part says
#      `SKIPPED: torchrun WHY` and the rest still counts.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$1"; HW="$2"; STANDIN="$3"
[ -x "$MOETUNE" ] && [ -x "$STANDIN" ] || { echo "usage: torchrun_train_test.sh MOETUNE HW.yaml STORE_STANDIN"; exit 2; }
STANDIN="$(cd "$(dirname "$STANDIN")" && pwd)/$(basename "$STANDIN")"
HW="$(cd "$(dirname "$HW")" && pwd)/$(basename "$HW")"
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
T="${TEST_TMPDIR:-$(mktemp -d)}/torchrun"
rm -rf "$T"; mkdir -p "$T/w" "$T/logs"; cd "$T/w" || exit 2
W="$T/w"; L="$T/logs"

write_tiny_mixtral 48
write_ranks_run "$HW" "$MOETUNE" || exit 1
sed "s|$W/data/train.jsonl|$W/data/missing.jsonl|" run.yaml > run_missing.yaml

# a fresh port per launch: a port another test (or this one) just used may
# still be in TIME_WAIT or, worse, in use
PORT=$(random_port)
next_port() { PORT=$((PORT + 1)); }
# rank R [ENV=V ...] -- ARGS: one rank of a 2-rank job on $PORT, in the
# background, its output in $L/$NAME.rR; sets PID_R
NAME=""
rank() {
  local r="$1"; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env WORLD_SIZE=2 RANK="$r" MASTER_ADDR=127.0.0.1 MASTER_PORT="$PORT" MOETUNE_RENDEZVOUS_TIMEOUT_S=60 \
    "${envs[@]}" timeout 120 "$MOETUNE" "$@" >"$L/$NAME.r$r" 2>&1 &
  eval "PID_$r=$!"
}
# job NAME ARGS...: both ranks of `moetune train run.yaml ARGS`; RC0/RC1 their exits
job() {
  NAME="$1"; shift; next_port
  rank 1 -- train run.yaml "$@"
  rank 0 -- train run.yaml "$@"
  wait "$PID_0"; RC0=$?; wait "$PID_1"; RC1=$?
}
train1() { timeout 120 "$MOETUNE" train run.yaml "$@"; }

# --- 1. 2 ranks = devices: 2 ------------------------------------------------------------------
declare -A PLAN=(
  [grads_device]="--set scheduler.grads=device --set scheduler.optimizer=device"
  [stream]="--set scheduler.weights=stream --set scheduler.optimizer=host"
)
for plan in grads_device stream; do
  opts=${PLAN[$plan]}
  # shellcheck disable=SC2086
  train1 --set output_dir=dev2_$plan --set devices=2 $opts >"$L/dev2_$plan.out" 2>&1 \
    || { fail "$plan: devices: 2 failed"; cat "$L/dev2_$plan.out"; continue; }
  # shellcheck disable=SC2086
  job "tr_$plan" --set output_dir=tr_$plan $opts
  if [ "$RC0" != 0 ] || [ "$RC1" != 0 ]; then
    fail "$plan: the ranks exited $RC0 and $RC1"; tail -3 "$L/tr_$plan.r0" "$L/tr_$plan.r1"; continue
  fi
  grep -q "data parallel across 2 ranks (a torchrun-style launch), 1 micro-batches each" "$L/tr_$plan.r0" \
    || fail "$plan: rank 0 did not report 2 ranks"
  same_run "k2_$plan" dev2_$plan tr_$plan \
    && ok "$plan: K=2, 2 ranks over TCP = devices: 2 (6 steps' losses, grad norms, tokens; final tensors)"
done
train1 --set output_dir=dev2_k4 --set devices=2 --set gradient_accumulation_steps=4 >"$L/dev2_k4.out" 2>&1 \
  || fail "K=4: devices: 2 failed"
job tr_k4 --set output_dir=tr_k4 --set gradient_accumulation_steps=4
[ "$RC0" = 0 ] && [ "$RC1" = 0 ] || fail "K=4: the ranks exited $RC0 and $RC1"
same_run k4 dev2_k4 tr_k4 && ok "K=4: 2 ranks over TCP = devices: 2"

# --- 2. rank 1 first, then rank 0 after a pause, no LOCAL_RANK ---------------------------------
NAME=late; next_port
rank 1 -- train run.yaml --set output_dir=late
sleep 2
rank 0 -- train run.yaml --set output_dir=late
wait "$PID_0"; RC0=$?; wait "$PID_1"; RC1=$?
if [ "$RC0" != 0 ] || [ "$RC1" != 0 ]; then
  fail "rank 0 starting 2 s after rank 1: exits $RC0 and $RC1"; tail -3 "$L/late.r0" "$L/late.r1"
else
  same_run late dev2_grads_device late && ok "rank 1 waited for a rank 0 started 2 s later; same run"
fi

# --- 3. a rank that fails or dies ends the job ----------------------------------------------
NAME=bad_r1; next_port
rank 1 -- train run_missing.yaml --set output_dir=bad_r1
rank 0 -- train run.yaml --set output_dir=bad_r1
wait "$PID_0"; RC0=$?; wait "$PID_1"; RC1=$?
if [ "$RC0" = 0 ] || [ "$RC0" = 124 ] || [ "$RC1" = 0 ] || [ "$RC1" = 124 ]; then
  fail "a failure on rank 1 alone: exits $RC0 and $RC1 (want failures, not success or a hang)"
elif ! grep -q "rank 1 of 2: error: .*missing.jsonl" "$L/bad_r1.r1"; then
  fail "a failure on rank 1 alone: rank 1 did not name itself and the file:"; tail -3 "$L/bad_r1.r1"
elif ! grep -q "rank 0 of 2: error: lost the connection to rank 1" "$L/bad_r1.r0"; then
  fail "a failure on rank 1 alone: rank 0 did not name rank 1:"; tail -3 "$L/bad_r1.r0"
elif [ -f bad_r1/model.safetensors ]; then
  fail "a failure on rank 1 alone: rank 0 still saved a model"
else
  ok "a failure on rank 1 alone ends both ranks (exits $RC0, $RC1): rank 1 names the file, rank 0 names rank 1"
fi

NAME=kill9; next_port
rank 1 -- train run.yaml --set output_dir=kill9 --set max_steps=100000
rank 0 -- train run.yaml --set output_dir=kill9 --set max_steps=100000
for _ in $(seq 1 600); do grep -q '"step":' kill9/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
# timeout(1) runs the rank as its child: kill the rank itself
kill -9 "$(pgrep -P "$PID_1" | head -n1)" 2>/dev/null
wait "$PID_0"; RC0=$?; wait "$PID_1"
if [ "$RC0" = 0 ] || [ "$RC0" = 124 ]; then
  fail "kill -9 of rank 1: rank 0 exited $RC0 (want a failure, not success or a hang)"
elif ! grep -q "lost the connection to rank 1" "$L/kill9.r0"; then
  fail "kill -9 of rank 1: rank 0 did not name rank 1:"; tail -3 "$L/kill9.r0"
else
  ok "kill -9 of rank 1 mid-run ends rank 0 too (exit $RC0), naming rank 1"
fi

# --- 4. SIGTERM to rank 1 alone ------------------------------------------------------------
NAME=sig; next_port
rank 1 -- train run.yaml --set output_dir=sig --set max_steps=100000
rank 0 -- train run.yaml --set output_dir=sig --set max_steps=100000
for _ in $(seq 1 600); do grep -q '"step":' sig/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
kill -TERM "$(pgrep -P "$PID_1" | head -n1)" 2>/dev/null
wait "$PID_0"; RC0=$?; wait "$PID_1"; RC1=$?
n=$(grep -o 'stopped by SIGTERM after step [0-9]*' "$L/sig.r0" | grep -o '[0-9]*$')
if [ "$RC0" != 143 ] || [ "$RC1" != 143 ]; then
  fail "signal: the ranks exited $RC0 and $RC1 (want 143 from both)"; tail -3 "$L/sig.r0" "$L/sig.r1"
elif [ -z "$n" ] || [ ! -f "sig/checkpoint-$n/optimizer.safetensors" ]; then
  fail "signal: rank 0 did not report and save the step it stopped after:"; tail -3 "$L/sig.r0"
elif [ "$(steps sig | tail -n1 | grep -o '"step":[0-9]*')" != "\"step\":$n" ]; then
  fail "signal: metrics.jsonl's last step is not $n"
else
  ok "SIGTERM to rank 1 alone: both ranks stopped after step $n (exit 143), rank 0 saved checkpoint-$n"
fi

# --- 5. refusals at the rendezvous ---------------------------------------------------------
# refused NAME PATTERN FILE...: some file matches PATTERN, and NAME wrote no output_dir
refused() {
  local name="$1" pattern="$2"; shift 2
  if ! cat "$@" | grep -q -- "$pattern"; then
    fail "$name: no message matching '$pattern':"; tail -n 2 "$@"; return 1
  fi
  if [ -e "$name" ]; then fail "$name: output_dir $name was created"; return 1; fi
  return 0
}

env WORLD_SIZE=2 RANK=0 timeout 60 "$MOETUNE" train run.yaml --set output_dir=no_addr >"$L/no_addr.out" 2>&1
rc=$?
[ "$rc" = 1 ] && refused no_addr "MASTER_ADDR is not set" "$L/no_addr.out" \
  && ok "WORLD_SIZE=2 without MASTER_ADDR refused naming it" || { [ "$rc" = 1 ] || fail "no_addr: exit $rc"; }

env WORLD_SIZE=2 RANK=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 timeout 60 "$MOETUNE" train run.yaml \
  --set output_dir=bad_rank >"$L/bad_rank.out" 2>&1
rc=$?
[ "$rc" = 1 ] && refused bad_rank "RANK=2: expected an integer from 0 to 1" "$L/bad_rank.out" \
  && ok "RANK=2 of WORLD_SIZE=2 refused naming RANK" || { [ "$rc" = 1 ] || fail "bad_rank: exit $rc"; }

NAME=alone; next_port
rank 0 MOETUNE_RENDEZVOUS_TIMEOUT_S=2 -- train run.yaml --set output_dir=alone
wait "$PID_0"; RC0=$?
[ "$RC0" = 1 ] && refused alone "1 of 2 ranks joined within 2 s; missing: rank 1" "$L/alone.r0" \
  && ok "rank 0 alone gives up after MOETUNE_RENDEZVOUS_TIMEOUT_S, naming the missing rank" \
  || { [ "$RC0" = 1 ] || fail "alone: exit $RC0"; }

NAME=world; next_port
rank 1 WORLD_SIZE=3 -- train run.yaml --set output_dir=world
rank 0 -- train run.yaml --set output_dir=world
wait "$PID_0"; RC0=$?; wait "$PID_1"; RC1=$?
[ "$RC0" = 1 ] && [ "$RC1" = 1 ] && refused world "rank 1 has WORLD_SIZE=3, rank 0 has WORLD_SIZE=2" "$L/world.r0" \
  && refused world "refused by rank 0: rank 1 has WORLD_SIZE=3" "$L/world.r1" \
  && ok "ranks disagreeing on WORLD_SIZE: both refused, naming it" \
  || { [ "$RC0" = 1 ] && [ "$RC1" = 1 ] || fail "world: exits $RC0 and $RC1"; }

NAME=dup; next_port
rank 1 WORLD_SIZE=3 -- train run.yaml --set output_dir=dup
PID_a=$PID_1
rank 1 WORLD_SIZE=3 -- train run.yaml --set output_dir=dup
PID_b=$PID_1
sleep 1
rank 0 WORLD_SIZE=3 -- train run.yaml --set output_dir=dup
wait "$PID_0"; RC0=$?; wait "$PID_a"; RCa=$?; wait "$PID_b"; RCb=$?
if [ "$RC0" != 1 ] || [ "$RCa" != 1 ] || [ "$RCb" != 1 ]; then
  fail "two processes with RANK=1: exits $RC0, $RCa, $RCb (want 1 from all three)"
else
  refused dup "two processes claim RANK=1" "$L/dup.r0" && ok "two processes claiming RANK=1: every process refused"
fi

NAME=busy; next_port
rank 0 MOETUNE_RENDEZVOUS_TIMEOUT_S=20 -- train run.yaml --set output_dir=busy_a
PID_a=$PID_0
sleep 1.5 # rank 0 listens before it reads the model
NAME=busy2
rank 0 -- train run.yaml --set output_dir=busy
wait "$PID_0"; RC0=$?
kill "$(pgrep -P "$PID_a" | head -n1)" 2>/dev/null; wait "$PID_a"
[ "$RC0" = 1 ] && refused busy "cannot listen on MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT: Address already in use" \
  "$L/busy2.r0" && ok "a second job's rank 0 on a MASTER_PORT in use refused naming the port" \
  || { [ "$RC0" = 1 ] || fail "busy: exit $RC0"; }

# --- 6. under torchrun's agent store ------------------------------------------------------
NAME=store; next_port
"$STANDIN" "$PORT" >"$L/standin.out" 2>&1 &
standin=$!
sleep 0.3
AGENT=(TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RUN_ID=standin-run TORCHELASTIC_RESTART_COUNT=0)
rank 1 "${AGENT[@]}" -- train run.yaml --set output_dir=store
rank 0 "${AGENT[@]}" -- train run.yaml --set output_dir=store
wait "$PID_0"; RC0=$?; wait "$PID_1"; RC1=$?
if [ "$RC0" != 0 ] || [ "$RC1" != 0 ]; then
  fail "agent store: the ranks exited $RC0 and $RC1"; tail -3 "$L/store.r0" "$L/store.r1"
else
  same_run store dev2_grads_device store \
    && ok "ranks meeting through the agent's store (rank 0 published its address) = devices: 2"
fi
NAME=store_alone
rank 1 "${AGENT[@]}" TORCHELASTIC_RUN_ID=no-rank-0 MOETUNE_RENDEZVOUS_TIMEOUT_S=2 -- train run.yaml \
  --set output_dir=store_alone
wait "$PID_1"; RC1=$?
[ "$RC1" = 1 ] && refused store_alone "rank 0 did not publish its address in torchrun's store" "$L/store_alone.r1" \
  && ok "rank 1 without a rank 0 gives up after MOETUNE_RENDEZVOUS_TIMEOUT_S, naming the store" \
  || { [ "$RC1" = 1 ] || fail "store_alone: exit $RC1"; }
kill "$standin" 2>/dev/null; wait "$standin" 2>/dev/null

if torchrun_usable "the run under torchrun itself (the agent store above was the stand-in's)"; then
  timeout 300 "$TORCHRUN" --standalone --nproc-per-node 2 --no-python "$MOETUNE" train run.yaml \
    --set output_dir=torchrun >"$L/torchrun.out" 2>&1
  rc=$?
  if [ "$rc" != 0 ]; then
    fail "torchrun --standalone --nproc-per-node 2: exit $rc"; grep moetune "$L/torchrun.out" | tail -3
  else
    same_run torchrun dev2_grads_device torchrun && ok "under $TORCHRUN itself: equal to devices: 2"
  fi
fi

if [ "$failures" -gt 0 ]; then echo "$failures failure(s); logs in $L"; exit 1; fi
echo "all passed"

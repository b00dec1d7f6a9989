#!/usr/bin/env bash
# A stopped run resumes exactly, checked on the real `moetune` binary with a
# tiny Mixtral (gradient accumulation 2, shuffle, warmup + cosine):
#   1. stopped after k steps with a checkpoint, then resumed from it: the
#      per-step losses in metrics.jsonl and the final model's tensor bytes
#      equal an uninterrupted run's, bit for bit, under the host-optimizer
#      plan, the device-optimizer plan, bf16 with a bf16 save (fp32 masters
#      in optimizer.safetensors), streamed weights, and two devices data and
#      expert parallel;
#   2. the same after SIGTERM to a running `moetune train` (exit 143, a
#      checkpoint named in the output, resume_from_checkpoint: true), under
#      both optimizer plans; SIGINT exits 130; a second signal exits at once
#      and what is left still resumes exactly;
#   3. kill -9 at every write and switch point of the saves
#      (MOETUNE_TEST_CRASH_AT) and at random moments: every complete
#      checkpoint then resumes to the uninterrupted run's result, and an
#      incomplete checkpoint-N is skipped with a warning naming it;
#   4. refusals: another base model (the message names base_model), true
#      with no checkpoint (names resume_from_checkpoint), a directory that
#      is no checkpoint; save_total_limit keeps the newest complete ones;
#   5. skip_nonfinite_steps: an aux-loss coefficient of 1e308 makes every
#      step's loss infinite; up to N are skipped and counted, then the run
#      stops naming the step and the last good checkpoint.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$1"; DIGEST="$2"; HW="$3"
for b in "$MOETUNE" "$DIGEST"; do [ -x "$b" ] || { echo "usage: resume_test.sh MOETUNE CKPT_DIGEST HW.yaml"; exit 2; }; done
HW="$(cd "$(dirname "$HW")" && pwd)/$(basename "$HW")"
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
DIGEST="$(cd "$(dirname "$DIGEST")" && pwd)/$(basename "$DIGEST")"
T="${TEST_TMPDIR:-$(mktemp -d)}/resume"
rm -rf "$T"; mkdir -p "$T/w" "$T/logs"; cd "$T/w" || exit 2
L="$T/logs"

write_tiny_mixtral 40
sed 's/"hidden_size": 32/"hidden_size": 48/' tiny.json > other.json
cp "$HW" hw.yaml || exit 2
# 40 rows of 3 per micro-batch, 2 micro-batches a step: epochs end mid-step, so
# the saved data position is an arbitrary (epoch, cursor)
cat > run.yaml <<'YAML'
base_model: models/ckpt
base_model_init: tiny.json
datasets:
  - path: data/train.jsonl
sequence_len: 16
micro_batch_size: 3
gradient_accumulation_steps: 2
max_steps: 16
learning_rate: 1.0e-3
lr_scheduler: cosine
warmup_steps: 3
weight_decay: 0.01
shuffle: true
seed: 11
output_dir: out
backend: cpu
logging_steps: 1
progress: false
hardware: hw.yaml
YAML
if ! "$MOETUNE" init run.yaml >"$L/init.out" 2>"$L/init.err"; then
  echo "FAIL setup: moetune init"; cat "$L/init.err"; exit 1
fi
"$MOETUNE" init run.yaml --set base_model=models/other --set base_model_init=other.json >/dev/null 2>&1

# same NAME REFERENCE_DIR RESUMED_DIR: the resumed run's losses are the
# reference's last ones and its final tensors are the reference's bytes
same() {
  local name="$1" ref="$2" res="$3"
  losses "$ref" > "$L/$name.ref"
  # the steps the resumed output_dir logged after its last run_start header
  awk '/"run_start"/{n=NR} {l[NR]=$0} END{for(i=n+1;i<=NR;i++) print l[i]}' "$res/metrics.jsonl" \
    | grep -o '"step":[0-9]*,"loss":[-0-9.e]*' > "$L/$name.res"
  if [ ! -s "$L/$name.res" ]; then fail "$name: the resumed run logged no step"; return 1; fi
  if [ "$(grep -cvxFf "$L/$name.ref" "$L/$name.res")" != 0 ]; then
    fail "$name: per-step losses differ from the uninterrupted run's:"; grep -vxFf "$L/$name.ref" "$L/$name.res" | head -3
    return 1
  fi
  if [ "$(tail -n1 "$L/$name.res")" != "$(tail -n1 "$L/$name.ref")" ]; then
    fail "$name: the resumed run did not reach the last step"; return 1
  fi
  if [ "$(tensor_bytes "$ref")" != "$(tensor_bytes "$res")" ]; then
    fail "$name: final model.safetensors tensor bytes differ"; return 1
  fi
  # and the loader takes both as the same weights (it checks the manifest)
  if [ "$("$DIGEST" "$ref")" != "$("$DIGEST" "$res")" ]; then
    fail "$name: the loader's digests differ"; return 1
  fi
  return 0
}

# --- 1. stopped with a checkpoint, resumed from it, per plan ------------------------------
declare -A PLAN=(
  [host]="--set scheduler.optimizer=host"
  [device]="--set scheduler.optimizer=device"
  [bf16_save]="--set scheduler.optimizer=device --set bf16=true --set save_dtype=bfloat16"
  [stream]="--set scheduler.weights=stream --set scheduler.optimizer=host --set bf16=true"
  [two_devices]="--set devices=2 --set scheduler.weights=resident --set scheduler.optimizer=host"
  [expert_parallel]="--set devices=2 --set parallel=expert"
)
for plan in host device bf16_save stream two_devices expert_parallel; do
  opts=${PLAN[$plan]}
  # shellcheck disable=SC2086
  timeout 60 "$MOETUNE" train run.yaml --set output_dir=ref_$plan $opts >"$L/ref_$plan.out" 2>&1 \
    || { fail "$plan: the uninterrupted run failed"; cat "$L/ref_$plan.out"; continue; }
  # shellcheck disable=SC2086
  timeout 60 "$MOETUNE" train run.yaml --set output_dir=stop_$plan $opts --set max_steps=16 --set save_steps=7 \
    --set save_final=false >"$L/stop_$plan.out" 2>&1 || { fail "$plan: the run with checkpoints failed"; continue; }
  if [ ! -f stop_$plan/checkpoint-7/optimizer.safetensors ] || [ ! -f stop_$plan/checkpoint-7/trainer_state.json ]; then
    fail "$plan: checkpoint-7 lacks optimizer.safetensors or trainer_state.json"; continue
  fi
  # shellcheck disable=SC2086
  timeout 60 "$MOETUNE" train run.yaml --set output_dir=res_$plan $opts \
    --set resume_from_checkpoint=stop_$plan/checkpoint-7 >"$L/res_$plan.out" 2>&1 \
    || { fail "$plan: the resumed run failed"; cat "$L/res_$plan.out"; continue; }
  grep -q "resuming from stop_$plan/checkpoint-7 at step 7 of 16" "$L/res_$plan.out" \
    || fail "$plan: no 'resuming from ... at step 7' line"
  grep -q "trained 9 steps (steps 8 to 16, resumed)" "$L/res_$plan.out" \
    || fail "$plan: the final line does not count this run's steps"
  same "stop_$plan" ref_$plan res_$plan && ok "$plan: resumed at step 7 = uninterrupted (losses, final tensor bytes)"
done
# a checkpoint written under one plan resumes under another: the state is plan-free
timeout 60 "$MOETUNE" train run.yaml --set output_dir=cross --set scheduler.optimizer=host \
  --set resume_from_checkpoint=stop_device/checkpoint-7 >"$L/cross.out" 2>&1 \
  && same cross ref_host cross && ok "device-plan checkpoint resumed under the host plan = uninterrupted"

# --- 2. SIGTERM / SIGINT to a running train ---------------------------------------------------
long="--set max_steps=400 --set logging_steps=1"
for plan in host device; do
  # shellcheck disable=SC2086
  timeout 120 "$MOETUNE" train run.yaml --set output_dir=ref_long_$plan $long ${PLAN[$plan]} >"$L/ref_long_$plan.out" 2>&1 \
    || fail "long reference run ($plan)"
done
for c in TERM:host TERM:device INT:host; do
  sig=${c%%:*} plan=${c##*:} name=sig_${c%%:*}_${c##*:}
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  rm -rf $name
  # shellcheck disable=SC2086
  "$MOETUNE" train run.yaml --set output_dir=$name $long ${PLAN[$plan]} >"$L/$name.out" 2>"$L/$name.err" &
  pid=$!
  # wait until it is training, then a moment more
  for _ in $(seq 1 200); do grep -q '"step":3,' $name/metrics.jsonl 2>/dev/null && break; sleep 0.02; done
  sleep 0.$((RANDOM % 3))
  kill -$sig $pid; wait $pid; rc=$?
  if [ $rc -ne $want ]; then fail "SIG$sig ($plan): exit $rc, expected $want"; cat "$L/$name.err"; continue; fi
  grep -q "stopped by SIG$sig after step [0-9]*: checkpoint saved in $name/checkpoint-" "$L/$name.out" \
    || { fail "SIG$sig ($plan): the output does not say where the checkpoint is"; cat "$L/$name.out"; continue; }
  # shellcheck disable=SC2086
  timeout 120 "$MOETUNE" train run.yaml --set output_dir=$name $long ${PLAN[$plan]} --set resume_from_checkpoint=true \
    >"$L/$name.res" 2>&1 || { fail "SIG$sig ($plan): resume failed"; tail -3 "$L/$name.res"; continue; }
  same $name ref_long_$plan $name && ok "SIG$sig ($plan optimizer): exit $want, checkpoint, resumed = uninterrupted"
done
# a second signal exits at once; what is on disk then resumes exactly (or,
# stopped before its first save, holds no complete checkpoint to resume)
rm -rf sig2
# shellcheck disable=SC2086
"$MOETUNE" train run.yaml --set output_dir=sig2 $long ${PLAN[host]} --set save_steps=1 >"$L/sig2.out" 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q '"step":3,' sig2/metrics.jsonl 2>/dev/null && break; sleep 0.02; done
kill -TERM $pid; kill -TERM $pid; wait $pid; rc=$?
if [ $rc -ne 143 ]; then fail "two SIGTERMs: exit $rc, expected 143"
else
  # shellcheck disable=SC2086
  timeout 120 "$MOETUNE" train run.yaml --set output_dir=sig2 $long ${PLAN[host]} --set resume_from_checkpoint=true \
    >"$L/sig2.res" 2>&1; rc=$?
  if [ $rc -eq 0 ] && same sig2 ref_long_host sig2; then ok "two SIGTERMs: exit 143 at once; resumed = uninterrupted"
  elif [ $rc -eq 1 ] && grep -q "holds no complete checkpoint-N" "$L/sig2.res"; then ok "two SIGTERMs: exit 143 before any save"
  else fail "two SIGTERMs: the resume exited $rc"; tail -3 "$L/sig2.res"; fi
fi

# --- 3. kill -9 during saves ------------------------------------------------------------------
# resume_all DIR NAME: every complete checkpoint-N of DIR resumes to ref_host's
# result; RESUMED counts them
resume_all() {
  local dir="$1" name="$2" c
  RESUMED=0
  for c in "$dir"/checkpoint-*; do
    [ -f "$c/moetune_complete.json" ] || continue
    rm -rf "r_$name"
    if ! timeout 60 "$MOETUNE" train run.yaml --set output_dir="r_$name" --set scheduler.optimizer=host \
        --set resume_from_checkpoint="$c" >"$L/r_$name.out" 2>&1; then
      # a manifest that does not match its files is refused by name; anything else fails
      grep -q "cannot be resumed from" "$L/r_$name.out" && continue
      fail "$name: resuming from $c failed"; tail -2 "$L/r_$name.out"; return
    fi
    same "$name" ref_host "r_$name" || return
    RESUMED=$((RESUMED + 1))
  done
}
crash_ok=0
# (the shell's "Killed" notices are expected here)
exec 3>&2 2>/dev/null
for at in $(seq 1 14); do
  rm -rf crash
  MOETUNE_TEST_CRASH_AT=$at timeout 60 "$MOETUNE" train run.yaml --set output_dir=crash --set scheduler.optimizer=host \
    --set save_steps=3 --set save_total_limit=2 >"$L/crash_$at.out" 2>&1
  resume_all crash "crash_$at"
  crash_ok=$((crash_ok + RESUMED))
done
exec 2>&3 3>&-
if [ "$crash_ok" -gt 0 ]; then ok "SIGKILL at each of 14 save points: $crash_ok complete checkpoints, all resume exactly"
else fail "SIGKILL at save points: no complete checkpoint was left to resume"; fi
rm -rf rand
for i in $(seq 1 8); do
  resume=false
  ls rand 2>/dev/null | grep -q '^checkpoint-' && resume=true
  "$MOETUNE" train run.yaml --set output_dir=rand --set scheduler.optimizer=host --set save_steps=1 \
    --set save_total_limit=3 --set resume_from_checkpoint=$resume >"$L/rand_$i.out" 2>&1 &
  pid=$!
  sleep 0.$((RANDOM % 10))$((RANDOM % 10))
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
done
resume_all rand rand
ok "SIGKILL at 8 random moments of a run saving every step: $RESUMED complete checkpoints, all resume exactly"
# an incomplete checkpoint-N is skipped, named in a warning
cp -r stop_host/checkpoint-7 stop_host/checkpoint-99 && rm stop_host/checkpoint-99/moetune_complete.json
timeout 60 "$MOETUNE" train run.yaml --set output_dir=stop_host --set scheduler.optimizer=host \
  --set resume_from_checkpoint=true >"$L/incomplete.out" 2>&1
if grep -q "skipping incomplete checkpoint stop_host/checkpoint-99" "$L/incomplete.out" \
   && grep -q "resuming from stop_host/checkpoint-14 at step 14" "$L/incomplete.out"; then
  ok "an incomplete checkpoint-99 is skipped with a warning; the latest complete one (14) resumed"
else fail "incomplete checkpoint: no warning or wrong checkpoint"; tail -5 "$L/incomplete.out"; fi

# --- 4. refusals and save_total_limit ------------------------------------------------------------
timeout 60 "$MOETUNE" train run.yaml --set output_dir=mis --set base_model=models/other \
  --set resume_from_checkpoint=stop_host/checkpoint-7 >"$L/mis.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "base_model 'models/other' does not match the checkpoint" "$L/mis.out"; then
  ok "another base model: refused naming base_model"
else fail "another base model: exit $rc"; cat "$L/mis.out"; fi
timeout 60 "$MOETUNE" train run.yaml --set output_dir=empty --set resume_from_checkpoint=true >"$L/none.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "resume_from_checkpoint: true, but output_dir 'empty' holds no complete checkpoint-N" "$L/none.out"; then
  ok "resume_from_checkpoint: true without a checkpoint: refused"
else fail "no checkpoint: exit $rc"; cat "$L/none.out"; fi
timeout 60 "$MOETUNE" train run.yaml --set output_dir=notckpt --set resume_from_checkpoint=models/ckpt >"$L/notckpt.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "resume_from_checkpoint 'models/ckpt' cannot be resumed from" "$L/notckpt.out"; then
  ok "a plain model directory as resume_from_checkpoint: refused"
else fail "plain model dir: exit $rc"; cat "$L/notckpt.out"; fi
timeout 60 "$MOETUNE" train run.yaml --set output_dir=lim --set save_steps=2 --set save_total_limit=2 >"$L/lim.out" 2>&1
kept=$(cd lim && ls -d checkpoint-* | tr '\n' ' ')
if [ "$kept" = "checkpoint-12 checkpoint-14 " ]; then ok "save_total_limit: 2 keeps $kept"
else fail "save_total_limit: 2 kept '$kept'"; fi

# --- disk full / file too large: a clear error, the previous checkpoint intact ---------------------
# RLIMIT_FSIZE with SIGXFSZ ignored makes writes past 150 KiB fail with EFBIG,
# as a full disk fails them: the weights (about 190 KB) cannot be written,
# metrics.jsonl and the small files can.
rm -rf full_disk; cp -r stop_host full_disk; rm -rf full_disk/checkpoint-99
before=$("$DIGEST" full_disk/checkpoint-7)
( trap '' XFSZ; ulimit -f 150; exec timeout 60 "$MOETUNE" train run.yaml --set output_dir=full_disk --set save_steps=1 \
    --set resume_from_checkpoint=full_disk/checkpoint-7 ) >"$L/full.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "saving checkpoint-8 (the last complete checkpoint, intact, is full_disk/checkpoint-7)" "$L/full.out" \
   && grep -q "full_disk/.checkpoint-8.*File too large" "$L/full.out" && [ "$("$DIGEST" full_disk/checkpoint-7)" = "$before" ] \
   && [ ! -e full_disk/checkpoint-8 ] && [ -z "$(ls -A full_disk | grep moetune-tmp)" ]; then
  ok "a save that cannot be written: exit 1 naming the file and the intact checkpoint-7, nothing half-written left"
else fail "unwritable save: exit $rc"; grep -v '^{' "$L/full.out" | tail -3; ls -A full_disk; fi
# a real full disk where this test may mount a small tmpfs (root, outside a sandbox that forbids it)
mkdir -p tfs
if mount -t tmpfs -o size=1m tmpfs tfs 2>/dev/null; then
  timeout 60 "$MOETUNE" train run.yaml --set output_dir=tfs/o --set save_steps=5 >"$L/tmpfs.out" 2>&1; rc=$?
  if [ $rc -eq 1 ] && grep -q "saving checkpoint-10 (the last complete checkpoint, intact, is tfs/o/checkpoint-5)" "$L/tmpfs.out" \
     && grep -q "No space left on device" "$L/tmpfs.out" && "$DIGEST" tfs/o/checkpoint-5 >/dev/null; then
    ok "a full tmpfs: exit 1, No space left on device, checkpoint-5 intact and loadable"
  else fail "full tmpfs: exit $rc"; grep -v '^{' "$L/tmpfs.out" | tail -3; fi
  umount tfs
else
  echo "skip a full tmpfs (cannot mount one here)"
fi

# --- 5. skip_nonfinite_steps ------------------------------------------------------------------------
timeout 60 "$MOETUNE" train run.yaml --set output_dir=nan --set model_config.router_aux_loss_coef=1e308 --set save_steps=1 \
  --set skip_nonfinite_steps=2 >"$L/nan.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && [ "$(grep -c 'skipped (. of skip_nonfinite_steps: 2)' "$L/nan.out")" = 2 ] \
   && grep -q "step 3: loss is" "$L/nan.out" && grep -q "the last good checkpoint is nan/checkpoint-2" "$L/nan.out"; then
  ok "skip_nonfinite_steps: 2 skips two steps, stops at step 3 naming nan/checkpoint-2"
else fail "skip_nonfinite_steps: exit $rc"; grep -v '^{' "$L/nan.out" | tail -5; fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

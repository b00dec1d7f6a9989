#!/usr/bin/env bash
# The speculative host optimizer (scheduler.speculative_optimizer): with
# clipping on, host AdamW runs during the backward as if the clipping
# factor were 1 and is undone and redone when the norm clips.  Its result
# must be the non-speculative step's bit for bit: per-step losses and the
# weights and AdamW state of a checkpoint at step 15 and the model saved
# after 30 steps (ckpt_digest) of the
# quick start's model, with a host optimizer over streamed blocks and over
# resident ones (whose device copies are refreshed from the masters), for
# a max_grad_norm that never clips (every speculation kept), one that
# always clips (every one redone) and one in between (both), and with bf16
# and 8-bit moments (optimizer_state), and on two (pretend) NUMA nodes.  Then a step
# whose gradient is not finite: the speculative updates are undone before
# the step is skipped (skip_nonfinite_steps), so the checkpoint after two
# skipped steps equals the non-speculative run's.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
DIGEST="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
T="${TEST_TMPDIR:-$(mktemp -d)}/speculative"
rm -rf "$T"; mkdir -p "$T"
cp -r configs "$T/configs"
cd "$T" || exit 2

train() { # NAME ARGS...: 30 steps, a checkpoint (weights and AdamW state) at 15, the model at the end
  local name=$1; shift
  "$MOETUNE" train configs/quickstart.yaml --set max_steps=30 --set logging_steps=1 --set save_steps=15 \
    --set scheduler.optimizer=host --set scheduler.grads=host --set "output_dir=$T/$name" "$@" \
    > "$T/$name.log" 2>&1 || { fail "$name: moetune train failed"; tail -n 5 "$T/$name.log"; return 1; }
}
count() { grep -c "\"optimizer_speculation\":\"$2\"" "$T/$1/metrics.jsonl"; }

for weights in stream resident; do
  for clip in 100 1.6 0.5; do
    a="$weights-$clip-off"; b="$weights-$clip-on"
    train "$a" --set scheduler.weights=$weights --set max_grad_norm=$clip || continue
    train "$b" --set scheduler.weights=$weights --set max_grad_norm=$clip \
      --set scheduler.speculative_optimizer=true || continue
    kept=$(count "$b" kept); redone=$(count "$b" redone)
    case $clip in
      100) want_ok=$([ "$kept" = 30 ] && [ "$redone" = 0 ] && echo y) ;;
      0.5) want_ok=$([ "$kept" = 0 ] && [ "$redone" = 30 ] && echo y) ;;
      *) want_ok=$([ "$kept" -gt 0 ] && [ "$redone" -gt 0 ] && [ $((kept + redone)) = 30 ] && echo y) ;;
    esac
    if [ "$want_ok" != y ]; then fail "$b: $kept steps kept, $redone redone"; continue; fi
    if [ "$(losses "$T/$a")" != "$(losses "$T/$b")" ]; then fail "$b: losses differ from $a"; continue; fi
    da=$("$DIGEST" "$T/$a/checkpoint-15"; "$DIGEST" "$T/$a"); db=$("$DIGEST" "$T/$b/checkpoint-15"; "$DIGEST" "$T/$b")
    if [ -n "$da" ] && [ "$da" = "$db" ]; then
      ok "$weights blocks, max_grad_norm $clip: $kept speculative steps kept, $redone redone; losses, weights and AdamW state identical"
    else fail "$b: checkpoint-15 or the saved model differs from $a's"; fi
  done
done

# lighter moments: the copies hold them in their own format
for fmt in bf16 8bit; do
  a="moments-$fmt-off"; b="moments-$fmt-on"
  train "$a" --set scheduler.weights=stream --set max_grad_norm=1.6 --set optimizer_state=$fmt || continue
  train "$b" --set scheduler.weights=stream --set max_grad_norm=1.6 --set optimizer_state=$fmt \
    --set scheduler.speculative_optimizer=true || continue
  kept=$(count "$b" kept); redone=$(count "$b" redone)
  da=$("$DIGEST" "$T/$a/checkpoint-15"; "$DIGEST" "$T/$a"); db=$("$DIGEST" "$T/$b/checkpoint-15"; "$DIGEST" "$T/$b")
  if [ "$kept" -gt 0 ] && [ "$redone" -gt 0 ] && [ "$(losses "$T/$a")" = "$(losses "$T/$b")" ] && [ -n "$da" ] &&
     [ "$da" = "$db" ]; then
    ok "optimizer_state $fmt, max_grad_norm 1.6: $kept kept, $redone redone; losses, weights and AdamW state identical"
  else fail "optimizer_state $fmt: $kept kept, $redone redone; losses or checkpoints differ"; fi
done

# two NUMA nodes (pretend ones: MOETUNE_NUMA_NODES splits the CPUs): each
# block's host state is shared out between the nodes and updated on both
# at once, in the step, overlapping the backward or deferred: the same
# bits as on one node
numa_case() { # NAME REF ARGS...
  local b=$1 ref=$2; shift 2
  MOETUNE_NUMA_NODES=2 train "$b" --set max_grad_norm=1.6 "$@" || return
  grep -q "host AdamW on 2 NUMA nodes" "$T/$b.log" || { fail "$b: the plan line names no NUMA nodes"; return; }
  local da db
  da=$("$DIGEST" "$T/$ref/checkpoint-15"; "$DIGEST" "$T/$ref"); db=$("$DIGEST" "$T/$b/checkpoint-15"; "$DIGEST" "$T/$b")
  if [ "$(losses "$T/$ref")" = "$(losses "$T/$b")" ] && [ -n "$da" ] && [ "$da" = "$db" ]; then
    ok "two NUMA nodes, $*: losses, weights and AdamW state identical to one node"
  else fail "$b: differs from $ref"; fi
}
numa_case numa-stream-off stream-1.6-off --set scheduler.weights=stream
numa_case numa-stream-on stream-1.6-on --set scheduler.weights=stream --set scheduler.speculative_optimizer=true
numa_case numa-resident-off resident-1.6-off --set scheduler.weights=resident
numa_case numa-8bit-on moments-8bit-on --set scheduler.weights=stream --set optimizer_state=8bit \
  --set scheduler.speculative_optimizer=true

# a non-finite gradient in every step: two skipped, then the run stops
for s in off on; do
  spec=false; [ $s = on ] && spec=true
  "$MOETUNE" train configs/quickstart.yaml --set max_steps=30 --set save_steps=1 --set skip_nonfinite_steps=2 \
    --set model_config.router_aux_loss_coef=1e308 --set scheduler.optimizer=host --set scheduler.grads=host \
    --set scheduler.weights=stream --set scheduler.speculative_optimizer=$spec --set "output_dir=$T/nan-$s" \
    > "$T/nan-$s.log" 2>&1
done
da=$("$DIGEST" "$T/nan-off/checkpoint-2" 2>/dev/null); db=$("$DIGEST" "$T/nan-on/checkpoint-2" 2>/dev/null)
if [ -n "$da" ] && [ "$da" = "$db" ] && grep -q "skip_nonfinite_steps" "$T/nan-on.log"; then
  ok "non-finite gradients: the speculative updates are undone, checkpoint-2 equals the non-speculative run's"
else fail "non-finite gradients: checkpoint-2 differs or missing"; tail -n 3 "$T/nan-on.log"; fi

[ "$failures" -eq 0 ] && echo "speculative_test: all ok"
exit $((failures > 0))

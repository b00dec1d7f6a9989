#!/usr/bin/env bash
# Expert parallelism through `moetune train` on the quick start's model and
# data (8 experts, top-2, 8 x 128 tokens per micro-batch: enough rows per
# expert that the gradient products are cut into blocks, which is where a
# product accumulating into a non-zero gradient would round differently):
#   1. devices: 2 with parallel: expert and 2 micro-batches per step gives
#      the per-step losses and final tensor bytes of one device running
#      both micro-batches, bit for bit, in fp32 and in bf16, under the
#      planner's plan and under min_memory;
#   2. the run says how many MoE layers it splits;
#   3. parallel: auto on two devices plans and trains;
#   4. parallel: expert with a LoRA adapter, or with a forced device
#      optimizer, is refused naming the key; parallel: auto with a forced
#      device optimizer trains every layer data parallel.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$1"; CONFIG="$2"
[ -x "$MOETUNE" ] && [ -f "$CONFIG" ] || { echo "usage: expert_parallel_train_test.sh MOETUNE QUICKSTART.yaml"; exit 2; }
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
CONFIG="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"
T="${TEST_TMPDIR:-$(mktemp -d)}/ep_train"
rm -rf "$T"; mkdir -p "$T"; cd "$T" || exit 2
run() { # NAME ARGS...: a short quick-start run into out_NAME
  local name="$1"; shift
  timeout 300 "$MOETUNE" train "$CONFIG" --set base_model="$T/tiny" --set output_dir="$T/out_$name" \
    --set max_steps=6 --set logging_steps=1 --set warmup_steps=2 --set gradient_accumulation_steps=2 "$@" \
    >"$T/$name.log" 2>&1 || { fail "$name: moetune train failed"; tail -5 "$T/$name.log"; return 1; }
}

for dt in fp32 bf16; do
  bf=false; [ "$dt" = bf16 ] && bf=true
  run "one_$dt" --set bf16=$bf || continue
  for pol in auto min_memory; do
    name="expert_${dt}_$pol"
    run "$name" --set bf16=$bf --set devices=2 --set parallel=expert --set scheduler.policy=$pol || continue
    if ! grep -q "2 MoE layer(s) expert parallel" "$T/$name.log"; then
      fail "$name: the plan line does not say the 2 MoE layers are expert parallel"; grep plan "$T/$name.log"
    fi
    if [ "$(losses "$T/out_one_$dt")" = "$(losses "$T/out_$name")" ] && [ -n "$(losses "$T/out_$name")" ]; then
      ok "$name: per-step losses equal one device's, bit for bit"
    else
      fail "$name: per-step losses differ from one device's"; paste <(losses "$T/out_one_$dt") <(losses "$T/out_$name")
    fi
    if [ "$(tensor_bytes "$T/out_one_$dt")" = "$(tensor_bytes "$T/out_$name")" ]; then
      ok "$name: final weights equal one device's, bit for bit"
    else
      fail "$name: final model.safetensors tensor bytes differ from one device's"
    fi
  done
done

if run auto --set devices=2 --set parallel=auto; then
  [ -n "$(losses "$T/out_auto")" ] && ok "parallel: auto on two devices trains" || fail "auto: no losses logged"
fi

timeout 60 "$MOETUNE" train "$CONFIG" --set base_model="$T/tiny" --set output_dir="$T/out_lora" --set devices=2 \
  --set gradient_accumulation_steps=2 --set parallel=expert --set adapter=lora --set lora_r=4 --set lora_alpha=8 \
  --set 'lora_target_modules=[q_proj]' >"$T/lora.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "parallel: expert" "$T/lora.log" && grep -q "LoRA" "$T/lora.log"; then
  ok "parallel: expert with adapter: lora is refused, naming the key"
else
  fail "parallel: expert with LoRA: exit $rc"; tail -3 "$T/lora.log"
fi

timeout 60 "$MOETUNE" train "$CONFIG" --set base_model="$T/tiny" --set output_dir="$T/out_devopt" --set devices=2 \
  --set gradient_accumulation_steps=2 --set parallel=expert --set scheduler.optimizer=device >"$T/devopt.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "parallel: expert" "$T/devopt.log" && grep -q "scheduler.optimizer: device" "$T/devopt.log"; then
  ok "parallel: expert with scheduler.optimizer: device is refused, naming both keys"
else
  fail "parallel: expert with a device optimizer: exit $rc"; tail -3 "$T/devopt.log"
fi
if run devopt_auto --set devices=2 --set scheduler.optimizer=device; then
  if grep -q "expert parallel" "$T/devopt_auto.log"; then
    fail "parallel: auto with a device optimizer split experts"; grep plan "$T/devopt_auto.log"
  else
    ok "parallel: auto with scheduler.optimizer: device trains data parallel"
  fi
fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

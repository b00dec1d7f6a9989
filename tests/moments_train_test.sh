#!/usr/bin/env bash
# AdamW's moment formats (optimizer_state: fp32, bf16, 8bit) on the real
# `moetune` binary with a tiny Mixtral whose expert matrices (64 x 96) are
# large enough for 8-bit moments (bitsandbytes keeps tensors under 4096
# elements in fp32):
#   1. for bf16 and 8bit, the host-optimizer and device-optimizer plans log
#      the same per-step losses and save the same tensor bytes (one
#      definition of each format on both sides);
#   2. stopped at step 7 with a checkpoint and resumed (under either
#      plan) = the uninterrupted run, losses and final tensors bit for bit;
#      optimizer.safetensors names the format in its metadata; with the
#      NVMe tier (memory.nvme.path) 8-bit moments train bit-identically too;
#   3. a resume with another optimizer_state than the checkpoint's is
#      refused naming both formats; an 8-bit optimizer name with
#      optimizer_state: bf16 is refused naming both keys;
#   4. over 200 steps the mean loss of bf16 and 8bit moments is within 1%
#      of fp32 moments', and no 40-step window's mean is more than 1% above
#      fp32's (the lighter state must not train worse).
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$1"; DIGEST="$2"; HW="$3"
for b in "$MOETUNE" "$DIGEST"; do [ -x "$b" ] || { echo "usage: moments_train_test.sh MOETUNE CKPT_DIGEST HW.yaml"; exit 2; }; done
HW="$(cd "$(dirname "$HW")" && pwd)/$(basename "$HW")"
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
DIGEST="$(cd "$(dirname "$DIGEST")" && pwd)/$(basename "$DIGEST")"
T="${TEST_TMPDIR:-$(mktemp -d)}/moments"
rm -rf "$T"; mkdir -p "$T/w" "$T/logs"; cd "$T/w" || exit 2
L="$T/logs"

write_tiny_mixtral 40
sed -i 's/"hidden_size": 32, "intermediate_size": 48/"hidden_size": 64, "intermediate_size": 96/' tiny.json
grep -q '"intermediate_size": 96' tiny.json || { echo "FAIL setup: tiny.json not widened"; exit 1; }
cp "$HW" hw.yaml || exit 2
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

train() { # OUT_DIR ARGS...: a run; its output in $L/OUT_DIR.out
  local out="$1"; shift
  timeout 300 "$MOETUNE" train run.yaml --set output_dir="$out" "$@" >"$L/$out.out" 2>&1 \
    || { fail "$out: the run failed"; tail -3 "$L/$out.out"; return 1; }
}
same() { # NAME REF RES: RES's losses after its last run_start and final tensors are REF's
  local name="$1" ref="$2" res="$3"
  losses "$ref" > "$L/$name.ref"
  awk '/"run_start"/{n=NR} {l[NR]=$0} END{for(i=n+1;i<=NR;i++) print l[i]}' "$res/metrics.jsonl" \
    | grep -o '"step":[0-9]*,"loss":[-0-9.e]*' > "$L/$name.res"
  [ -s "$L/$name.res" ] || { fail "$name: no step logged"; return 1; }
  grep -qvxFf "$L/$name.ref" "$L/$name.res" && { fail "$name: losses differ:"; grep -vxFf "$L/$name.ref" "$L/$name.res" | head -3; return 1; }
  [ "$(tail -n1 "$L/$name.res")" = "$(tail -n1 "$L/$name.ref")" ] || { fail "$name: did not reach the last step"; return 1; }
  [ "$(tensor_bytes "$ref")" = "$(tensor_bytes "$res")" ] || { fail "$name: final tensor bytes differ"; return 1; }
  [ "$("$DIGEST" "$ref")" = "$("$DIGEST" "$res")" ] || { fail "$name: the loader's digests differ"; return 1; }
  return 0
}
# the metadata of a safetensors file as its JSON header's text
meta() { local n; n=$(od -An -tu8 -N8 "$1" | tr -d ' '); head -c $((8 + n)) "$1" | tail -c "$n" | grep -o '"__metadata__":{[^}]*}'; }

# --- 1. and 2.: plans and resume, per format ------------------------------------------------
train ref_fp32 --set scheduler.optimizer=host
for f in bf16 8bit; do
  train ref_${f}_host --set optimizer_state=$f --set scheduler.optimizer=host || continue
  train ref_${f}_device --set optimizer_state=$f --set scheduler.optimizer=device || continue
  same "plans_$f" ref_${f}_host ref_${f}_device && ok "$f: host and device optimizer plans bit-identical"
  # the format changes the run (else the option did nothing)
  [ "$(tensor_bytes ref_fp32)" != "$(tensor_bytes ref_${f}_host)" ] || fail "$f: same tensors as fp32 moments"
  train stop_$f --set optimizer_state=$f --set scheduler.optimizer=device --set save_steps=7 --set save_final=false || continue
  meta stop_$f/checkpoint-7/optimizer.safetensors | grep -q "\"optimizer_state\":\"$f\"" \
    || fail "$f: optimizer.safetensors metadata does not name optimizer_state $f: $(meta stop_$f/checkpoint-7/optimizer.safetensors)"
  train res_$f --set optimizer_state=$f --set scheduler.optimizer=host --set resume_from_checkpoint=stop_$f/checkpoint-7 \
    && same "resume_$f" ref_${f}_host res_$f && ok "$f: resumed at step 7 (device plan -> host plan) = uninterrupted"
  train res_dev_$f --set optimizer_state=$f --set scheduler.optimizer=device --set resume_from_checkpoint=stop_$f/checkpoint-7 \
    && same "resume_dev_$f" ref_${f}_host res_dev_$f && ok "$f: resumed at step 7 (device plan -> device plan) = uninterrupted"
done
mkdir -p nvd
train nvme_8bit --set optimizer_state=8bit --set scheduler.optimizer=host --set memory.nvme.path=nvd \
  && same nvme_8bit ref_8bit_host nvme_8bit && ok "8bit: moments on the NVMe tier = in host memory"

# --- 3. refusals ---------------------------------------------------------------------------------
if [ -d stop_8bit/checkpoint-7 ]; then
  if timeout 60 "$MOETUNE" train run.yaml --set output_dir=mix --set optimizer_state=bf16 \
      --set resume_from_checkpoint=stop_8bit/checkpoint-7 >"$L/mix.out" 2>&1; then
    fail "a bf16 run resumed from an 8bit checkpoint"
  elif grep -q "holds AdamW moments in 8bit" "$L/mix.out" && grep -q "optimizer_state: bf16" "$L/mix.out"; then
    ok "a resume with another optimizer_state is refused naming both"
  else fail "resume with another optimizer_state: unclear message"; tail -2 "$L/mix.out"; fi
fi
if timeout 60 "$MOETUNE" train run.yaml --set output_dir=bad --set optimizer=adamw_8bit --set optimizer_state=bf16 \
    >"$L/bad.out" 2>&1; then fail "optimizer: adamw_8bit with optimizer_state: bf16 was accepted"
elif grep -q "optimizer: an 8-bit AdamW name" "$L/bad.out" && grep -q "optimizer_state: bf16" "$L/bad.out"; then
  ok "an 8-bit optimizer name with optimizer_state: bf16 is refused naming both keys"
else fail "8-bit name with bf16 state: unclear message"; tail -2 "$L/bad.out"; fi

# --- 4. losses over 200 steps against fp32 moments -----------------------------------------------
long="--set max_steps=200 --set save_final=false"
# shellcheck disable=SC2086
train long_fp32 $long && for f in bf16 8bit; do
  # shellcheck disable=SC2086
  train long_$f $long --set optimizer_state=$f || continue
  res=$(paste -d' ' <(losses long_fp32 | sed 's/.*loss"://') <(losses long_$f | sed 's/.*loss"://') | awk '
    {a += $1; b += $2; w = int((NR - 1) / 40); wa[w] += $1; wb[w] += $2; n++}
    END {
      worst = -1e9; for (i in wa) { d = (wb[i] - wa[i]) / wa[i]; if (d > worst) worst = d }
      printf "%d %.6f %.6f %.5f %.5f\n", n, a / n, b / n, (b - a) / a, worst
    }')
  read -r n ma mb rel worst <<< "$res"
  echo "     $f: $n steps, mean loss $mb vs fp32 $ma (relative $rel), worst 40-step window $worst above fp32"
  [ "$n" = 200 ] || { fail "$f: $n steps compared, not 200"; continue; }
  awk -v r="$rel" -v w="$worst" 'BEGIN{exit !(r < 0.01 && r > -0.01 && w < 0.01)}' \
    && ok "$f: 200-step mean loss within 1% of fp32 moments, no window more than 1% above" \
    || fail "$f: losses not within 1% of fp32 moments (mean $rel, worst window $worst)"
done

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

#!/usr/bin/env bash
# moetune validates its inputs before it works, and is defined on
# non-finite values: each case below must exit 1 (a handled error, never a
# crash, a sanitizer report or a hang) with a message naming the file, key
# or tensor at fault, and must not overwrite a good model.
set -u
MOETUNE="$1"
[ -x "$MOETUNE" ] || { echo "usage: validation_test.sh PATH_TO_MOETUNE"; exit 2; }
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
HW="$(pwd)/configs/hw/h100-sxm.yaml"
[ -f "$HW" ] || HW="$(cd "$(dirname "$0")/.." && pwd)/configs/hw/h100-sxm.yaml"
W="${TEST_TMPDIR:-$(mktemp -d)}/validation"
rm -rf "$W"; mkdir -p "$W"; cd "$W" || exit 2
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# expect_fail NAME PATTERN CMD...: CMD exits with 1 within 60 s, its stderr
# matches PATTERN and carries no sanitizer report.
expect_fail() {
  local name="$1" pattern="$2"; shift 2
  timeout 60 "$@" >"$name.out" 2>"$name.err"; local rc=$?
  if [ "$rc" -ne 1 ]; then fail "$name: exit code $rc, expected 1"; cat "$name.err"; return; fi
  if grep -qE "Sanitizer|runtime error" "$name.err"; then fail "$name: sanitizer report"; cat "$name.err"; return; fi
  if ! grep -qE -- "$pattern" "$name.err"; then
    fail "$name: message does not match /$pattern/:"; cat "$name.err"; return
  fi
  echo "ok   $name: $(head -c 400 "$name.err" | tr '\n' ' ')"
}

# expect_ok NAME CMD...: exits 0 without a sanitizer report.
expect_ok() {
  local name="$1"; shift
  timeout 120 "$@" >"$name.out" 2>"$name.err"; local rc=$?
  if [ "$rc" -ne 0 ] || grep -qE "Sanitizer|runtime error" "$name.err"; then
    fail "$name: exit code $rc"; cat "$name.err"; return
  fi
  echo "ok   $name"
}

cat > tiny.json <<'JSON'
{"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": false, "output_router_logits": true}
JSON
for i in $(seq 1 24); do echo "{\"input_ids\": [$((i % 60)), 5, 9, 13, 17, 21, 25, 29, 33, $((i % 50)), 41, 45]}"; done > data.jsonl
cat > run.yaml <<'YAML'
base_model: ckpt
base_model_init: tiny.json
datasets:
  - path: data.jsonl
sequence_len: 16
micro_batch_size: 4
max_steps: 2
learning_rate: 1.0e-3
output_dir: out
backend: cpu
logging_steps: 1
YAML
expect_ok good_run "$MOETUNE" train run.yaml
[ -f out/model.safetensors ] || fail "good run saved no model"
before=$(md5sum < out/model.safetensors)

# poke FILE TENSOR INDEX VALUE: overwrite one element of a safetensors tensor in place.
poke() {
  python3 - "$@" <<'PY'
import json, struct, sys
path, name, index, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    info = json.loads(f.read(n))[name]
    dt = info["dtype"]
    raw = struct.pack("<f", value)
    if dt == "BF16": raw = raw[2:]
    elif dt != "F32": sys.exit("poke: dtype %s" % dt)
    f.seek(8 + n + info["data_offsets"][0] + index * len(raw))
    f.write(raw)
PY
}

# --- non-finite values in the checkpoint: refused at load, naming file, tensor, index -----
cp -r ckpt nanw
poke nanw/model.safetensors model.layers.1.block_sparse_moe.experts.3.w2.weight 7 nan
expect_fail nan_in_unused_weight \
  "nanw/model\.safetensors: tensor 'model\.layers\.1\.block_sparse_moe\.experts\.3\.w2\.weight' holds a non-finite value \(NaN\) at index \[0, 7\]" \
  "$MOETUNE" train run.yaml --set base_model=nanw --set output_dir=out_nanw
[ ! -e out_nanw/model.safetensors ] || fail "nan_in_unused_weight: a model was saved"
cp -r ckpt infw
poke infw/model.safetensors model.embed_tokens.weight 70 inf
expect_fail inf_in_embedding "infw/model\.safetensors.*model\.embed_tokens\.weight.*\+Inf.*\[2, 6\]" \
  "$MOETUNE" train run.yaml --set base_model=infw --set output_dir=out_infw

# --- config.json against the checkpoint's shapes and names -----------------------------------------
cp -r ckpt shape; sed -i 's/"intermediate_size": 48/"intermediate_size": 40/' shape/config.json
expect_fail config_shape_mismatch \
  "shape/config\.json disagrees with the checkpoint: tensor 'model\.layers\.0\.block_sparse_moe\.experts\.0\.w1\.weight' in shape/model\.safetensors has shape \[48, 32\] but shape/config\.json implies \[40, 32\]; dimension 0 is 40, set by intermediate_size" \
  "$MOETUNE" train run.yaml --set base_model=shape --set base_model_init=
# reported as the config's fault even when the wrong sizes would not fit the device budget either
cp -r ckpt wide; sed -i 's/"hidden_size": 32/"hidden_size": 4096/' wide/config.json
expect_fail config_shape_before_budget "wide/config\.json disagrees.*model\.embed_tokens\.weight.*set by hidden_size" \
  "$MOETUNE" train run.yaml --set base_model=wide --set base_model_init= --set memory.device=1MiB
! grep -q "memory is short" config_shape_before_budget.err || fail "config_shape_before_budget: reported as memory"
# an expert beyond num_local_experts: an error, or a note with allow_unused_tensors
# add_tensor FILE NEW_NAME COPY_OF: append a copy of a tensor under a new name.
add_tensor() {
  python3 - "$@" <<'PY'
import json, struct, sys
path, name, like = sys.argv[1:4]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n)); data = f.read()
src = hdr[like]
a, b = src["data_offsets"]
hdr[name] = {"dtype": src["dtype"], "shape": src["shape"], "data_offsets": [len(data), len(data) + b - a]}
data += data[a:b]
h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h); f.write(data)
PY
  # edited by hand, the directory is no longer the checkpoint moetune's
  # completion manifest describes (which would refuse it as mixed)
  rm -f "$(dirname "$1")/moetune_complete.json"
}
cp -r ckpt extra
add_tensor extra/model.safetensors model.layers.1.block_sparse_moe.experts.4.w1.weight \
  model.layers.1.block_sparse_moe.experts.3.w1.weight
expect_fail unexplained_expert \
  "extra holds 1 tensor\(s\) that extra/config\.json does not explain, first 'model\.layers\.1\.block_sparse_moe\.experts\.4\.w1\.weight' \(expert 4, while num_local_experts is 4\).*allow_unused_tensors" \
  "$MOETUNE" train run.yaml --set base_model=extra --set base_model_init= --set output_dir=out_extra
expect_ok unexplained_expert_allowed "$MOETUNE" train run.yaml --set base_model=extra --set base_model_init= \
  --set allow_unused_tensors=true --set output_dir=out_extra --set max_steps=1
grep -q "note: 1 tensor(s) in extra are not used" unexplained_expert_allowed.err \
  || fail "unexplained_expert_allowed: no note naming the unused tensor"

# a buffer transformers itself drops on load (older checkpoints saved RoPE's inv_freq): a note only
cp -r ckpt invfreq
add_tensor invfreq/model.safetensors model.layers.0.self_attn.rotary_emb.inv_freq model.norm.weight
expect_ok ignored_buffer "$MOETUNE" train run.yaml --set base_model=invfreq --set base_model_init= \
  --set output_dir=out_invfreq --set max_steps=1
grep -q "note: 1 tensor(s) in invfreq are not used.*inv_freq" ignored_buffer.err \
  || fail "ignored_buffer: no note naming inv_freq"

# --- a learning rate that can only diverge is refused before the run ---------------------------
expect_fail huge_learning_rate "learning_rate: 1e\+30 is above 1; AdamW moves every weight" \
  "$MOETUNE" train run.yaml --set learning_rate=1e30 --set max_steps=20 --set output_dir=out_lr
[ ! -e out_lr/model.safetensors ] || fail "huge_learning_rate: a diverged model was saved"

expect_fail negative_rms_norm_eps "config\.json: key 'rms_norm_eps' = -1 must be positive" \
  "$MOETUNE" train run.yaml --set model_config.rms_norm_eps=-1 --set output_dir=out_eps

# --- data with nothing to learn ------------------------------------------------------------------
for i in 1 2 3 4 5; do echo '{"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}'; done > ignored.jsonl
expect_fail all_labels_ignored "ignored\.jsonl: no example has a token to learn" \
  "$MOETUNE" train run.yaml --set 'datasets=[{path: ignored.jsonl}]'
for i in 1 2 3 4 5; do echo "{\"input_ids\": [$i]}"; done > single.jsonl
expect_fail one_token_examples "single\.jsonl: no example has a token to learn" \
  "$MOETUNE" train run.yaml --set 'datasets=[{path: single.jsonl}]'

# --- inputs that are not regular files: an error, never a hang ------------------------------------
cp -r ckpt fifo_ckpt; rm fifo_ckpt/model.safetensors; mkfifo fifo_ckpt/model.safetensors
expect_fail fifo_checkpoint "fifo_ckpt/model\.safetensors is a FIFO" \
  "$MOETUNE" train run.yaml --set base_model=fifo_ckpt --set base_model_init=
mkfifo fifo.yaml
expect_fail fifo_run_config "run config fifo\.yaml is a FIFO" "$MOETUNE" train fifo.yaml
mkfifo fifo.jsonl
expect_fail fifo_data "data file fifo\.jsonl is a FIFO" "$MOETUNE" train run.yaml --set 'datasets=[{path: fifo.jsonl}]'
cp -r ckpt fifo_cfg; rm fifo_cfg/config.json; mkfifo fifo_cfg/config.json
expect_fail fifo_config_json "fifo_cfg/config\.json is a FIFO" "$MOETUNE" train run.yaml --set base_model=fifo_cfg
mkfifo fifo_hw.yaml
expect_fail fifo_hw_profile "fifo_hw\.yaml is a FIFO" "$MOETUNE" plan run.yaml --hw ./fifo_hw.yaml
mkdir dir.jsonl
expect_fail directory_data "dir\.jsonl is a directory" "$MOETUNE" train run.yaml --set 'datasets=[{path: dir.jsonl}]'

# --- integer keys have ranges; the planner and simulator take their extremes ---------------------
expect_fail accumulation_overflow \
  "gradient_accumulation_steps: 2147483647 is out of range; expected an integer from 1 to 1000000" \
  "$MOETUNE" train run.yaml --set gradient_accumulation_steps=2147483647
sed 's/^max_steps: 2$/max_steps: -4/' run.yaml > negative_steps.yaml
expect_fail negative_max_steps "negative_steps\.yaml:[0-9]+.*max_steps: -4 is out of range" \
  "$MOETUNE" train negative_steps.yaml
expect_fail tokens_per_micro_batch "micro_batch_size x sequence_len = 68719476736 tokens per micro-batch" \
  "$MOETUNE" train run.yaml --set micro_batch_size=65536 --set sequence_len=1048576
timeout 60 "$MOETUNE" plan run.yaml --hw "$HW" --set gradient_accumulation_steps=1000000 \
  --set micro_batch_size=65536 --set sequence_len=1048576 >extremes.out 2>extremes.err; rc=$?
if { [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ]; } && ! grep -qE "Sanitizer|runtime error" extremes.err \
   && grep -qE "step" extremes.out; then
  echo "ok   plan at the largest accepted sizes (exit $rc)"
else
  fail "plan at the largest accepted sizes: exit $rc"; cat extremes.err
fi

# --- bounded YAML: an alias bomb under model_config:, an oversized config, a bomb in a hardware profile
{ cat run.yaml; echo "model_config:"; echo "  a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"
  for l in 1 2 3 4 5 6 7 8 9; do p=$((l - 1)); echo "  a$l: &a$l [*a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p]"; done
} > bomb.yaml
expect_fail alias_bomb "bomb\.yaml:[0-9]+: aliases expand to more than 10000 nodes" "$MOETUNE" train bomb.yaml
{ cat run.yaml; head -c 1100000 /dev/zero | tr '\0' '#'; echo; } > huge.yaml
expect_fail oversized_run_config "run config huge\.yaml is [0-9]+ bytes, over the limit of 1048576 bytes" \
  "$MOETUNE" train huge.yaml
{ echo "name: bomb"; echo "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"
  for l in 1 2 3 4 5 6 7 8 9; do p=$((l - 1)); echo "a$l: &a$l [*a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p, *a$p]"; done
} > bomb_hw.yaml
expect_fail alias_bomb_hw_profile "bomb_hw\.yaml:[0-9]+: aliases expand to more than 10000 nodes" \
  "$MOETUNE" plan run.yaml --hw ./bomb_hw.yaml

# the good model survived every failure
[ "$(md5sum < out/model.safetensors)" = "$before" ] && echo "ok   good model intact" || fail "good model changed"

if [ "$failures" -ne 0 ]; then echo "validation_test: $failures failures"; exit 1; fi
echo "validation_test: all ok"

#!/usr/bin/env bash
# Nothing a user already has is lost or overwritten, checked on the real
# `moetune` binary:
#   1. an output_dir that is, contains or lies inside base_model or a dataset
#      (same path, base/./, relative, through a symlink, a parent, inside) is
#      refused with exit 1, the message names both, and every file is
#      byte-identical afterwards (sha256 of the whole tree before and after);
#   2. two runs on one output_dir: the second fails naming the first's pid,
#      the first completes and the saved model is wholly the first run's;
#   3. a run is killed (SIGKILL) at every point of its checkpoint-N save and
#      its final sharded save; whatever the loader then accepts is wholly one
#      run's weights (digest equal to an uninterrupted run's), the rest is
#      refused with a message, and the next run on that output_dir leaves a
#      loadable checkpoint again;
#   4. metrics.jsonl of two consecutive runs: both runs' lines, each after
#      its own header; save_final: false claims no saved model;
#   5. the saved config.json carries the run's model_config overrides and
#      the dtype actually saved;
#   6. the final model, every checkpoint and a LoRA adapter carry the base
#      model's tokenizer, chat template and generation config, byte for byte.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$1"; DIGEST="$2"; HW="$3"
for b in "$MOETUNE" "$DIGEST"; do [ -x "$b" ] || { echo "usage: outputs_test.sh MOETUNE CKPT_DIGEST HW.yaml"; exit 2; }; done
HW="$(cd "$(dirname "$HW")" && pwd)/$(basename "$HW")"
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
DIGEST="$(cd "$(dirname "$DIGEST")" && pwd)/$(basename "$DIGEST")"
T="${TEST_TMPDIR:-$(mktemp -d)}/outputs"
rm -rf "$T"; mkdir -p "$T/w" "$T/logs"; cd "$T/w" || exit 2
L="$T/logs"

write_tiny_mixtral 40
# a hardware profile from the repo: planning without calibrating keeps each run short
cp "$HW" hw.yaml || exit 2
cat > run.yaml <<'YAML'
base_model: models/ckpt
base_model_init: tiny.json
datasets:
  - path: data/train.jsonl
sequence_len: 16
micro_batch_size: 4
max_steps: 3
learning_rate: 1.0e-3
output_dir: out
backend: cpu
logging_steps: 1
hardware: hw.yaml
YAML
if ! "$MOETUNE" init run.yaml >"$L/init.out" 2>"$L/init.err" || [ ! -f models/ckpt/config.json ]; then
  echo "FAIL setup: moetune init"; cat "$L/init.err"; exit 1
fi
if ! timeout 60 "$MOETUNE" train run.yaml --set output_dir=probe >"$L/probe.out" 2>"$L/probe.err"; then
  echo "FAIL setup: a plain run"; cat "$L/probe.err"; exit 1
fi
rm -rf probe

# --- 1. inputs are never outputs --------------------------------------------------------
snapshot() { find . -path ./probe -prune -o \( -type f -o -type l -o -type d \) -print | LC_ALL=C sort \
  | while read -r f; do if [ -f "$f" ] && [ ! -L "$f" ]; then sha256sum "$f"; else echo "- $f"; fi; done; }
ln -s models/ckpt linked
ln -s models linked_models
# refused NAME OUTPUT_DIR INPUT_KEY INPUT_PATH [CMD]: exit 1, both named, nothing changed
refused() {
  local name="$1" out="$2" key="$3" input="$4" cmd="${5:-train}"
  snapshot > "$L/$name.before"
  timeout 60 "$MOETUNE" "$cmd" run.yaml --set "output_dir=$out" >"$L/$name.out" 2>"$L/$name.err"; local rc=$?
  snapshot > "$L/$name.after"
  if [ "$rc" -ne 1 ]; then fail "$name: exit $rc, expected 1"; cat "$L/$name.err"; return; fi
  if ! grep -qF "output_dir '$out'" "$L/$name.err" || ! grep -qF "$key '$input'" "$L/$name.err"; then
    fail "$name: the message does not name output_dir '$out' and $key '$input':"; cat "$L/$name.err"; return
  fi
  if ! cmp -s "$L/$name.before" "$L/$name.after"; then
    fail "$name: files changed:"; diff "$L/$name.before" "$L/$name.after" | head; return
  fi
  ok "$name: $(head -c 240 "$L/$name.err")"
}
refused same_path models/ckpt base_model models/ckpt
refused dot_slash models/ckpt/./ base_model models/ckpt
refused dot_dot data/../models/ckpt base_model models/ckpt
refused absolute "$PWD/models/ckpt" base_model models/ckpt
refused symlink linked base_model models/ckpt
refused inside_symlink linked_models/ckpt/run base_model models/ckpt
refused inside_base models/ckpt/run base_model models/ckpt
refused parent_of_base models base_model models/ckpt
refused parent_of_all . base_model models/ckpt
refused dataset_parent data/ 'datasets[0].path' data/train.jsonl
refused inside_dataset data/train.jsonl/out 'datasets[0].path' data/train.jsonl
refused init_target models/ckpt base_model models/ckpt init
# a base_model that does not exist yet (base_model_init would create it): nothing is created
snapshot > "$L/fresh.before"
timeout 60 "$MOETUNE" train run.yaml --set base_model=models/fresh --set output_dir=models/fresh/. \
  >"$L/fresh.out" 2>"$L/fresh.err"; rc=$?
snapshot > "$L/fresh.after"
if [ "$rc" -eq 1 ] && [ ! -e models/fresh ] && cmp -s "$L/fresh.before" "$L/fresh.after" \
   && grep -qF "base_model 'models/fresh'" "$L/fresh.err"; then
  ok "not-yet-existing base_model == output_dir: refused before base_model_init creates it"
else
  fail "not-yet-existing base_model == output_dir (exit $rc)"; cat "$L/fresh.err"
fi

# --- 2. one run per output_dir ---------------------------------------------------------
# The first run is long enough to still hold the lock when the second tries.
long=(--set max_steps=1500 --set logging_steps=500)
"$MOETUNE" train run.yaml --set output_dir=shared "${long[@]}" >"$L/first.out" 2>"$L/first.err" &
first=$! # moetune itself (no wrapper): the pid the lock must name
for _ in $(seq 1 400); do grep -q "pid $first" shared/.moetune.lock 2>/dev/null && break; sleep 0.05; done
timeout 60 "$MOETUNE" train run.yaml --set output_dir=shared --set learning_rate=5e-3 "${long[@]}" \
  >"$L/second.out" 2>"$L/second.err"; rc2=$?
kill -0 "$first" 2>/dev/null; first_alive=$?
wait "$first"; rc1=$?
timeout 300 "$MOETUNE" train run.yaml --set output_dir=shared_ref "${long[@]}" >/dev/null 2>"$L/ref.err" \
  || { fail "reference run"; cat "$L/ref.err"; }
if [ "$first_alive" -ne 0 ]; then
  fail "concurrent runs: the first run ended before the second finished trying; the check proves nothing"
elif [ "$rc2" -ne 1 ] || ! grep -qE "in use by another moetune run \(pid $first[,)]" "$L/second.err"; then
  fail "concurrent runs: second exit $rc2, expected 1 naming pid $first:"; cat "$L/second.err"
elif [ "$rc1" -ne 0 ]; then
  fail "concurrent runs: the first run failed ($rc1)"; cat "$L/first.err"
elif [ "$(grep -c '"run_start"' shared/metrics.jsonl)" -ne 1 ] || ! grep -q "\"pid\":$first," shared/metrics.jsonl \
     || [ "$(wc -l < shared/metrics.jsonl)" -ne 5 ]; then
  fail "concurrent runs: metrics.jsonl is not the first run's alone:"; cut -c1-120 shared/metrics.jsonl
elif [ "$("$DIGEST" shared)" != "$("$DIGEST" shared_ref)" ]; then
  fail "concurrent runs: the saved model is not the first run's"
else
  ok "concurrent runs: $(head -c 200 "$L/second.err"); first run's model intact"
fi

# --- 3. kill -9 at every point of a save ------------------------------------------------
# Run A's complete saves are in place; run B (another learning rate) saves
# checkpoint-2 (swapped whole) and then the final model (merged into the
# output_dir), sharded, and is killed at point k of those saves, for every k.
save=(--set save_max_shard_size=40KiB --set save_steps=2 --set max_steps=3)
"$MOETUNE" train run.yaml --set output_dir=runA "${save[@]}" >/dev/null 2>"$L/runA.err" || { fail "run A"; cat "$L/runA.err"; }
"$MOETUNE" train run.yaml --set output_dir=runB --set learning_rate=3e-3 "${save[@]}" >/dev/null 2>"$L/runB.err" \
  || { fail "run B"; cat "$L/runB.err"; }
dA=$("$DIGEST" runA | cut -d' ' -f1); dA2=$("$DIGEST" runA/checkpoint-2 | cut -d' ' -f1)
dB=$("$DIGEST" runB | cut -d' ' -f1); dB2=$("$DIGEST" runB/checkpoint-2 | cut -d' ' -f1)
shards=$(ls runB | grep -c -- '-of-')
if [ "$(printf '%s\n' "$dA" "$dA2" "$dB" "$dB2" | sort -u | grep -c .)" -ne 4 ] || [ "$shards" -lt 3 ]; then
  fail "kill loop setup: runs A and B must give 4 different sharded checkpoints ($dA $dA2 $dB $dB2, $shards shards)"
fi
# whose DIR DIGEST...: ok when refused with a message, or accepted holding one of
# the given runs' weights (counted as A's or B's)
n_refused=0; n_as_b=0; n_as_a=0
whose() {
  local dir="$1" out want; shift
  if out=$("$DIGEST" "$dir" 2>"$L/digest.err"); then
    out=${out%% *}
    for want in "$@"; do
      [ "$out" = "$want" ] || continue
      case "$want" in "$dB"|"$dB2") n_as_b=$((n_as_b + 1));; *) n_as_a=$((n_as_a + 1));; esac
      return 0
    done
    echo "loaded $dir holds none of the expected weights ($out; wanted $*)"; return 1
  fi
  if grep -qE "not a complete checkpoint|was writing this checkpoint and did not finish" "$L/digest.err"; then
    n_refused=$((n_refused + 1)); return 0
  fi
  echo "$dir refused without saying why: $(cat "$L/digest.err")"; return 1
}
k=1; kill_fail=0
while [ "$k" -le 200 ]; do
  rm -rf kill; cp -a runA kill
  MOETUNE_TEST_CRASH_AT=$k "$MOETUNE" train run.yaml --set output_dir=kill --set learning_rate=3e-3 "${save[@]}" \
    >/dev/null 2>"$L/kill.err"; rc=$?
  [ "$rc" -eq 0 ] && break # k is past the last point: the run finished
  if [ "$rc" -ne 137 ]; then echo "point $k: exit $rc, expected a SIGKILL (137)"; cat "$L/kill.err"; kill_fail=1; break; fi
  whose kill "$dA" "$dB" || kill_fail=1
  whose kill/checkpoint-2 "$dA2" "$dB2" || kill_fail=1
  for d in kill/.*moetune-tmp-*; do # leftover staging or moved-aside: refused, or wholly one save
    [ -d "$d" ] && { whose "$d" "$dA2" "$dB2" "$dB" || kill_fail=1; }
  done
  # the next run on this output_dir (no save of its own) finishes or clears what was left
  "$MOETUNE" train run.yaml --set output_dir=kill --set save_final=false --set max_steps=1 >/dev/null 2>"$L/recover.err" \
    || { echo "point $k: the next run failed: $(cat "$L/recover.err")"; kill_fail=1; }
  before=$n_refused
  whose kill "$dA" "$dB" && whose kill/checkpoint-2 "$dA2" "$dB2" || kill_fail=1
  [ "$n_refused" -eq "$before" ] || { echo "point $k: still refused after the next run"; kill_fail=1; }
  if ls -a kill | grep -q moetune-tmp; then echo "point $k: leftovers after the next run: $(ls -a kill | grep moetune-tmp)"; kill_fail=1; fi
  k=$((k + 1))
done
points=$((k - 1))
if [ "$kill_fail" -ne 0 ]; then
  fail "kill loop (see above)"
elif [ "$points" -lt 20 ] || [ "$n_refused" -eq 0 ] || [ "$n_as_b" -eq 0 ] || [ "$rc" -ne 0 ]; then
  fail "kill loop: $points points, $n_refused refused, $n_as_b loaded as B; expected >= 20 points, some refused, some B, then a clean run"
elif [ "$("$DIGEST" kill | cut -d' ' -f1)" != "$dB" ]; then
  fail "kill loop: the uninterrupted run's model differs from run B's"
else
  ok "kill -9 at $points points of a $shards-shard save: loaded as A $n_as_a, as B $n_as_b, refused $n_refused times; every next run left a loadable checkpoint"
fi

# a leftover staging directory, as `moetune inspect` and `moetune train` meet it
rm -rf kill; cp -a runA kill
MOETUNE_TEST_CRASH_AT=2 "$MOETUNE" train run.yaml --set output_dir=kill --set learning_rate=3e-3 "${save[@]}" >/dev/null 2>&1
leftover=$(ls -d kill/.checkpoint-2.moetune-tmp-* 2>/dev/null | head -1)
if [ -z "$leftover" ]; then
  fail "no staging directory left by a run killed at point 2"
else
  "$MOETUNE" inspect "$leftover" >"$L/inspect_left.out" 2>"$L/inspect_left.err"; rci=$?
  "$MOETUNE" train run.yaml --set "base_model=$leftover" --set output_dir=from_leftover >/dev/null 2>"$L/train_left.err"; rct=$?
  if [ "$rci" -eq 1 ] && [ "$rct" -eq 1 ] && grep -q "was writing this checkpoint and did not finish" "$L/inspect_left.err" \
     && grep -q "was writing this checkpoint and did not finish" "$L/train_left.err"; then
    ok "leftover staging directory refused by inspect and train: $(head -c 200 "$L/inspect_left.err")"
  else
    fail "leftover staging directory: inspect exit $rci, train exit $rct"; cat "$L/inspect_left.err" "$L/train_left.err"
  fi
fi

# --- 4. metrics.jsonl is appended --------------------------------------------------------
"$MOETUNE" train run.yaml --set output_dir=metrics --set save_final=false >/dev/null 2>"$L/m1.err" || fail "metrics run 1"
cp metrics/metrics.jsonl "$L/m1.jsonl"
"$MOETUNE" train run.yaml --set output_dir=metrics --set save_final=false >"$L/m2.out" 2>"$L/m2.err" || fail "metrics run 2"
# header, steps 1..3, header, steps 1..3; the first run's bytes untouched; two different pids
shape=$(sed -E 's/^\{"run_start":"[0-9T:Z-]+","pid":([0-9]+),.*/H\1/; s/^\{"step":([0-9]+),.*/S\1/' metrics/metrics.jsonl | tr '\n' ' ')
pids=$(grep -o '"pid":[0-9]*' metrics/metrics.jsonl | sort -u | grep -c .)
if [[ "$shape" =~ ^H[0-9]+\ S1\ S2\ S3\ H[0-9]+\ S1\ S2\ S3\ $ ]] && [ "$pids" -eq 2 ] \
   && cmp -s -n "$(wc -c < "$L/m1.jsonl")" "$L/m1.jsonl" metrics/metrics.jsonl; then
  ok "metrics.jsonl of two runs: $shape"
else
  fail "metrics.jsonl of two runs: $shape ($pids pids)"; cut -c1-100 metrics/metrics.jsonl
fi
# save_final: false says what was written and claims no saved model
if grep -q "model saved" "$L/m2.out" || ! grep -q "no final model was written" "$L/m2.out" \
   || ls metrics | grep -q safetensors; then
  fail "save_final: false: $(cat "$L/m2.out")"
else
  ok "save_final: false: $(cat "$L/m2.out")"
fi

# --- 5. the saved config.json is what the model was trained with ------------------------
"$MOETUNE" train run.yaml --set output_dir=cfg --set bf16=true --set save_dtype=bfloat16 --set model_config.rope_theta=5000.0 \
  --set max_steps=1 >/dev/null 2>"$L/cfg.err" || { fail "bf16 run with a model_config override"; cat "$L/cfg.err"; }
"$MOETUNE" inspect cfg >"$L/cfg_inspect.out" 2>&1
# the dtype config.json states must be the one the weights were saved in
saved=$(grep -oE '^  (F32|BF16|F16) +[0-9]+ tensors' "$L/cfg_inspect.out" | awk '{print $1}' | sort -u | tr '\n' ' ')
case "$saved" in "BF16 ") want=bfloat16;; "F32 ") want=float32;; "F16 ") want=float16;; *) want="one dtype, not '$saved'";; esac
if grep -qE '"rope_theta": 5000(\.0)?,' cfg/config.json && grep -q "\"torch_dtype\": \"$want\"" cfg/config.json \
   && grep -q "\"dtype\": \"$want\"" cfg/config.json && grep -q '"rope_theta": 10000' models/ckpt/config.json; then
  ok "saved config.json: the rope_theta override, torch_dtype and dtype $want as the weights ($saved)"
else
  fail "saved config.json (weights: $saved):"; cat cfg/config.json "$L/cfg_inspect.out"
fi

# --- 6. a saved model loads with its tokenizer ------------------------------------------
printf '{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}\n' > models/ckpt/tokenizer.json
printf '{"chat_template": "{%% for m in messages %%}{{ m.content }}{%% endfor %%}", "eos_token": "</s>"}\n' \
  > models/ckpt/tokenizer_config.json
printf '{"bos_token_id": 1, "eos_token_id": 2}\n' > models/ckpt/generation_config.json
companions="tokenizer.json tokenizer_config.json generation_config.json"
same_companions() {  # DIR: each companion file byte-identical to the base model's
  for f in $companions; do cmp -s "models/ckpt/$f" "$1/$f" || return 1; done
  grep -q '"tokenizer.json"' "$1/moetune_complete.json"
}
"$MOETUNE" train run.yaml --set output_dir=tok --set save_steps=2 >/dev/null 2>"$L/tok.err" || { fail "run with tokenizer files"; cat "$L/tok.err"; }
"$MOETUNE" train run.yaml --set output_dir=toklora --set adapter=lora --set 'lora_target_modules=[q_proj]' \
  --set lora_r=2 --set max_steps=1 >/dev/null 2>"$L/toklora.err" || { fail "LoRA run with tokenizer files"; cat "$L/toklora.err"; }
if same_companions tok && same_companions tok/checkpoint-2 && same_companions toklora && [ ! -e tok/merges.txt ]; then
  ok "tokenizer, chat template and generation config copied into the model, checkpoint-2 and the adapter"
else
  fail "tokenizer files in the outputs:"; ls tok tok/checkpoint-2 toklora
fi

if [ "$failures" -ne 0 ]; then echo "outputs_test: $failures failures"; exit 1; fi
echo "outputs_test: all ok"

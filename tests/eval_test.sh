#!/usr/bin/env bash
# Evaluation end to end through the `moetune` command, on a tiny random
# Mixtral: eval lines in metrics.jsonl and HF's eval entries in
# trainer_state.json; the eval loss equal to the training forward's loss
# over the same examples (a step at learning_rate 0 with all of them in one
# micro-batch: its ce_loss is the token mean too), for a full and a LoRA
# run, within 1e-6 relative (the two sum the same token losses in another
# order); the same eval loss, bit for bit, under keep_all and offload_all
# and across a resume; training bit-identical with evaluation on and off;
# and the refusals, each naming its key.
set -u
MOETUNE="$1" DIGEST="${2:-}"
[ -x "$MOETUNE" ] && [ -x "$DIGEST" ] || { echo "usage: eval_test.sh PATH_TO_MOETUNE PATH_TO_CKPT_DIGEST"; exit 2; }
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
DIGEST="$(cd "$(dirname "$DIGEST")" && pwd)/$(basename "$DIGEST")"
W="${TEST_TMPDIR:-$(mktemp -d)}/eval"
rm -rf "$W"; mkdir -p "$W"; cd "$W" || exit 2
failures=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; failures=$((failures + 1)); }

cat > tiny.json <<'JSON'
{"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": false, "output_router_logits": true}
JSON
# examples of varying length (8..19 tokens, a few masked labels): batches
# of different counted tokens, where a mean of batch means would differ
rows() { # rows N SEED
  local n="$1" s="$2" i j len ids labels
  for ((i = 0; i < n; i++)); do
    len=$(( 8 + (i * 7 + s) % 12 )); ids=""; labels=""
    for ((j = 0; j < len; j++)); do
      local t=$(( (i * 31 + j * 17 + s * 13) % 64 ))
      ids="$ids${ids:+, }$t"
      if (( j < 3 && i % 3 == 0 )); then labels="$labels${labels:+, }-100"; else labels="$labels${labels:+, }$t"; fi
    done
    echo "{\"input_ids\": [$ids], \"labels\": [$labels]}"
  done
}
rows 40 1 > data.jsonl
rows 7 5 > heldout.jsonl
cat > run.yaml <<'YAML'
base_model: ckpt
base_model_init: tiny.json
datasets:
  - path: data.jsonl
sequence_len: 16
micro_batch_size: 4
max_steps: 6
learning_rate: 1.0e-3
lr_scheduler: linear
output_dir: out
backend: cpu
seed: 7
val_set_size: 0.2
eval_steps: 2
eval_batch_size: 3
save_steps: 3
YAML

train() { # train NAME ARGS...: a run whose output_dir is NAME
  local name="$1"; shift
  timeout 120 "$MOETUNE" train run.yaml --set output_dir="$name" "$@" >"$name.out" 2>"$name.err" \
    || { bad "$name: the run failed"; cat "$name.err"; return 1; }
}
evals() { grep -o '"step":[0-9]*,"eval_loss":[^,]*' "$1/metrics.jsonl"; }
field() { grep -o "\"$2\":[^,}]*" "$1" | head -1 | cut -d: -f2; }
# the weights' digest (names, shapes, bytes; not the save id in the headers)
same_weights() { [ "$("$DIGEST" "$1")" = "$("$DIGEST" "$2")" ] && [ -n "$("$DIGEST" "$1")" ]; }
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; exit !(d <= 1e-6 * m) }'; }

# --- a run: eval lines, log_history entries, progress and summary ----------
if train out; then
  n=$(evals out | wc -l)
  steps=$(evals out | cut -d, -f1 | cut -d: -f2 | tr '\n' ' ')
  if [ "$n" -eq 3 ] && [ "$steps" = "2 4 6 " ] && grep -q '"eval_ppl":' out/metrics.jsonl \
     && grep -q '"eval_tokens":' out/metrics.jsonl; then
    ok "metrics.jsonl: eval lines at steps $steps"
  else
    bad "metrics.jsonl: $n eval lines at steps '$steps', expected 2 4 6"; cat out/metrics.jsonl
  fi
  ts=out/checkpoint-3/trainer_state.json
  if grep -q '"eval_loss"' "$ts" && grep -A6 '"eval_loss"' "$ts" | grep -q '"step": 2' \
     && grep -A6 '"eval_loss"' "$ts" | grep -q '"epoch"'; then
    ok "trainer_state.json: an HF eval entry (eval_loss, epoch, step 2)"
  else
    bad "trainer_state.json has no eval entry for step 2"; cat "$ts"
  fi
  grep -q 'eval_loss' out.out && grep -q '^step 3/6 .*eval_loss' out.err \
    && ok "the summary and later progress lines show the eval loss" \
    || { bad "summary or progress without eval loss"; cat out.out out.err; }
  grep -q '32 examples' out.err && ok "val_set_size 0.2 holds out 8 of 40 examples" \
    || { bad "not 32 training examples"; cat out.err; }
fi

# --- the same eval loss under another plan and across a resume -------------
if train out_offload --set scheduler.policy=offload_all; then
  [ "$(evals out)" = "$(evals out_offload)" ] && same_weights out out_offload \
    && ok "keep vs offload_all: eval losses and weights bit-identical" \
    || { bad "offload_all differs"; evals out; evals out_offload; }
fi
if train out_keep --set scheduler.policy=keep_all; then
  [ "$(evals out)" = "$(evals out_keep)" ] && ok "keep_all: eval losses bit-identical" \
    || { bad "keep_all differs"; evals out_keep; }
fi
if train out_resume --set resume_from_checkpoint=out/checkpoint-3; then
  [ "$(evals out | tail -2)" = "$(evals out_resume)" ] \
    && same_weights out out_resume \
    && ok "resumed at step 3: eval losses at 4 and 6 and the final weights bit-identical" \
    || { bad "resume differs"; evals out; evals out_resume; }
fi

# --- training bit-identical with evaluation on and off ---------------------
if train out_noeval --set eval_steps=0 && train out_every --set eval_steps=1; then
  [ "$(evals out_noeval | wc -l)" -eq 0 ] && [ "$(evals out_every | wc -l)" -eq 6 ] \
    && same_weights out out_noeval && same_weights out out_every \
    && [ "$(grep -o '"loss":[^,]*' out/metrics.jsonl)" = "$(grep -o '"loss":[^,]*' out_noeval/metrics.jsonl)" ] \
    && ok "eval_steps 0, 1 and 2: the same losses and weights, bit for bit" \
    || bad "evaluation changed training"
fi
if train out_test --set val_set_size= --set test_datasets='[{path: heldout.jsonl}]' \
   && train out_none --set val_set_size= --set eval_steps=; then
  [ "$(evals out_test | wc -l)" -eq 3 ] && [ "$(evals out_none | wc -l)" -eq 0 ] \
    && same_weights out_test out_none \
    && ok "test_datasets: evaluated, training bit-identical to a run without" \
    || bad "test_datasets changed training or did not evaluate"
fi

# --- the eval loss is the token mean of the training forward's loss --------
# A: evaluate heldout.jsonl after a step at learning_rate 0 (weights unchanged),
#    in batches of 3, 3 and 1; B: one step on heldout.jsonl as one micro-batch.
# EVAL_ONLY: settings of A alone (LoRA dropout, which evaluation turns off)
same_loss() { # NAME ARGS...
  local name="$1"; shift
  train "${name}_eval" --set val_set_size= --set test_datasets='[{path: heldout.jsonl}]' --set learning_rate=0 \
    --set max_steps=1 --set eval_steps=1 --set save_steps=0 "$@" ${EVAL_ONLY:-} || return
  train "${name}_fwd" --set val_set_size= --set eval_steps= --set datasets='[{path: heldout.jsonl}]' \
    --set micro_batch_size=7 --set learning_rate=0 --set max_steps=1 --set save_steps=0 "$@" || return
  local e f
  e=$(field "${name}_eval/metrics.jsonl" eval_loss); f=$(field "${name}_fwd/metrics.jsonl" ce_loss)
  if [ -n "$e" ] && [ -n "$f" ] && close "$e" "$f"; then
    ok "$name: eval_loss $e = the training forward's ce_loss $f (1e-6 relative)"
  else
    bad "$name: eval_loss '$e' vs training forward ce_loss '$f'"
  fi
}
same_loss full
if train out_lora_base --set adapter=lora --set lora_target_linear=true --set lora_r=4 --set lora_alpha=8 \
     --set learning_rate=0.02 --set val_set_size= --set eval_steps= --set save_steps=0; then
  EVAL_ONLY="--set lora_dropout=0.3" same_loss lora --set adapter=lora --set lora_target_linear=true \
    --set lora_r=4 --set lora_alpha=8 --set lora_model_dir=out_lora_base
  # the adapter moved the loss: the comparison is not of the base model alone
  b=$(field full_eval/metrics.jsonl eval_loss); l=$(field lora_eval/metrics.jsonl eval_loss)
  [ -n "$l" ] && [ "$b" != "$l" ] && ok "the LoRA adapter changes the eval loss ($b -> $l)" \
    || bad "LoRA eval loss $l equals the base's $b"
fi

# --- refusals ---------------------------------------------------------------
expect_fail() { # NAME PATTERN ARGS...
  local name="$1" pattern="$2"; shift 2
  timeout 60 "$MOETUNE" train run.yaml --set output_dir="$name" "$@" >"$name.out" 2>"$name.err"; local rc=$?
  if [ "$rc" -eq 1 ] && grep -qE -- "$pattern" "$name.err"; then ok "$name: $(head -c 200 "$name.err")"
  else bad "$name: exit $rc, expected 1 with /$pattern/"; cat "$name.err"; fi
}
expect_fail refuse_all 'val_set_size.*none to train on' --set val_set_size=40
expect_fail refuse_fraction 'val_set_size: 1 as a fraction' --set val_set_size=1.0
expect_fail refuse_both 'val_set_size and test_datasets' --set test_datasets='[{path: heldout.jsonl}]'
expect_fail refuse_steps 'eval_steps' --set eval_steps=-2
printf '{"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}\n' > masked.jsonl
expect_fail refuse_untrained 'test_datasets: .*masked.jsonl.*no example has a token' --set val_set_size= \
  --set test_datasets='[{path: masked.jsonl}]'

[ "$failures" -eq 0 ] && echo "all passed" || echo "$failures failure(s)"
exit $(( failures > 0 ))

#!/usr/bin/env bash
# Conversations as training sees them, against transformers 5 (fixtures by
# tests/reference/make_chat_fixtures.py): for six tokenizer and template
# pairs (Qwen3, DeepSeek-V3.1, gpt-oss, Mistral and ChatML with and without
# {% generation %}), `moetune tokenize --chat` must give transformers'
# rendered text and token ids, refuse what it refuses, and train exactly
# the tokens of transformers' assistant mask: the generation template's own,
# and, for plain ChatML, moetune's turn finding held to the generation
# template's mask of the same conversations.  Then a user's literal
# "<|im_end|>" stays text, a bad row is named by line, and the chat quick
# start trains and saves a model with its tokenizer.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
FIX="tests/fixtures/chat"
T="${TEST_TMPDIR:-$(mktemp -d)}/chat"
rm -rf "$T"; mkdir -p "$T"

for n in tiny_chatml tiny_chatml_generation qwen3 deepseek_v3 gpt_oss mistral; do
  "$MOETUNE" tokenize "$FIX/$n" --chat < "$FIX/$n/rows.jsonl" > "$T/$n.jsonl" 2>"$T/$n.err"
  mask=""
  case $n in tiny_chatml*) mask="$FIX/tiny_chatml_generation/expected.jsonl";; esac
  if python3 tests/chat_data_check.py "$FIX/$n/expected.jsonl" "$T/$n.jsonl" $mask > "$T/$n.check"; then
    ok "$n: $(tail -n 1 "$T/$n.check")"
  else
    fail "$n:"; cat "$T/$n.check" "$T/$n.err"
  fi
done

# the other text dataset types, as axolotl's strategies tokenize and label them
for kind in completion alpaca input_output; do
  d="$FIX/formats_mixtral"
  "$MOETUNE" tokenize "$d" --format "$kind" < "$d/$kind.jsonl" > "$T/$kind.jsonl" 2>"$T/$kind.err"
  if python3 tests/chat_data_check.py "$d/$kind.expected.jsonl" "$T/$kind.jsonl" > "$T/$kind.check"; then
    ok "$kind: $(tail -n 1 "$T/$kind.check")"
  else
    fail "$kind:"; cat "$T/$kind.check" "$T/$kind.err"
  fi
done

# row 3 spells <|im_end|> and <|im_start|> in its content: the Qwen3 template writes each once per
# message (2 messages), so those are the only special ids; transformers would turn the user's too
counts=$(sed -n 3p "$T/qwen3.jsonl" | python3 -c '
import json, sys
row = json.loads(sys.stdin.read())
tok = json.load(open(sys.argv[1]))
ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
print(row["ids"].count(ids["<|im_start|>"]), row["ids"].count(ids["<|im_end|>"]))' "$FIX/qwen3/tokenizer.json")
if [ "$counts" = "2 2" ]; then ok "a user's literal <|im_start|> and <|im_end|> stay text (template's: $counts)"
else fail "special tokens from user text: <|im_start|>, <|im_end|> counts $counts, expected 2 2"; fi

# a bad row: named by its line, the others still printed
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' '{"messages": [{"role": "wizard", "content": "x"}]}' \
  | "$MOETUNE" tokenize "$FIX/qwen3" --chat > "$T/bad.jsonl" 2>&1
if grep -q '"line": *2' "$T/bad.jsonl" && grep -q "wizard" "$T/bad.jsonl" && [ "$(wc -l < "$T/bad.jsonl")" -eq 2 ]; then
  ok "an unknown role is named with its line"
else fail "unknown role:"; cat "$T/bad.jsonl"; fi

# the chat quick start, shortened: trains, saves the model with its tokenizer files
cp -r configs "$T/configs"
( cd "$T" && "$MOETUNE" train configs/quickstart-chat.yaml --set max_steps=20 --set logging_steps=10 \
    > "$T/qs.out" 2> "$T/qs.err" )
out="$T/outputs/quickstart-chat/run"
if [ -f "$out/model.safetensors" ] && cmp -s "$out/tokenizer.json" configs/tokenizers/tiny-chat/tokenizer.json \
   && grep -q "examples in 600 rows" "$T/qs.err"; then
  ok "chat quick start: $(tail -n 1 "$T/qs.out")"
else
  fail "chat quick start:"; tail -n 5 "$T/qs.out" "$T/qs.err"
fi

# prepare: the counts training will see, without a model
"$MOETUNE" prepare configs/quickstart-chat.yaml --set sample_packing=true > "$T/prep.out" 2> "$T/prep.err"
if grep -q "^examples    600 " "$T/prep.out" && grep -q "(packed)" "$T/prep.out" && grep -q "trained" "$T/prep.out"; then
  ok "prepare: $(tr '\n' ';' < "$T/prep.out" | cut -c1-200)"
else fail "prepare:"; cat "$T/prep.out" "$T/prep.err"; fi

# datasets[].weight: the quick start's 600 conversations twice and a quarter of them again
"$MOETUNE" prepare configs/quickstart-chat.yaml --set 'datasets=[{path: configs/data/quickstart-chat.jsonl, type: chat_template,
  weight: 2}, {path: configs/data/quickstart-chat.jsonl, type: chat_template, weight: 0.25}]' > "$T/w.out" 2>&1
if grep -q "^examples    1350 " "$T/w.out"; then ok "weights 2 and 0.25 of 600 examples: 1350"
else fail "dataset weights:"; cat "$T/w.out"; fi

# the prepared-data cache: written once, read back, the same losses as tokenizing; a damaged file is
# reported and tokenized again, never used
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | tr '\n' ' '; }
qs() { ( cd "$T" && "$MOETUNE" train configs/quickstart-chat.yaml --set max_steps=4 --set logging_steps=1 \
           --set output_dir="$T/$1" "${@:2}" > "$T/$1.out" 2> "$T/$1.err" ); }
qs plain && qs cached1 --set dataset_prepared_path="$T/prep" && qs cached2 --set dataset_prepared_path="$T/prep"
for f in "$T"/prep/*.examples; do head -c 1000 "$f" > "$f.cut" && mv "$f.cut" "$f"; done
qs cached3 --set dataset_prepared_path="$T/prep"
want=$(losses "$T/plain")
if [ -n "$want" ] && [ "$(losses "$T/cached1")" = "$want" ] && [ "$(losses "$T/cached2")" = "$want" ] \
   && [ "$(losses "$T/cached3")" = "$want" ] && grep -q "1 tokenized and written" "$T/cached1.err" \
   && grep -q "1 file(s) read from" "$T/cached2.err" && grep -q "fails its checks" "$T/cached3.err"; then
  ok "dataset_prepared_path: written, read back, a damaged file re-tokenized; losses equal: $want"
else
  fail "dataset_prepared_path: losses plain '$want' cached '$(losses "$T/cached1")' / '$(losses "$T/cached2")' / '$(losses "$T/cached3")'"
  cat "$T/cached2.err" "$T/cached3.err"
fi

if [ "$failures" -ne 0 ]; then echo "chat_data_test: $failures failures"; exit 1; fi
echo "chat_data_test: all ok"

# Shared by the shell tests that drive the real moetune binary: counting
# failures, the tiny Mixtral they train, and reading what a run wrote.
# Sourced (not run) by each test: . "$(dirname "$0")/test_lib.sh"

failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }

# tiny.json (a 2-layer Mixtral with 4 experts, top-2, and the load-balancing
# loss) and data/train.jsonl with ROWS rows of 12 tokens, in the current
# directory: small enough that a run takes a second, large enough to route
# every expert.
write_tiny_mixtral() {
  local rows="$1" i
  mkdir -p models data
  cat > tiny.json <<'JSON'
{"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": false, "output_router_logits": true}
JSON
  for i in $(seq 1 "$rows"); do
    echo "{\"input_ids\": [$((i % 64)), 5, 9, 13, $(((i * 7) % 64)), 21, 25, 29, 33, $(((i * 3) % 64)), 41, 45]}"
  done > data/train.jsonl
}

# The per-step losses a run logged in DIR/metrics.jsonl, one per line.
losses() { grep -o '"step":[0-9]*,"loss":[-0-9.e]*' "$1/metrics.jsonl"; }

# A digest of DIR/model.safetensors' tensor bytes: everything after the
# header (the header holds the save's id, which differs from save to save).
tensor_bytes() {
  local f="$1/model.safetensors" n
  n=$(od -An -tu8 -N8 "$f" | tr -d ' ')
  tail -c +$((9 + n)) "$f" | sha256sum | cut -d' ' -f1
}

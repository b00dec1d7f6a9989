# Shared by the shell tests that drive the real moetune binary: counting
# failures, checking outside tools before use, the tiny Mixtral they train,
# and reading what a run wrote.
# Sourced (not run) by each test: . "$(dirname "$0")/test_lib.sh"

failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }

# Outside tools (mpirun, torchrun) are not part of the build, and the one a
# machine has may be missing, another implementation or too old.  A test
# asks the one it finds whether it can do what the test needs before using
# it; when it cannot, the check prints one line, `SKIPPED: TOOL WHY`, and
# the test leaves that part out without failing.  PART, the last argument
# of each check, names what is left out.

# skipped TOOL WHY: that line.
skipped() { echo "SKIPPED: $1 $2"; }

# mpirun_usable N PART: mpirun is Open MPI's (the tests give its options
# and variables, and moetune's ranks are built against it) and starts N
# processes here, under the OMPI_* settings the test exported.
mpirun_usable() {
  local n="$1" part="$2" version out
  if ! command -v mpirun >/dev/null; then
    skipped mpirun "not installed (Debian: openmpi-bin); not run: $part"; return 1
  fi
  version=$(timeout 60 mpirun --version 2>&1 | head -n1)
  case "$version" in
    *"Open MPI"*) ;;
    *) skipped mpirun "$(command -v mpirun) is not Open MPI's (--version: ${version:-no answer}); not run: $part"; return 1 ;;
  esac
  if ! out=$(timeout 120 mpirun -np "$n" true 2>&1); then
    skipped mpirun "($version) cannot start $n processes here (mpirun -np $n true: $(grep -m1 '[[:alpha:]]' <<<"$out")); not run: $part"
    return 1
  fi
}

# The PyTorch version behind a torchrun script, asked of its Python
# interpreter ("version unknown" when it does not say).
torchrun_version() {
  local interp
  interp=$(head -n1 "$1" 2>/dev/null | sed -n 's/^#![[:space:]]*//p')
  case "$interp" in
    *python*) ;;
    *) echo "version unknown"; return ;;
  esac
  # shellcheck disable=SC2086 # the interpreter line may carry arguments (env python3)
  timeout 120 $interp -c 'import torch; print("PyTorch " + torch.__version__)' 2>/dev/null | tail -n1 | grep . \
    || echo "version unknown"
}

# torchrun_usable PART: TORCHRUN (else torchrun on PATH) takes the options
# the tests and README give it, --standalone, --nproc-per-node and
# --no-python (PyTorch 1.x's torchrun, Debian 12's 1.13 among them, knows
# only --nproc_per_node and --no_python and rejects these).  Sets TORCHRUN.
torchrun_usable() {
  local part="$1" help opt
  TORCHRUN="${TORCHRUN:-$(command -v torchrun || true)}"
  if [ -z "$TORCHRUN" ] || [ ! -x "$TORCHRUN" ]; then
    skipped torchrun "not installed (PyTorch's launcher; or --test_env=TORCHRUN=path); not run: $part"; return 1
  fi
  if ! help=$(timeout 120 "$TORCHRUN" --help 2>&1); then
    skipped torchrun "$TORCHRUN --help failed ($(tail -n1 <<<"$help")); not run: $part"; return 1
  fi
  for opt in --standalone --nproc-per-node --no-python; do
    grep -q -e "$opt" <<<"$help" && continue
    skipped torchrun "$TORCHRUN ($(torchrun_version "$TORCHRUN")) has no $opt option; not run: $part"
    return 1
  done
}

# A TCP port for a test's ranks to meet on, from 20000..59999 so that tests
# running side by side (and this one's earlier launches) rarely collide.
random_port() { echo $((20000 + (RANDOM * 7 + $$) % 40000)); }

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

# Every logged step's numbers that must not depend on how a step was split
# (over devices, ranks or plans), one line per step of DIR/metrics.jsonl.
steps() {
  grep '"step":' "$1/metrics.jsonl" | sed -E \
    's/.*("step":[0-9]+).*("loss":[^,]*).*("ce_loss":[^,]*).*("aux_loss":[^,]*).*("grad_norm":[^,]*).*("tokens":[0-9]+).*/\1 \2 \3 \4 \5 \6/'
}

# same_run NAME A B: run directories A and B logged the same per-step numbers,
# SAME_STEPS of them (6 unless set), and saved the same tensor bytes; says
# what differs through fail.  Writes its comparison files into $L.
same_run() {
  local name="$1" a="$2" b="$3" n="${SAME_STEPS:-6}"
  steps "$a" > "$L/$name.a"; steps "$b" > "$L/$name.b"
  if [ "$(wc -l < "$L/$name.a")" != "$n" ]; then fail "$name: $a logged $(wc -l < "$L/$name.a") steps, not $n"; return 1; fi
  if ! cmp -s "$L/$name.a" "$L/$name.b"; then
    fail "$name: per-step numbers differ ($a vs $b):"; diff "$L/$name.a" "$L/$name.b" | head -4; return 1
  fi
  if [ "$(tensor_bytes "$a")" != "$(tensor_bytes "$b")" ]; then fail "$name: final tensor bytes differ"; return 1; fi
  return 0
}

# The run the multi-process tests train (6 steps, K = 2 micro-batches of 3,
# the tiny Mixtral of write_tiny_mixtral 48, already written), as run.yaml in
# the current directory with absolute inputs (so that a rank started in
# another directory reads the same ones), hardware HW copied beside it;
# then `MOETUNE init` creates the checkpoint.  Logs go to $L.
write_ranks_run() {
  local hw="$1" moetune="$2" w="$PWD"
  cp "$hw" hw.yaml || return 1
  cat > run.yaml <<YAML
base_model: $w/models/ckpt
base_model_init: $w/tiny.json
datasets:
  - path: $w/data/train.jsonl
sequence_len: 16
micro_batch_size: 3
gradient_accumulation_steps: 2
max_steps: 6
learning_rate: 1.0e-3
lr_scheduler: cosine
warmup_steps: 2
weight_decay: 0.01
shuffle: true
seed: 11
output_dir: out
backend: cpu
logging_steps: 1
progress: false
hardware: $w/hw.yaml
YAML
  if ! "$moetune" init run.yaml >"$L/init.out" 2>"$L/init.err"; then
    echo "FAIL setup: moetune init"; cat "$L/init.err"; return 1
  fi
}

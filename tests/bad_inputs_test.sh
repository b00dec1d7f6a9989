#!/usr/bin/env bash
# Runs every case of the bad-input corpus (tests/bad_inputs/, written by
# make_cases.py) through the real `moetune` binary and checks, for each:
#   - the exit status is exactly the expected one (1: a handled error; a
#     signal gives 128+N, a hang is killed by timeout and gives 124);
#   - stderr contains the expected substring (the file, key or tensor);
#   - no sanitizer report (ASan / UBSan / LeakSanitizer) in the output;
#   - every file that existed before (the case's own files, the output_dir's
#     earlier contents, the shared checkpoint) is byte-identical afterwards.
# A case whose expect file has a `pending WHY` line is a known gap: its
# result is reported as "pending (known gap)" and does not fail the test,
# but a pending case that now passes is reported so it can be unmarked.
#
#   bad_inputs_test.sh MOETUNE CASES_DIR [CASE...]
set -u

# sha256 of every regular file under the directory, by relative path
snapshot() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha256sum); }

# run_case NAME: runs one case and prints one result line, starting with
# ok / FAIL / pending / PASS-PENDING.
run_case() {
  local name="$1" exp="$CASES/$1/expect"
  local want_exit=1 want_err="" cmd="train run.yaml" fifo="" why="" line key val
  while IFS= read -r line || [ -n "$line" ]; do
    key=${line%% *}; val=${line#* }
    case "$key" in
      exit) want_exit=$val ;;
      stderr) want_err=$val ;;
      cmd) cmd=$val ;;
      fifo) fifo=$val ;;
      pending) why=$val ;;
      "") ;;
      *) echo "FAIL $name: unknown line in expect: $line"; return ;;
    esac
  done < "$exp"

  # Each case runs in its own copy (symlinks to _shared resolved), so that a
  # case that writes where it must not cannot spoil the next one.
  local root="$W/$name" dir before after rc problems changed msg
  mkdir -p "$root"
  cp -RL "$CASES/_shared" "$root/_shared"
  cp -RL "$CASES/$name" "$root/case"
  rm -f "$root/case/expect"
  dir="$root/case"
  # an earlier run's results in output_dir, which a failed run must leave alone
  mkdir -p "$dir/out"
  printf '{"step": 1, "loss": 2.5}\n' > "$dir/out/metrics.jsonl"
  printf 'an earlier run'"'"'s model\n' > "$dir/out/model.safetensors"
  if [ -n "$fifo" ]; then rm -f "$dir/$fifo"; mkfifo "$dir/$fifo"; fi
  before=$(snapshot "$root")

  # A FIFO case gets a shorter limit: with nobody writing to the FIFO, a
  # reader that opens it blocks for ever, and a fixed one fails at once.
  local limit="$PER_CASE_TIMEOUT"
  [ -n "$fifo" ] && [ "$limit" -gt 20 ] && limit=20
  # shellcheck disable=SC2086
  (cd "$dir" && exec timeout -k 2 "$limit" "$MOETUNE" $cmd) >"$root/stdout" 2>"$root/stderr"
  rc=$?
  after=$(snapshot "$root")

  problems=""
  [ "$rc" -eq "$want_exit" ] || problems="$problems; exit status $rc, expected $want_exit$( [ "$rc" -eq 124 ] && echo ' (timed out)')$( [ "$rc" -gt 128 ] && echo " (signal $((rc - 128)))")"
  grep -qF -- "$want_err" "$root/stderr" || problems="$problems; stderr lacks '$want_err'"
  if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: (Address|Undefined|Leak)' "$root/stdout" "$root/stderr"; then
    problems="$problems; sanitizer report"
  fi
  if [ "$before" != "$after" ]; then
    changed=$(diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") | sed -n 's/^< [0-9a-f]*  //p' | tr '\n' ' ')
    [ -n "$changed" ] && problems="$problems; files changed or removed: $changed"
  fi
  msg=$(head -c 240 "$root/stderr" | tr '\n' ' ')
  if [ -n "$why" ]; then
    if [ -z "$problems" ]; then
      echo "PASS-PENDING $name: passes now; remove its 'pending' line ($msg)"
    else
      echo "pending (known gap) $name: ${problems#; } [$why]"
    fi
  elif [ -z "$problems" ]; then
    echo "ok   $name: $msg"
  else
    echo "FAIL $name: ${problems#; }"; echo "     stderr: $msg"
  fi
}

if [ "${1:-}" = "--one" ]; then
  # one case, run by the parallel loop below: --one MOETUNE CASES WORKDIR NAME
  MOETUNE="$2" CASES="$3" W="$4" PER_CASE_TIMEOUT="${BAD_INPUTS_TIMEOUT:-60}"
  run_case "$5" > "$W/$5.result"
  exit 0
fi

MOETUNE="${1:-}"; CASES="${2:-}"; shift 2 || true
[ -x "$MOETUNE" ] && [ -d "$CASES" ] || { echo "usage: bad_inputs_test.sh MOETUNE CASES_DIR [CASE...]"; exit 2; }
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
CASES="$(cd "$CASES" && pwd)"
W="${TEST_TMPDIR:-$(mktemp -d)}/bad_inputs"
rm -rf "$W"; mkdir -p "$W"
if [ "$#" -gt 0 ]; then names="$*"; else
  names=$(cd "$CASES" && for d in */; do d=${d%/}; [ "$d" != _shared ] && [ -f "$d/expect" ] && echo "$d"; done)
fi

# Cases are independent (each in its own copy), and most of a case's time is
# the binary starting (loading the CUDA libraries), so they run two per core
# (at most 8): more would starve the tests Bazel runs beside this one.
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
jobs="${BAD_INPUTS_JOBS:-$(( $(nproc 2>/dev/null || echo 2) * 2 ))}"
[ "$jobs" -gt 8 ] && jobs=8
printf '%s\n' $names | xargs -P "$jobs" -I{} bash "$self" --one "$MOETUNE" "$CASES" "$W" {}

passed=0; failed=0; pending=0; pending_ok=0
for name in $names; do
  r="$W/$name.result"
  if [ ! -s "$r" ]; then echo "FAIL $name: no result (the runner itself failed)"; failed=$((failed + 1)); continue; fi
  cat "$r"
  case "$(head -c 4 "$r")" in
    "ok  ") passed=$((passed + 1)) ;;
    FAIL) failed=$((failed + 1)) ;;
    pend) pending=$((pending + 1)) ;;
    PASS) pending=$((pending + 1)); pending_ok=$((pending_ok + 1)) ;;
  esac
done

echo "bad_inputs: $passed passed, $failed failed, $pending pending (known gaps; $pending_ok of them pass now)"
[ "$failed" -eq 0 ]

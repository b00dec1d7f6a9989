#!/usr/bin/env bash
# CI job: builds the fuzz harnesses (tools/fuzz/build.sh) and runs each for a
# bounded time on its committed corpus, failing on any finding (crash, leak,
# sanitizer report, timeout, out-of-memory). New inputs go to a scratch
# corpus, never into tools/fuzz/corpus/.
#
#   tools/fuzz/run_ci.sh [HARNESS...]
#     FUZZ_SECONDS  seconds per harness (default 30)
#     FUZZ_WORK     keep the scratch corpora and logs here (default: a temp dir, removed)
#
# Exit status: 0 no findings, 1 a finding (its reproducer is printed and kept
# in FUZZ_WORK), 3 clang's fuzzer runtime is missing (nothing ran).
# The last line of each harness's log is libFuzzer's executed-units count.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
secs="${FUZZ_SECONDS:-30}"
all="fuzz_safetensors fuzz_checkpoint_index fuzz_model_config fuzz_run_config fuzz_data_jsonl fuzz_data_bin fuzz_hw fuzz_trainer_state fuzz_adapter_config"
want="${*:-$all}"
if [ -n "${FUZZ_WORK:-}" ]; then work="$FUZZ_WORK"; mkdir -p "$work"; else work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi
export FUZZ_BUILD="${FUZZ_BUILD:-$work/bin}"

"$root/tools/fuzz/build.sh" $want
rc=$?
if [ "$rc" -eq 3 ]; then exit 3; fi
[ "$rc" -eq 0 ] || { echo "fuzz: build failed"; exit 1; }

findings=0
for h in $want; do
  mkdir -p "$work/corpus/$h" "$work/artifacts/$h"
  log="$work/$h.log"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: a reader
  # that allocates what a header claims instead of what the file holds.
  "$FUZZ_BUILD/$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
      -print_final_stats=1 -artifact_prefix="$work/artifacts/$h/" \
      "$work/corpus/$h" "$root/tools/fuzz/corpus/$h" >"$log" 2>&1
  hrc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$hrc" -ne 0 ] || ls "$work/artifacts/$h"/* >/dev/null 2>&1; then
    findings=$((findings + 1))
    echo "FAIL $h: libFuzzer exit $hrc after ${runs:-?} runs; reproducer(s):"
    ls "$work/artifacts/$h"/ 2>/dev/null | sed "s|^|  $work/artifacts/$h/|"
    grep -E "ERROR|SUMMARY|runtime error|#[0-9]+ 0x" "$log" | head -20
  else
    echo "ok   $h: ${runs:-?} runs in ${secs}s, no findings"
  fi
done
[ "$findings" -eq 0 ]

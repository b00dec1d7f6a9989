#!/usr/bin/env bash
# `moetune bench nvme` on the test's TMPDIR: it prints both raw rates, the
# store's rates with their ratios (one batch at a time, and with 3 batches in
# flight) and which I/O engine ran, leaves nothing behind, and refuses a bad
# command line and a missing directory.
set -u
bin="${1:?usage: nvme_bench_test.sh MOETUNE}"
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/nvme_bench.XXXXXX")
fail=0
out=$("$bin" bench nvme --dir "$dir" --gib 0.0625 --qd 4 2>&1); rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "FAIL: exit $rc"; fail=1; }
for want in "raw O_DIRECT     write qd1" "raw O_DIRECT     read  qd1" "read in recorded order" "lowest store/raw ratio" \
            "store, 3 batches in flight" "lowest store/raw ratio with 3 batches in flight"; do
  grep -qF "$want" <<<"$out" || { echo "FAIL: no '$want'"; fail=1; }
done
grep -qE "store \((io_uring|pread/pwrite)," <<<"$out" || { echo "FAIL: the I/O engine is not named"; fail=1; }
# each pass once per way of running it, with a rate and a ratio
[ "$(grep -cE '^  rewrite +[0-9.]+ GB/s +store/raw [0-9.]+$' <<<"$out")" = 2 ] || { echo "FAIL: not two rewrite lines with ratios"; fail=1; }
[ "$(grep -cE '^  read in recorded order +[0-9.]+ GB/s +store/raw [0-9.]+$' <<<"$out")" = 2 ] || { echo "FAIL: not two recorded-order read lines"; fail=1; }
grep -qE "^lowest store/raw ratio with 3 batches in flight [0-9]+\.[0-9]{2} " <<<"$out" || { echo "FAIL: no pipelined ratio"; fail=1; }
[ -z "$(ls -A "$dir")" ] || { echo "FAIL: left behind: $(ls -A "$dir")"; fail=1; }
out=$("$bin" bench nvme --dir "$dir/missing" --gib 0.01 2>&1); rc=$?
[ "$rc" = 1 ] && grep -qF "$dir/missing" <<<"$out" || { echo "FAIL: missing dir: rc $rc: $out"; fail=1; }
"$bin" bench nvme --gib 1 >/dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || { echo "FAIL: no --dir gave $rc, expected 2"; fail=1; }
psync=$("$bin" bench nvme --dir "$dir" --gib 0.03125 --io psync 2>&1)
grep -qF "store (pread/pwrite," <<<"$psync" || { echo "FAIL: --io psync: $psync"; fail=1; }
rmdir "$dir"
[ "$fail" = 0 ] && echo "nvme_bench_test: all passed"
exit "$fail"

#!/usr/bin/env bash
# `moetune bench step --nvme DIR` on the CPU backend with tiny dims: the
# report's lines (raw rates, both runs with their predictions, the tier's
# own rates against raw), a tier that moved bytes both ways at a positive
# rate, most block loads finding their state read ahead, and nothing left
# in DIR; a DIR that does not exist exits 1 naming it.
set -u
bin="${1:?usage: step_nvme_test.sh MOETUNE}"
T="${TEST_TMPDIR:-$(mktemp -d)}/nvme_step"
rm -rf "$T"; mkdir -p "$T/dir"
export TMPDIR="$T"
fail=0
args=(bench step --layers 2 --hidden 32 --experts 4 --topk 2 --expert-width 48 --vocab 64 --seq 16 --batch 2
      --steps 2 --link-gbps 2)
out=$("$bin" "${args[@]}" --nvme "$T/dir" 2>&1); rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "FAIL: exit $rc"; fail=1; }
for want in "raw O_DIRECT, 1 MiB requests at queue depth 8: read" "host memory " "AdamW state on NVMe " \
            "the tier per step: "; do
  grep -qF "$want" <<<"$out" || { echo "FAIL: no '$want'"; fail=1; }
done
# MB read and written per step, each at a positive rate
grep -qE "the tier per step: [0-9.]*[1-9][0-9.]* MB read, the optimizer waiting" <<<"$out" &&
  grep -qE "^ +[0-9.]*[1-9][0-9.]* MB written, waiting [0-9.]+ ms \([0-9.]*[1-9][0-9.]* GB/s" <<<"$out" \
  || { echo "FAIL: the tier moved nothing: $(grep 'tier per step' <<<"$out")"; fail=1; }
[ -z "$(ls -A "$T/dir")" ] || { echo "FAIL: left in the directory: $(ls -A "$T/dir")"; fail=1; }
json=$("$bin" "${args[@]}" --nvme "$T/dir" --json 2>/dev/null | grep '^{' | tail -1)
python3 - "$json" <<'PY' || fail=1
import json, sys
r = json.loads(sys.argv[1])
assert r["tier_read_bytes"] > 0 and r["tier_write_bytes"] > 0, r
# the backward updates blocks in descending order, each block's state read
# ahead while the one after it updates: all but each step's first load
assert r["tier_loads"] > 0 and 2 * r["tier_loads_read_ahead"] >= r["tier_loads"], r
assert r["nvme_step_s"] > 0 and r["host_step_s"] > 0 and r["nvme_predicted_s"] > 0, r
assert r["raw_read_bytes_per_s"] > 0 and r["raw_write_bytes_per_s"] > 0, r
print("json ok")
PY
# bf16: masters on the tier too, predicted from a keep_all step profiled in bf16; and a run with the
# weights' homes there as well
json=$("$bin" "${args[@]}" --nvme "$T/dir" --precision-dtype bf16 --json 2>/dev/null | grep '^{' | tail -1)
python3 - "$json" <<'PY' || fail=1
import json, sys
r = json.loads(sys.argv[1])
assert r["tier_read_bytes"] > 0 and r["nvme_step_s"] > 0 and r["nvme_predicted_s"] > 0, r
# the third run: the decoder layers' bf16 working copies on the tier too,
# read by every fetch into staging: more read than the state alone
assert r["weights_step_s"] > 0 and r["weights_predicted_s"] > 0, r
assert r["weights_read_bytes"] > r["tier_read_bytes"], r
print("bf16 json ok")
PY
out=$("$bin" "${args[@]}" --nvme "$T/missing" 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "$T/missing" <<<"$out" || { echo "FAIL: a missing directory: exit $rc: $out"; fail=1; }
[ "$fail" = 0 ] && echo PASS
exit "$fail"

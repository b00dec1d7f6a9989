#!/usr/bin/env bash
# `moetune bench step --mfu` on the CPU backend with tiny dims: one JSON line
# whose model FLOPs per token equal the formula computed here by hand
# (docs/benchmarks.md), each plan's tokens/s, TFLOP/s and MFU consistent with
# its step time, a prediction beside it; the text table; and --backend cuda
# without a usable GPU exits 1 naming the reason.
set -u
bin="${1:?usage: step_mfu_test.sh MOETUNE}"
export TMPDIR="${TEST_TMPDIR:-/tmp}"
fail=0
# V 64, H 32, L 2, heads 8/4 (the defaults) of dim 4, E 4 top-2 of width 48, T 16, B 2
args=(bench step --mfu --backend cpu --layers 2 --hidden 32 --experts 4 --topk 2
      --expert-width 48 --vocab 64 --seq 16 --batch 2 --steps 3)
# one micro-batch per step, then three (--accum): a step's tokens are all of its micro-batches'
for K in 1 3; do
json=$("$bin" "${args[@]}" --accum "$K" --json 2>&1); rc=$?
echo "$json"
[ "$rc" = 0 ] || { echo "FAIL: exit $rc"; fail=1; }
line=$(grep '^{' <<<"$json" | tail -1)
python3 - "$line" "$K" <<'PY' || fail=1
import json, sys
r = json.loads(sys.argv[1])
H, L, nh, nkv, hd, E, k, I, V, T, B = 32, 2, 8, 4, 4, 4, 2, 48, 64, 16, 2
K = int(sys.argv[2])
B *= K  # tokens per step
t_avg = (T + 1) / 2
layer = 2*H*nh*hd + 2*2*H*nkv*hd + 2*nh*hd*H + 2*2*t_avg*nh*hd + 2*H*E + k*3*2*H*I
want = 3 * (L*layer + 2*H*V)
bad = []
if abs(r["model_flops_per_token"] - want) > 1e-9 * want: bad.append(f"flops/token {r['model_flops_per_token']} != {want}")
names = [p["plan"] for p in r["plans"]]
if names[:2] != ["keep_all", "offload_all (overlapped)"]: bad.append(f"plans {names}")
for p in r["plans"]:
    if not p["ok"] or not p["step_s"] > 0: bad.append(f"{p['plan']} failed"); continue
    if abs(p["tokens_per_s"] * p["step_s"] - B*T) > 1e-6 * B*T: bad.append(f"{p['plan']}: tokens/s")
    if abs(p["achieved_flops"] - want*B*T/p["step_s"]) > 1e-6 * p["achieved_flops"]: bad.append(f"{p['plan']}: FLOP/s")
    if abs(p["mfu"] - p["achieved_flops"]/r["peak_flops"]) > 1e-6 * p["mfu"]: bad.append(f"{p['plan']}: mfu")
    if not (0 < p["mfu"] < 1.5): bad.append(f"{p['plan']}: mfu {p['mfu']}")
    if not p["predicted_step_s"] > 0: bad.append(f"{p['plan']}: no prediction")
if r["backend"] != "cpu" or r["compute"] != "fp32": bad.append("backend/compute")
if r.get("profile") != "calibrated-cpu": bad.append(f"profile {r.get('profile')}: the cpu predicts from this machine's calibration")
if r.get("micro_batches_per_step") != K or r.get("tokens_per_step") != B*T: bad.append(f"{K} micro-batches: step of {r.get('tokens_per_step')} tokens")
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
done
text=$("$bin" "${args[@]}" --precision-dtype bf16 2>&1); rc=$?
echo "$text"
[ "$rc" = 0 ] || { echo "FAIL: text run exit $rc"; fail=1; }
for want in "model FLOPs per token:" "peak:" "keep_all" "offload_all (overlapped)" "meas/pred" "compute bf16"; do
  grep -qF "$want" <<<"$text" || { echo "FAIL: no '$want' in the text report"; fail=1; }
done
# tiny dims, so that where a GPU is usable this is a short run that must report
out=$("$bin" "${args[@]/cpu/cuda}" 2>&1); rc=$?
if [ "$rc" = 1 ]; then
  grep -qF -- "--backend cuda needs a usable GPU" <<<"$out" || { echo "FAIL: no reason given: $out"; fail=1; }
elif [ "$rc" = 0 ]; then
  echo "a GPU is usable here: --backend cuda ran"
  grep -qF "the device profile's dense bf16 peak" <<<"$out" || { echo "FAIL: cuda report without its peak"; fail=1; }
else
  echo "FAIL: --backend cuda gave exit $rc: $out"; fail=1
fi
# --hw calibrate measures the GPU before the runs: without one, exit 1 with the reason
out=$("$bin" "${args[@]/cpu/cuda}" --hw calibrate 2>&1); rc=$?
if [ "$rc" = 1 ]; then
  grep -qiE "gpu|cuda" <<<"$out" || { echo "FAIL: --hw calibrate without a GPU gave no reason: $out"; fail=1; }
elif [ "$rc" = 0 ]; then
  grep -qF "measured before the runs" <<<"$out" || { echo "FAIL: calibrated cuda report does not say so"; fail=1; }
else
  echo "FAIL: --backend cuda --hw calibrate gave exit $rc: $out"; fail=1
fi
"$bin" bench step --geometry nope >/dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || { echo "FAIL: unknown geometry gave $rc, expected 2"; fail=1; }
"$bin" bench step --backend tpu >/dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || { echo "FAIL: unknown backend gave $rc, expected 2"; fail=1; }
[ -z "$(ls -A "$TMPDIR" | grep moetune-bench-step)" ] || { echo "FAIL: checkpoint left behind"; fail=1; }
[ "$fail" = 0 ] && echo "step_mfu_test: all passed"
exit "$fail"

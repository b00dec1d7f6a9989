#!/usr/bin/env bash
# QLoRA against transformers + PEFT (fixtures by tests/reference/make_qlora_family_fixtures.py):
# for every family's tiny checkpoint, `load_in_4bit: true` (NF4 or FP4, with
# and without double quantization) trains LoRA adapters over the 4-bit base
# with per-step losses within 1e-5 relative of the reference's (dequantize,
# then fp32 LoRA), which lie 3e-4 to 5e-3 away from the unquantized base's.
# The saved adapter is PEFT's format and the base is not written.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
T="${TEST_TMPDIR:-$(mktemp -d)}/qlora"
rm -rf "$T"; mkdir -p "$T"

for fix in tests/fixtures/qlora_*; do
  fam=${fix#tests/fixtures/qlora_}
  out="$T/$fam"
  if ! "$MOETUNE" train "$fix/run.yaml" --set "output_dir=$out" > "$T/$fam.log" 2>&1; then
    fail "$fam: moetune train failed:"; tail -n 5 "$T/$fam.log"; continue
  fi
  if cmp=$(python3 - "$fix/expected.json" "$out/metrics.jsonl" <<'PY'
import json, sys
exp = json.load(open(sys.argv[1]))
got = [json.loads(l)["loss"] for l in open(sys.argv[2]) if '"loss"' in l and '"step"' in l]
ref, plain = exp["losses"], exp["first_loss_unquantized"]
if len(got) != len(ref):
    sys.exit(f"{len(got)} steps logged, {len(ref)} expected")
worst = max(abs(g - r) / abs(r) for g, r in zip(got, ref))
if worst > 1e-5:
    sys.exit("losses " + " ".join(f"{g:.7f}" for g in got) + " vs " + " ".join(f"{r:.7f}" for r in ref))
print(f"{len(got)} losses within {worst:.1e} of the reference "
      f"({exp['bnb_4bit_quant_type']}{', double quant' if exp['bnb_4bit_use_double_quant'] else ''}; "
      f"unquantized first loss {abs(got[0] - plain) / plain:.1e} away)")
PY
  ); then ok "$fam: $cmp"; else fail "$fam: $cmp"; fi
  if [ ! -f "$out/adapter_model.safetensors" ] || [ -f "$out/model.safetensors" ]; then
    fail "$fam: expected the adapter alone in $out"; ls "$out"
  fi
done
[ "$failures" -eq 0 ] && echo "qlora_families_test: all ok"
exit $((failures > 0))

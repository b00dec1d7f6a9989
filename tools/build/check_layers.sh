#!/usr/bin/env bash
# The dependency-graph half of the layering rules (the source-text half is
# //tests:layering_test, which cannot run `bazel query` inside a test):
#
#   (a) no target under //engine depends directly on a kernel backend
#       (//kernels/cpu/..., //kernels/cuda/...): the engine reaches kernels
#       through //kernels:device and asks it for capabilities;
#   (b) nothing under //scheduler or //moe depends, even transitively, on
#       //engine;
#   (c) nothing in the //kernels package itself depends, even transitively,
#       on the CUDA backend (//kernels/cuda/...): the device layer names no
#       backend, backends register themselves where a program links them
#       (kernels/backend_registry.h), so //kernels builds, links and tests
#       without the CUDA toolkit;
#   (d) Bazel itself refuses an upward dependency between the engine's
#       packages: a throw-away package inside engine/layers that depends on
#       //engine/exec, and one inside engine/exec that depends on
#       //engine/run, must both fail analysis with "is not visible" (the
#       visibility lists in engine/*/BUILD are what enforce the layering).
#
# Run from anywhere inside the workspace. Prints what it checked and the
# offending labels; exits 1 on a violation, 2 if bazel query itself fails.
set -u
cd "$(dirname "$0")/../.." || exit 2
failures=0

direct=$(bazel query --noshow_progress 'labels(deps, //engine/...)' 2>/dev/null) ||
  { echo "check_layers: bazel query 'labels(deps, //engine/...)' failed"; exit 2; }
bad=$(printf '%s\n' "$direct" | grep -E '^//kernels/(cpu|cuda)([:/]|$)' || true)
if [ -n "$bad" ]; then
  echo "FAIL (a) engine targets depend directly on a kernel backend:"
  for label in $bad; do
    bazel query --noshow_progress "rdeps(//engine/..., $label, 1) intersect //engine/..." 2>/dev/null |
      sed "s|^|  |; s|\$| -> $label|"
  done
  failures=$((failures + 1))
else
  echo "ok   (a) no //engine target depends directly on //kernels/cpu or //kernels/cuda ($(printf '%s\n' "$direct" | grep -c .) direct deps)"
fi

for pkg in scheduler moe; do
  up=$(bazel query --noshow_progress "deps(//$pkg/...) intersect //engine/..." 2>/dev/null) ||
    { echo "check_layers: bazel query 'deps(//$pkg/...) intersect //engine/...' failed"; exit 2; }
  if [ -n "$up" ]; then
    echo "FAIL (b) //$pkg depends on the engine:"
    printf '%s\n' "$up" | sed 's/^/  /'
    bazel query --noshow_progress "somepath(//$pkg/..., $(printf '%s\n' "$up" | head -1))" 2>/dev/null | sed 's/^/  path: /'
    failures=$((failures + 1))
  else
    echo "ok   (b) nothing under //$pkg depends on //engine"
  fi
done

below=$(bazel query --noshow_progress 'deps(//kernels:all)' 2>/dev/null) ||
  { echo "check_layers: bazel query 'deps(//kernels:all)' failed"; exit 2; }
bad=$(printf '%s\n' "$below" | grep -E '^//kernels/cuda([:/]|$)' || true)
if [ -n "$bad" ]; then
  echo "FAIL (c) the //kernels package depends on the CUDA backend:"
  printf '%s\n' "$bad" | sed 's/^/  /'
  bazel query --noshow_progress "somepath(//kernels:all, $(printf '%s\n' "$bad" | head -1))" 2>/dev/null | sed 's/^/  path: /'
  failures=$((failures + 1))
else
  echo "ok   (c) nothing in //kernels depends on //kernels/cuda ($(printf '%s\n' "$below" | grep -c .) deps)"
fi
# (d) one probe package per forbidden edge, removed whatever happens.
probes=()
trap 'rm -rf "${probes[@]}"' EXIT
probe_refused() { # FROM_DIR TARGET: a package under FROM_DIR naming TARGET must not build
  local dir="$1/visibility_probe" target="$2" out
  probes+=("$dir")
  mkdir -p "$dir"
  printf 'cc_library(name = "probe", deps = ["%s"])\n' "$target" >"$dir/BUILD"
  out=$(bazel build --nobuild --noshow_progress "//${dir}:probe" 2>&1)
  rm -rf "$dir"
  if printf '%s\n' "$out" | grep -q "is not visible"; then
    echo "ok   (d) //$1 may not depend on $2: Bazel refuses it (not visible)"
  else
    echo "FAIL (d) a package under //$1 depending on $2 was not refused by visibility:"
    printf '%s\n' "$out" | tail -5 | sed 's/^/  /'
    failures=$((failures + 1))
  fi
}
# The control: the same probe where visibility admits it (tools/ may use
# the top of the engine) passes analysis, so a refusal below is visibility's
# and not a broken probe.
mkdir -p tools/visibility_probe; probes+=(tools/visibility_probe)
printf 'cc_library(name = "probe", deps = ["//engine/run"])\n' >tools/visibility_probe/BUILD
if bazel build --nobuild --noshow_progress //tools/visibility_probe:probe >/dev/null 2>&1; then
  echo "ok   (d) control: a package under //tools may depend on //engine/run"
else
  echo "FAIL (d) control: the probe naming //engine/run from //tools did not pass analysis"
  failures=$((failures + 1))
fi
rm -rf tools/visibility_probe
probe_refused engine/layers //engine/exec
probe_refused engine/exec //engine/run
probe_refused engine/model/hf //engine/model/desc
[ "$failures" -eq 0 ]

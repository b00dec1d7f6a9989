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
#       without the CUDA toolkit.
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
[ "$failures" -eq 0 ]

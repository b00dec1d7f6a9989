#!/usr/bin/env bash
# Runs tests/layering_check.sh on the real engine/ and scheduler/ sources
# (from the runfiles), then on small made-up trees that break each rule, to
# show that the check fails when it should: a check that always passes would
# prove nothing.
#
#   layering_test.sh CHECK ALLOWLIST
set -u
check="$1"; allow="$2"
# The runfiles tree has the workspace layout: engine/, scheduler/, moe/ (their
# filegroups are data of this test) sit beside tests/, where CHECK is.
root="$(cd "$(dirname "$check")/.." && pwd)"
[ -n "$(find "$root/engine" -name BUILD 2>/dev/null)" ] && [ -f "$root/scheduler/BUILD" ] ||
  { echo "layering_test: no engine/ or scheduler/ under $root"; exit 2; }
failures=0

echo "== the real tree"
bash "$check" "$root" "$allow" || { echo "FAIL the real tree breaks the layering (above)"; failures=$((failures + 1)); }

W="${TEST_TMPDIR:-$(mktemp -d)}/layering"
# fresh: a tiny tree that keeps every rule; a case then breaks one.
fresh() {
  rm -rf "$W"; mkdir -p "$W/engine" "$W/scheduler" "$W/moe"
  printf 'cc_library(name = "a", deps = ["//kernels:device"])\n' >"$W/engine/BUILD"
  printf 'cc_library(name = "plan", deps = ["//base"])\n' >"$W/scheduler/BUILD"
  printf '#include "engine/b.h"\n' >"$W/engine/a.c"
  printf '#include "engine/c.h"\n' >"$W/engine/a.h"
  printf '#include "engine/b.h"\n#include "engine/c.h"\n' >"$W/engine/b.c"
  : >"$W/engine/b.h"; : >"$W/engine/c.h"
  printf '#include "scheduler/plan.h"\n' >"$W/scheduler/plan.c"
  printf 'cc_library(name = "aux_loss", deps = ["//kernels:device"])\n' >"$W/moe/BUILD"
  printf '#include "kernels/device.h"\n' >"$W/moe/aux_loss.c"
  : >"$W/allow"
}
# expect NAME RC PATTERN: the check on $W exits with RC and prints PATTERN.
expect() {
  local name="$1" want="$2" pattern="$3" out rc
  out=$(bash "$check" "$W" "$W/allow" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ] || ! printf '%s\n' "$out" | grep -qE -- "$pattern"; then
    echo "FAIL $name: exit $rc (want $want), output does not match /$pattern/:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

echo "== made-up trees"
fresh
expect "a layered tree passes" 0 "layering: all checks passed"

fresh; printf 'cc_library(name = "a", deps = ["//kernels/cpu:backend"])\n' >"$W/engine/BUILD"
expect "engine BUILD naming the CPU backend fails" 1 "FAIL \(a\) engine BUILD"
fresh; printf 'cc_library(name = "a", deps = ["//kernels/cuda"])\n' >"$W/engine/BUILD"
expect "engine BUILD naming the CUDA backend fails" 1 "FAIL \(a\) engine BUILD"
fresh; printf '#include "kernels/cpu/cpu_backend.h"\n' >>"$W/engine/b.c"
expect "an engine file including a backend header fails" 1 "engine/b.c:3:#include \"kernels/cpu/"

fresh; printf '#include "engine/model/model.h"\n' >>"$W/scheduler/plan.c"
expect "the scheduler including an engine header fails" 1 "scheduler/plan.c:2:#include \"engine/"
fresh; printf 'cc_library(name = "plan", deps = ["//engine:model"])\n' >"$W/scheduler/BUILD"
expect "scheduler/BUILD depending on the engine fails" 1 "FAIL \(b\) scheduler/BUILD"

fresh; printf '#include "engine/exec/exec.h"\n' >>"$W/moe/aux_loss.c"
expect "moe/ including an engine header fails" 1 "moe/aux_loss.c:2:#include \"engine/"
fresh; printf 'cc_library(name = "aux_loss", deps = ["//engine:model"])\n' >"$W/moe/BUILD"
expect "moe/BUILD depending on the engine fails" 1 "FAIL \(d\) moe/BUILD"

# b.c -> c.h, and now c.h -> a.h, a.c -> b.h: a three-module cycle that only
# exists through a .c and its .h counting as one module.
fresh; printf '#include "engine/a.h"\n' >"$W/engine/c.h"
expect "a new include cycle fails and is printed" 1 "FAIL \(c\) include cycle among engine modules: a b c"
expect "the cycle's edges are printed" 1 "c.h includes engine/a.h"
fresh; printf '#include "engine/a.h"\n' >"$W/engine/c.h"; printf 'a b c  # known\n' >"$W/allow"
expect "an allowlisted cycle passes" 0 "known include cycle \(allowlisted\): a b c"
fresh; printf '#include "engine/a.h"\n' >"$W/engine/c.h"; printf 'a b\n' >"$W/allow"
expect "a cycle larger than its allowlist entry fails" 1 "FAIL \(c\) include cycle among engine modules: a b c"
fresh; printf 'a b\n' >"$W/allow"
expect "a stale allowlist entry fails" 1 "allowlisted cycle 'a b' no longer exists"
fresh; printf '#include "engine/a.h"\n' >"$W/engine/a_test.c"; printf '#include "engine/a_test.h"\n' >"$W/engine/c.h"
: >"$W/engine/a_test.h"
expect "a test file is no module (it sits above the code it tests)" 0 "layering: all checks passed"

if [ "$failures" -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "layering_test: all passed"

#!/usr/bin/env bash
# The layering rules that Bazel visibility alone does not enforce, checked on
# the source text (a Bazel test cannot run `bazel query`; the dependency-graph
# half of these rules is tools/build/check_layers.sh, run by .ci/run):
#
#   (a) the engine reaches kernels only through the device interface: no
#       engine BUILD target names //kernels/cpu or //kernels/cuda, and no
#       engine file includes a backend header;
#   (b) the scheduler knows no engine: no `#include "engine/...` under
#       scheduler/ and no //engine label in scheduler/BUILD;
#   (d) moe/ knows no engine either: no `#include "engine/...` under moe/
#       and no //engine label in moe/BUILD (MoE specifics are hooks the
#       executor calls, not callers of the executor);
#   (c) no include cycle among engine/ modules, a module being a .c and its .h
#       (model.c + model.h are one node). A cycle found that is not in the
#       allowlist fails and is printed edge by edge; an allowlisted cycle
#       that no longer exists fails too, so the allowlist cannot go stale.
#
#   layering_check.sh ROOT [ALLOWLIST]
#
# ROOT holds engine/, scheduler/ and moe/ (the workspace, or the test's runfiles).
# ALLOWLIST: one known cycle per line, its modules sorted and separated by
# spaces; '#' starts a comment. Prints what it checked, exits 1 on a
# violation, 2 on bad usage.
set -u
root="${1:-}"
allow="${2:-}"
[ -n "$root" ] && [ -d "$root/engine" ] && [ -d "$root/scheduler" ] && [ -d "$root/moe" ] ||
  { echo "usage: layering_check.sh ROOT [ALLOWLIST] (ROOT must hold engine/, scheduler/ and moe/)"; exit 2; }
[ -z "$allow" ] || [ -f "$allow" ] || { echo "layering_check: no allowlist file $allow"; exit 2; }
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# (a) engine -> backends.
# The engine's files, in every sub-folder (a package each).
engine_builds=$(find "$root/engine" -name BUILD | sort)
engine_srcs=$(find "$root/engine" -name '*.[ch]' | sort)
# shellcheck disable=SC2086
hits=$(grep -nE '//kernels/(cpu|cuda)([:/"]|$)' $engine_builds 2>/dev/null | sed "s|^$root/||")
[ -z "$hits" ] || fail "(a) engine BUILD depends on a backend directly (use //kernels:device):
$hits"
# shellcheck disable=SC2086
hits=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"kernels/(cpu|cuda)/' $engine_srcs 2>/dev/null)
[ -z "$hits" ] || fail "(a) engine includes a backend header (use kernels/device.h):
$hits"
[ "$failures" -eq 0 ] && echo "ok   (a) engine names no backend (BUILD labels, includes)"

# (b) scheduler -> engine.
before=$failures
hits=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"engine/' "$root/scheduler" 2>/dev/null)
[ -z "$hits" ] || fail "(b) scheduler includes engine headers:
$hits"
hits=$(grep -nE '"//engine([:/"]|$)|"//engine"' "$root/scheduler/BUILD" 2>/dev/null)
[ -z "$hits" ] || fail "(b) scheduler/BUILD depends on the engine:
$hits"
[ "$failures" -eq "$before" ] && echo "ok   (b) scheduler includes and depends on no engine code"

# (d) moe -> engine.
before=$failures
hits=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"engine/' "$root/moe" 2>/dev/null)
[ -z "$hits" ] || fail "(d) moe/ includes engine headers:
$hits"
hits=$(grep -nE '"//engine([:/"]|$)|"//engine"' "$root/moe/BUILD" 2>/dev/null)
[ -z "$hits" ] || fail "(d) moe/BUILD depends on the engine:
$hits"
[ "$failures" -eq "$before" ] && echo "ok   (d) moe/ includes and depends on no engine code"

# (c) include cycles among engine modules. Edges: "FROM TO FILE:LINE".
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
# A module is named by its path under engine/ without the extension
# (model/desc/model_desc), so two folders' files of one name stay apart.
for f in $engine_srcs; do
  [ -f "$f" ] || continue
  base="${f#"$root"/engine/}"
  case "$base" in *_test.c) continue ;; esac # tests sit above everything
  from="${base%.*}"
  sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"engine\/([A-Za-z0-9_/]+)\.h".*/\1/p' "$f" |
    while read -r to; do
      [ "$to" = "$from" ] || echo "$from $to $base"
    done
done | sort -u >"$edges"

# Tarjan's strongly connected components; every component of more than one
# module is a cycle. Prints one line per component: "CYCLE m1 m2 ..." (sorted)
# followed by its edges "  FILE includes engine/TO.h".
cycles=$(awk '
  function strong(v,   i, w) {
    idx[v] = low[v] = ++counter; stack[++sp] = v; on[v] = 1
    for (i = 1; i <= nout[v]; i++) {
      w = out[v, i]
      if (!(w in idx)) { strong(w); if (low[w] < low[v]) low[v] = low[w] }
      else if (on[w] && idx[w] < low[v]) low[v] = idx[w]
    }
    if (low[v] == idx[v]) {
      ncomp++; size[ncomp] = 0
      do { w = stack[sp--]; on[w] = 0; comp[w] = ncomp; size[ncomp]++ } while (w != v)
    }
  }
  { out[$1, ++nout[$1]] = $2; node[$1] = 1; node[$2] = 1; from[NR] = $1; to[NR] = $2; file[NR] = $3 }
  END {
    for (v in node) if (!(v in idx)) strong(v)
    for (c = 1; c <= ncomp; c++) {
      if (size[c] < 2) continue
      n = 0
      for (v in node) if (comp[v] == c) members[++n] = v
      for (i = 2; i <= n; i++) {           # insertion sort: a stable name
        x = members[i]
        for (j = i - 1; j >= 1 && members[j] > x; j--) members[j + 1] = members[j]
        members[j + 1] = x
      }
      line = "CYCLE"
      for (i = 1; i <= n; i++) line = line " " members[i]
      print line
      for (e = 1; e <= NR; e++)
        if (comp[from[e]] == c && comp[to[e]] == c)
          printf "  %s includes engine/%s.h\n", file[e], to[e]
    }
  }' "$edges")

allowed=""
if [ -n "$allow" ]; then
  allowed=$(sed -e 's/#.*//' -e 's/[[:space:]]\{1,\}/ /g' -e 's/^ //' -e 's/ $//' "$allow" | grep -v '^$')
fi
before=$failures
found=$(printf '%s\n' "$cycles" | sed -n 's/^CYCLE //p')
while IFS= read -r c; do
  [ -n "$c" ] || continue
  body=$(printf '%s\n' "$cycles" | awk -v c="CYCLE $c" '$0 == c { on = 1; next } /^CYCLE / { on = 0 } on')
  if printf '%s\n' "$allowed" | grep -qxF -- "$c"; then
    echo "note (c) known include cycle (allowlisted): $c"
    printf '%s\n' "$body"
  else
    fail "(c) include cycle among engine modules: $c
$body"
  fi
done <<<"$found"
while IFS= read -r a; do
  [ -n "$a" ] || continue
  printf '%s\n' "$found" | grep -qxF -- "$a" ||
    fail "(c) allowlisted cycle '$a' no longer exists: remove it from $allow"
done <<<"$allowed"
nmod=$(awk '{ print $1; print $2 }' "$edges" | sort -u | wc -l)
nedge=$(wc -l <"$edges")
[ "$failures" -eq "$before" ] &&
  echo "ok   (c) no new include cycle among engine modules ($nmod modules, $nedge edges)"

if [ "$failures" -ne 0 ]; then echo "$failures layering violation(s)"; exit 1; fi
echo "layering: all checks passed"

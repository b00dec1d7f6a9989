#!/usr/bin/env bash
# Checks that CUDA objects (or binaries) carry device code for every target
# architecture of tools/build/cuda.bzl: SASS for sm_80 and sm_90 and PTX for
# compute_90.  This machine's toolkit has no cuobjdump, so the check reads
# the ELF section table (.nv_fatbin present = device code embedded) and the
# architecture names the fatbinary stores as text.
#
#   tools/build/check_cuda_arch.sh            # every CUDA object the build made
#   tools/build/check_cuda_arch.sh a.o b.o    # the given files
#
# With no arguments it looks under bazel-out/*/bin/kernels/cuda/_cuda_objs
# (every configuration, since bazel-bin follows the last build's flags).
#
# Prints one line per file and exits non-zero if any file lacks an arch.
set -euo pipefail

want=(sm_80 sm_90 compute_90)

if [ $# -eq 0 ]; then
    root=$(cd "$(dirname "$0")/../.." && pwd)
    mapfile -t files < <(find -L "$root"/bazel-out/*/bin/kernels/cuda/_cuda_objs -name '*.o' 2>/dev/null | sort)
    if [ ${#files[@]} -eq 0 ]; then
        echo "check_cuda_arch: no objects under bazel-out/*/bin/kernels/cuda/_cuda_objs;" \
             "run: bazel build //kernels/cuda/..." >&2
        exit 2
    fi
else
    files=("$@")
fi

fail=0
for f in "${files[@]}"; do
    if [ ! -r "$f" ]; then
        echo "FAIL $f: cannot read"
        fail=1
        continue
    fi
    sections=$(readelf -S "$f" 2>/dev/null || true)
    if ! grep -q '\.nv_fatbin' <<<"$sections"; then
        echo "FAIL $f: no .nv_fatbin section (no device code)"
        fail=1
        continue
    fi
    have=$(strings -a "$f" | grep -oE '\b(sm|compute)_[0-9]+[a-z]?\b' | sort -u | tr '\n' ' ')
    missing=()
    for a in "${want[@]}"; do
        grep -qw "$a" <<<"$have" || missing+=("$a")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "FAIL $f: missing ${missing[*]} (has: $have)"
        fail=1
    else
        echo "ok   $f: $have"
    fi
done
exit $fail

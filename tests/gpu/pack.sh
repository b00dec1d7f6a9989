#!/bin/bash
# Packs the GPU suite and moetune, with the shared libraries they need
# beside the CUDA toolkit's, into one folder (default .gpu/, ignore it in
# git) for a GPU machine that has the CUDA 13 runtime but no Bazel and no
# Debian packages.  There, from the repository root: bash .gpu/run.sh
# (each test's output goes to $OUT/suite.log or /tmp/suite.log), then
# bash .gpu/bench.sh (the MFU and streamed-plan benchmarks, about 5 minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-.gpu}
# the targets of the GPU suite, as tests/gpu/BUILD's gpu_suite lists them
tests=$(sed -n '/name = "gpu_suite"/,/^    \],/p' tests/gpu/BUILD | grep -o '":[a-z0-9_]*"' | tr -d '":' | tr '\n' ' ')
[ -n "$tests" ] || { echo "pack.sh: no gpu_suite targets found in tests/gpu/BUILD" >&2; exit 1; }
bazel build //tools:moetune //tools/profile:libmoetune_cupti_trace.so $(for t in $tests; do echo "//tests/gpu:$t"; done)
rm -rf "$dest/bin" "$dest/lib"
mkdir -p "$dest/bin" "$dest/lib"
for t in $tests; do cp -L "bazel-bin/tests/gpu/$t" "$dest/bin/"; done
cp -L bazel-bin/tools/moetune "$dest/bin/"
# the kernel-level profile (docs/gpu.md, "Profiling a step"): CUDA_INJECTION64_PATH=$G/lib/libmoetune_cupti_trace.so
cp -L bazel-bin/tools/profile/libmoetune_cupti_trace.so "$dest/lib/"
cp -L bazel-bin/_solib_k8/*.so "$dest/lib/"
# the Debian libraries the binaries link, as ldd finds them (Open MPI's
# among them since moetune can run as an mpirun rank), but the C runtime
# every machine has and the CUDA toolkit's; OpenBLAS compressed (36 MB)
for l in $(ldd "$dest"/bin/* 2>/dev/null | awk '$3 ~ "^/(usr/)?lib/x86_64-linux-gnu/" {print $3}' | sort -u); do
    case "$(basename "$l")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*) continue ;;
    libopenblas.so.0) xz -T0 -c "$(readlink -f "$l")" > "$dest/lib/libopenblas.so.0.xz" ;;
    *) cp -L "$l" "$dest/lib/" ;;
    esac
done
[ -f "$dest/lib/libopenblas.so.0.xz" ] || { echo "pack.sh: the binaries do not link OpenBLAS?" >&2; exit 1; }
# the fixtures tests/gpu/BUILD gives train_cpu_vs_cuda_test
sed -n '/name = "train_cpu_vs_cuda_test"/,/^    \],/p' tests/gpu/BUILD | grep -o 'tests/fixtures/[a-z0-9_]*' |
    tr '\n' ' ' > "$dest/train_cpu_vs_cuda_args"
chmod -R u+w "$dest"
# what run.sh and bench.sh both need, sourced with G set to .gpu's path
cat > "$dest/env.sh" <<'ENV'
[ -f "$G/lib/libopenblas.so.0" ] || xz -dk "$G/lib/libopenblas.so.0.xz"
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64
# cuDNN (kernels/cudnn) where the toolkit has none: a pip-installed
# nvidia-cudnn in the torch venv or python3's site-packages, if one is there
for py in /opt/torch/.venv/bin/python3 python3; do
    d=$("$py" -c "import nvidia.cudnn as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null) || continue
    [ -d "$d" ] && { export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; break; }
done
ENV
cat > "$dest/run.sh" <<'RUN'
#!/bin/bash
# The packed GPU suite; TESTS="a b" runs some.  A failing test is run again
# with MOETUNE_CUDA_SYNC=1, which reports a fault at the kernel causing it.
cd "$(dirname "$0")/.." || exit 1
G=$(cd "$(dirname "$0")" && pwd)
. "$G/env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
log=${OUT:-/tmp}/suite.log
: > "$log"
pass=0 fail=0 skip=0
for t in ${TESTS:-$(ls "$G/bin" | grep _test)}; do
    args=""
    [ "$t" = train_cpu_vs_cuda_test ] && args="$(cat "$G/train_cpu_vs_cuda_args")"
    # a shell test drives the packed moetune (tests/gpu/BUILD gives it these)
    [ "$t" = train_two_gpu_test ] && args="$G/bin/moetune configs/hw/h100-sxm.yaml"
    echo "==== $t" >> "$log"
    : > "$log.one"
    if timeout 300 "$G/bin/$t" $args > "$log.one" 2>&1; then
        # a test that exits 0 with SKIPPED as its last word did not run (one GPU where it needs two)
        if tail -n 1 "$log.one" | grep -q "^SKIPPED"; then skip=$((skip + 1)); echo "$t skipped"
        else pass=$((pass + 1)); echo "$t passed"; fi
        cat "$log.one" >> "$log"
    else
        cat "$log.one" >> "$log"
        fail=$((fail + 1)); echo "$t FAILED"
        echo "==== $t again with MOETUNE_CUDA_SYNC=1" >> "$log"
        MOETUNE_CUDA_SYNC=1 timeout 300 "$G/bin/$t" $args >> "$log" 2>&1
    fi
done
grep "^FAIL\|^SKIPPED\|FALLBACK\|^bench \|^moetune: attention" "$log" | head -60
rm -f "$log.one"
echo "$pass passed, $fail failed, $skip skipped"
RUN
cat > "$dest/bench.sh" <<'BENCH'
#!/bin/bash
# The packed GPU benchmarks, after the suite: the MFU bench's keep_all step
# at both geometries with 1 and 8 micro-batches per step (the first
# profiled: kernels and runtime calls by time, $OUT/profile_*.txt), then
# the streamed plans against their prediction from a calibration of this
# GPU and host.  Each result goes to $OUT (or /tmp) as it comes, so a
# command cut short still leaves what ran.
cd "$(dirname "$0")/.." || exit 1
G=$(cd "$(dirname "$0")" && pwd)
. "$G/env.sh"
out=${OUT:-/tmp}
# the synthetic checkpoints (5-6 GB) in memory when there is room
free_shm=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
[ "${free_shm:-0}" -gt 20 ] && export TMPDIR=/dev/shm
bench() { # name seconds args...
    local name=$1 secs=$2
    shift 2
    echo "== $name ($(date +%T))"
    timeout "$secs" "$G/bin/moetune" bench step --backend cuda --steps 4 --precision-dtype bf16 "$@" \
        > "$out/bench_$name.txt" 2>&1
    echo "exit $?" >> "$out/bench_$name.txt"
    grep -A3 "^plan" "$out/bench_$name.txt"
}
for geo in qwen3-30b-a3b mixtral-8x7b; do
    CUDA_INJECTION64_PATH=$G/lib/libmoetune_cupti_trace.so MOETUNE_PROFILE_OUT=$out/profile_$geo.txt \
        bench "${geo}_accum1" 90 --geometry "$geo" --hw h200 --keep-all-only
    bench "${geo}_accum8" 90 --geometry "$geo" --hw h200 --keep-all-only --accum 8
done
bench mixtral-8x7b_streamed 180 --geometry mixtral-8x7b --hw calibrate --budget-gib 24
BENCH
chmod +x "$dest/bench.sh"
du -sh "$dest"

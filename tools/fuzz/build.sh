#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang, outside Bazel (the normal build
# is gcc; libFuzzer needs clang's -fsanitize=fuzzer), so `bazel test //...`
# is unaffected. Each harness is linked with ASan and UBSan against the
# reader's own .c files and base/; jansson and libyaml come from Debian.
#
#   tools/fuzz/build.sh [HARNESS...]     (default: all; binaries in $FUZZ_BUILD,
#                                         default tools/fuzz/build-out/)
# Exits 3 when clang or its fuzzer runtime is missing, so CI can skip.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${FUZZ_BUILD:-$root/tools/fuzz/build-out}"
CC="${CC_FUZZ:-clang}"

if ! command -v "$CC" >/dev/null 2>&1; then
  echo "fuzz build: $CC not found (apt-get install clang)" >&2; exit 3
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { (void)d; (void)n; return 0; }' \
     | "$CC" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
  echo "fuzz build: $CC cannot link -fsanitize=fuzzer (libclang_rt.fuzzer missing)" >&2; exit 3
fi

# every base/ source (the bottom layer, small; the linker keeps what is used)
base="$(cd "$root" && ls base/*.c | grep -v '_test\.c$' | tr '\n' ' ')"
# every file of the model description and config.json libraries
# (engine/model/desc, engine/model/hf), so a new family's file is picked up
# without an edit here; the description's step program and RoPE tables
# (program.c, rope_tables.c) need the scheduler and kernels, which no
# harness reaches; the description asks kernels/attention_tc.c which
# attention shapes the tensor-core path takes (a pure function)
desc="$(cd "$root" && ls engine/model/desc/*.c | grep -vE '_test\.c$|/(program|rope_tables)\.c$' | tr '\n' ' ') scheduler/registry.c kernels/attention_tc.c"
mcfg="$(cd "$root" && ls engine/model/hf/*.c | grep -v '_test\.c$' | tr '\n' ' ')"
rcfg="$(cd "$root" && ls engine/config/*.c | grep -v '_test\.c$' | tr '\n' ' ')"
util="tools/fuzz/fuzz_util.c"
# the data package and what it reads text with (run config's dataset
# entries, the tokenizer, the chat template)
data="$(cd "$root" && ls engine/data/*.c text/tokenizer/*.c text/jinja/*.c | grep -v '_test\.c$' | tr '\n' ' ') $rcfg"
# harness: its sources beside the harness file itself
declare -A srcs=(
  [fuzz_safetensors]="engine/model/io/safetensors.c $util"
  [fuzz_checkpoint_index]="engine/model/io/checkpoint.c engine/model/io/bnb4.c engine/model/io/outdir.c engine/model/io/safetensors.c $mcfg $desc $util"
  [fuzz_model_config]="$mcfg $desc $util"
  [fuzz_run_config]="$rcfg $util"
  [fuzz_data_jsonl]="$data tools/fuzz/fuzz_data_common.c $util"
  [fuzz_data_bin]="$data tools/fuzz/fuzz_data_common.c $util"
  [fuzz_hw]="scheduler/hw.c"
  [fuzz_trainer_state]="engine/run/state_json.c $util"
  [fuzz_adapter_config]="engine/model/lora/config.c engine/model/lora/targets.c engine/model/io/safetensors.c $desc $util"
)
all="fuzz_safetensors fuzz_checkpoint_index fuzz_model_config fuzz_run_config fuzz_data_jsonl fuzz_data_bin fuzz_hw fuzz_trainer_state fuzz_adapter_config"
want="${*:-$all}"

mkdir -p "$out"
cd "$root"
for h in $want; do
  [ -n "${srcs[$h]+x}" ] || { echo "fuzz build: unknown harness $h (one of: $all)" >&2; exit 2; }
  # shellcheck disable=SC2086
  "$CC" -std=c17 -D_GNU_SOURCE -g -O1 -march=x86-64-v2 -fno-omit-frame-pointer \
    -Wall -Wextra -Werror -Wno-unused-command-line-argument \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I. "tools/fuzz/$h.c" ${srcs[$h]} $base \
    -ljansson -lyaml -lpcre2-8 -lutf8proc -lm -lpthread -o "$out/$h"
  echo "built $out/$h"
done

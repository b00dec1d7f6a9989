#!/usr/bin/env bash
# The NVMe tier (memory.nvme) on the real `moetune` binary with a tiny
# Mixtral under the host-optimizer plan, its host memory (memory.host)
# too small for the whole optimizer state, so the plan keeps some of it on
# NVMe:
#   1. a run with the host AdamW state in the store trains bit-identically to
#      the same run in host memory: per-step losses, the final tensors, the
#      loader's digest, and checkpoint-7's optimizer.safetensors; the store
#      directory is empty afterwards; in bf16, with a host budget below the
#      optimizer state, the fp32 masters go to the store too, likewise
#      bit-identical, and resume across it; without clipping (AdamW
#      overlapping the backward, each updated block's gradient pages let
#      go), on wider experts, bit-identical too; lower still, two layers' bf16
#      working copies too, streamed from the store (bit-identical, resumed,
#      a corrupted working copy named); with host memory to spare the
#      plan leaves the tier unused; a profile without an nvme: section gets
#      the directory measured;
#   1b. LoRA with a host budget below the frozen base: the base's homes go
#      to the tier (base.bin) and every fetch reads them from there, in
#      bf16, in fp32 and with an NF4-quantised base (QLoRA): per-step
#      losses, the saved adapter, checkpoint-7's optimizer state and the
#      merged model (merge_lora, which reads the base from the tier) the
#      same bytes as the run in host memory; resumed across the tier; a
#      corrupted base home named;
#   2. stopped at a checkpoint and resumed with the tier = the uninterrupted
#      run; its checkpoint also resumes without the tier (the state is
#      plan-free);
#   3. kill -9 mid-run leaves the killed run's subdirectory; the resumed run
#      names and removes it, makes its own, and still ends as the
#      uninterrupted run;
#   4. random blocks written into the store file under a running run stop
#      it with an error naming the file and offset;
#   5. refusals naming the key and what to do: several devices, an NVMe
#      budget the plan or the store cannot fit in (the directory and both
#      sizes), a directory that does not exist.
set -u
. "$(dirname "$0")/test_lib.sh"
MOETUNE="$1"; DIGEST="$2"; HW="$3"
for b in "$MOETUNE" "$DIGEST"; do [ -x "$b" ] || { echo "usage: nvme_train_test.sh MOETUNE CKPT_DIGEST HW.yaml"; exit 2; }; done
HW="$(cd "$(dirname "$HW")" && pwd)/$(basename "$HW")"
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
DIGEST="$(cd "$(dirname "$DIGEST")" && pwd)/$(basename "$DIGEST")"
T="${TEST_TMPDIR:-$(mktemp -d)}/nvme"
rm -rf "$T"; mkdir -p "$T/w" "$T/logs"; cd "$T/w" || exit 2
L="$T/logs"

write_tiny_mixtral 40
cp "$HW" hw_plain.yaml || exit 2
# the array's rates given, so every run plans the same (training measures
# the directory where a profile has none: checked once below)
{ cat hw_plain.yaml; printf 'nvme:\n  read: 1GB/s\n  write: 1GB/s\n  queue_depth: 8\n'; } > hw.yaml
cat > run.yaml <<'YAML'
base_model: models/ckpt
base_model_init: tiny.json
datasets:
  - path: data/train.jsonl
sequence_len: 16
micro_batch_size: 3
gradient_accumulation_steps: 2
max_steps: 16
learning_rate: 1.0e-3
lr_scheduler: cosine
warmup_steps: 3
weight_decay: 0.01
shuffle: true
seed: 11
output_dir: out
backend: cpu
logging_steps: 1
progress: false
hardware: hw.yaml
scheduler:
  optimizer: host
YAML
if ! "$MOETUNE" init run.yaml >"$L/init.out" 2>"$L/init.err"; then
  echo "FAIL setup: moetune init"; cat "$L/init.err"; exit 1
fi
mkdir -p nvd
# the optimizer state of this model is 371 KiB of the plan's 743 KiB of host
# memory in fp32 (moments only: the master is the weights' home), 547 of
# 831 KiB in bf16 (with fp32 masters beside bf16 working copies)
NV="--set memory.nvme.path=nvd --set memory.host=600KiB"
NV16="--set memory.nvme.path=nvd --set memory.host=540KiB --set bf16=true"
NVW="--set memory.nvme.path=nvd --set memory.host=500KiB --set bf16=true"

# tensors of DIR/FILE after its header (the header holds the save's id)
body() { local f="$1" n; n=$(od -An -tu8 -N8 "$f" | tr -d ' '); tail -c +$((9 + n)) "$f" | sha256sum | cut -d' ' -f1; }
same_losses() { # NAME REF RES: RES logged every loss REF did, through its last step
  local name="$1" ref="$2" res="$3"
  losses "$ref" > "$L/$name.ref"
  awk '/"run_start"/{n=NR} {l[NR]=$0} END{for(i=n+1;i<=NR;i++) print l[i]}' "$res/metrics.jsonl" \
    | grep -o '"step":[0-9]*,"loss":[-0-9.e]*' > "$L/$name.res"
  [ -s "$L/$name.res" ] || { fail "$name: no step logged"; return 1; }
  grep -qvxFf "$L/$name.ref" "$L/$name.res" && { fail "$name: losses differ:"; grep -vxFf "$L/$name.ref" "$L/$name.res" | head -3; return 1; }
  [ "$(tail -n1 "$L/$name.res")" = "$(tail -n1 "$L/$name.ref")" ] || { fail "$name: did not reach the last step"; return 1; }
}
same_run() { # NAME REF OTHER: every logged loss, the final tensors, the digest
  local name="$1" ref="$2" res="$3"
  same_losses "$name" "$ref" "$res" || return 1
  [ "$(tensor_bytes "$ref")" = "$(tensor_bytes "$res")" ] || { fail "$name: final tensor bytes differ"; return 1; }
  [ "$("$DIGEST" "$ref")" = "$("$DIGEST" "$res")" ] || { fail "$name: the loader's digests differ"; return 1; }
  return 0
}
empty_store() { [ -z "$(ls -A nvd)" ] || { fail "$1: the store directory is not empty: $(ls -A nvd)"; return 1; }; }
# run_corrupting NAME FILE SEEK COUNT ARGS...: a long run into output_dir NAME,
# random 4 KiB blocks written into its store's FILE at block SEEK until it
# stops (never creating FILE once the run has removed it); its exit status in rc
run_corrupting() {
  local name="$1" file="$2" seek="$3" count="$4" pid f; shift 4
  rm -rf "$name"
  "$MOETUNE" train run.yaml --set output_dir="$name" --set max_steps=100000 --set logging_steps=100 "$@" \
    >"$L/$name.out" 2>&1 &
  pid=$!
  for _ in $(seq 1 1000); do
    f=$(ls nvd/moetune-*/"$file" 2>/dev/null | head -n1)
    [ -n "$f" ] && dd if=/dev/urandom of="$f" bs=4096 seek="$seek" count="$count" conv=notrunc,nocreat 2>/dev/null
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  kill -9 $pid 2>/dev/null; wait $pid; rc=$?
}

# --- 1. bit-identical to host memory -----------------------------------------------------
ckpt="--set save_steps=7"
timeout 60 "$MOETUNE" train run.yaml --set output_dir=ref $ckpt >"$L/ref.out" 2>&1 \
  || { fail "the host-memory run failed"; cat "$L/ref.out"; }
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=nv $ckpt $NV >"$L/nv.out" 2>&1 \
  || { fail "the NVMe run failed"; cat "$L/nv.out"; }
grep -qE "NVMe tier: AdamW state of [0-9]+ parameters .*fp32 masters of 0, streamed bf16 weights of 0\) in nvd/moetune-[0-9a-f]{16} through (io_uring|pread/pwrite)" "$L/nv.out" \
  || { fail "no NVMe tier line"; cat "$L/nv.out"; }
grep -qE "plan auto: .*; [1-9][0-9]* keep optimizer state on NVMe" "$L/nv.out" || fail "the plan line names no NVMe block"
same_run plain ref nv && ok "AdamW state on the NVMe tier = in host memory (losses, tensors, digest)"
[ "$(body ref/checkpoint-7/optimizer.safetensors)" = "$(body nv/checkpoint-7/optimizer.safetensors)" ] \
  && ok "checkpoint-7's optimizer.safetensors is the same bytes" || fail "checkpoint-7's optimizer state differs"
empty_store "a finished run" && ok "a finished run leaves the store directory empty"

# without clipping each block's AdamW overlaps the backward, and the tier's
# blocks hand their gradients' pages back once updated (host_optim.c): on
# experts 1024 wide, whose 128 KiB gradients hold whole pages to let go
sed 's/"intermediate_size": 48/"intermediate_size": 1024/' tiny.json > wide.json
WIDE="--set base_model=models/wide --set base_model_init=wide.json --set max_grad_norm=0"
WIDE="$WIDE --set scheduler.weights=stream --set scheduler.grads=host" # gradients land on the host per block
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=ref0 $WIDE >"$L/ref0.out" 2>&1 \
  || { fail "the host-memory run without clipping failed"; cat "$L/ref0.out"; }
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=nv0 $WIDE --set memory.nvme.path=nvd --set memory.host=10MiB \
  >"$L/nv0.out" 2>&1 || { fail "the NVMe run without clipping failed"; cat "$L/nv0.out"; }
grep -qE "NVMe tier: AdamW state of [1-9][0-9]* parameters" "$L/nv0.out" || { fail "no NVMe tier without clipping"; cat "$L/nv0.out"; }
same_run noclip ref0 nv0 && ok "without clipping (AdamW overlapping the backward, gradients let go once updated): NVMe = host memory"
rm -rf nvd/moetune-*

# two (pretend) NUMA nodes: a block whose moments were read from the tier in
# one batch is updated on both nodes at once, with and without clipping
for c in clip noclip; do
  args="$NV"; ref=nv; [ $c = noclip ] && { args="$WIDE --set memory.nvme.path=nvd --set memory.host=10MiB"; ref=nv0; }
  # shellcheck disable=SC2086
  MOETUNE_NUMA_NODES=2 timeout 60 "$MOETUNE" train run.yaml --set output_dir=numa_$c $ckpt $args >"$L/numa_$c.out" 2>&1 \
    || { fail "the NVMe run on two NUMA nodes ($c) failed"; cat "$L/numa_$c.out"; continue; }
  grep -q "host AdamW on 2 NUMA nodes" "$L/numa_$c.out" || { fail "$c: the plan line names no NUMA nodes"; continue; }
  same_run "numa $c" $ref numa_$c && ok "$c: the tier on two NUMA nodes = on one"
  rm -rf nvd/moetune-*
done

# bf16: the fp32 masters leave host memory too (its budget is below the optimizer state)
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=ref16 --set bf16=true $ckpt >"$L/ref16.out" 2>&1 \
  || { fail "the bf16 host-memory run failed"; cat "$L/ref16.out"; }
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=nv16 $ckpt $NV16 >"$L/nv16.out" 2>&1 \
  || { fail "the bf16 NVMe run failed"; cat "$L/nv16.out"; }
grep -qE "NVMe tier: AdamW state of [0-9]+ parameters .*fp32 masters of [1-9][0-9]*, streamed bf16 weights of 0\) in nvd/" "$L/nv16.out" \
  && ok "bf16 with 540 KiB of host memory: fp32 masters on NVMe ($(grep -o 'fp32 masters of [0-9]*' "$L/nv16.out"))" \
  || { fail "no bf16 NVMe tier line with masters"; cat "$L/nv16.out"; }
same_run bf16 ref16 nv16 && ok "bf16 masters and moments on the NVMe tier = in host memory (losses, tensors, digest)"
[ "$(body ref16/checkpoint-7/optimizer.safetensors)" = "$(body nv16/checkpoint-7/optimizer.safetensors)" ] \
  && ok "bf16 checkpoint-7's optimizer.safetensors is the same bytes" || fail "bf16 checkpoint-7's optimizer state differs"
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=res16 $NV16 --set resume_from_checkpoint=nv16/checkpoint-7 \
  >"$L/res16.out" 2>&1 || { fail "the resumed bf16 NVMe run failed"; cat "$L/res16.out"; }
same_run resume16 ref16 res16 && ok "bf16 resumed at step 7 with masters on the tier = uninterrupted"
empty_store "the bf16 runs"

# lower still: streamed layers' weights live on the tier and every fetch reads them from there
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=nvw $ckpt $NVW >"$L/nvw.out" 2>&1 \
  || { fail "the run streaming weights from NVMe failed"; cat "$L/nvw.out"; }
grep -qE "streamed bf16 weights of [1-9][0-9]*\) in nvd/" "$L/nvw.out" && grep -qE "[1-9] their weights' home" "$L/nvw.out" \
  && ok "bf16 with 500 KiB of host memory: $(grep -o 'streamed bf16 weights of [0-9]*' "$L/nvw.out") on NVMe" \
  || { fail "no weights on the NVMe tier"; cat "$L/nvw.out"; }
same_run weights ref16 nvw && ok "weights streamed from the NVMe tier = in host memory (losses, tensors, digest)"
[ "$(body ref16/checkpoint-7/optimizer.safetensors)" = "$(body nvw/checkpoint-7/optimizer.safetensors)" ] \
  && ok "its checkpoint-7's optimizer.safetensors is the same bytes" || fail "its checkpoint-7's optimizer state differs"
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=resw $NVW --set resume_from_checkpoint=nvw/checkpoint-7 \
  >"$L/resw.out" 2>&1 || { fail "the resumed run streaming weights from NVMe failed"; cat "$L/resw.out"; }
same_run resumew ref16 resw && ok "resumed at step 7 with weights on the tier = uninterrupted"
empty_store "the runs streaming weights"
# random blocks written into the weights file: the fetch's read names it
# shellcheck disable=SC2086
run_corrupting corruptw weights.bin 2 1 $NVW
if [ $rc = 1 ] && grep -qE "nvd/moetune-[0-9a-f]{16}/weights.bin: the extent at offset [0-9]+ " "$L/corruptw.out"; then
  ok "a corrupted weights file stops the run naming it: $(grep -o 'weights.bin: the extent at offset [0-9]* [^:]*' "$L/corruptw.out" | head -n1)"
else
  fail "corrupted weights file: exit $rc, $(tail -n1 "$L/corruptw.out")"
fi
rm -rf nvd/moetune-*

# --- 1b. LoRA: the frozen base's homes on the tier ------------------------------------------
# the bf16 base's homes are 160 KiB of the LoRA plan's 394 KiB of host
# memory; at 250 KiB both layers' homes go to NVMe (fp32: 244 of 482 KiB,
# at 300 KiB; NF4: at 200 KiB)
LORA="--set adapter=lora --set lora_target_linear=true --set merge_lora=true"
# same_lora NAME REF RES: every logged loss, the saved adapter's tensors, and
# the merged model's tensors and digest
same_lora() {
  local name="$1" ref="$2" res="$3"
  same_losses "$name" "$ref" "$res" || return 1
  [ "$(body "$ref/adapter_model.safetensors")" = "$(body "$res/adapter_model.safetensors")" ] \
    || { fail "$name: the saved adapters differ"; return 1; }
  [ "$(tensor_bytes "$ref/merged")" = "$(tensor_bytes "$res/merged")" ] || { fail "$name: merged tensor bytes differ"; return 1; }
  [ "$("$DIGEST" "$ref/merged")" = "$("$DIGEST" "$res/merged")" ] || { fail "$name: the merged models' digests differ"; return 1; }
  return 0
}
# lora_pair NAME HOST ARGS...: the LoRA run in host memory and with the tier
# at HOST, the base's homes on NVMe (the summary line counts them), compared
lora_pair() {
  local name="$1" host="$2"; shift 2
  # shellcheck disable=SC2086
  timeout 60 "$MOETUNE" train run.yaml --set output_dir="lref_$name" $ckpt $LORA "$@" >"$L/lref_$name.out" 2>&1 \
    || { fail "the $name LoRA run in host memory failed"; cat "$L/lref_$name.out"; return 1; }
  # shellcheck disable=SC2086
  timeout 60 "$MOETUNE" train run.yaml --set output_dir="lnv_$name" $ckpt $LORA "$@" --set memory.nvme.path=nvd \
    --set memory.host="$host" >"$L/lnv_$name.out" 2>&1 \
    || { fail "the $name LoRA run with the tier failed"; cat "$L/lnv_$name.out"; return 1; }
  if grep -qE "NVMe tier: AdamW state of [0-9]+ parameters .*; frozen base weights of [1-9][0-9]*\) in nvd/" "$L/lnv_$name.out" \
    && grep -qE "[1-9] their weights' home" "$L/lnv_$name.out"; then
    ok "$name LoRA with $host of host memory: $(grep -o 'frozen base weights of [0-9]*' "$L/lnv_$name.out") on NVMe"
  else
    fail "$name LoRA: no frozen base on the NVMe tier"; grep NVMe "$L/lnv_$name.out"; return 1
  fi
  same_lora "lora_$name" "lref_$name" "lnv_$name" \
    && ok "$name LoRA, base read from the tier = in host memory (losses, adapter, merged model)"
  [ "$(body "lref_$name/checkpoint-7/optimizer.safetensors")" = "$(body "lnv_$name/checkpoint-7/optimizer.safetensors")" ] \
    && ok "$name LoRA checkpoint-7's optimizer.safetensors is the same bytes" \
    || fail "$name LoRA checkpoint-7's optimizer state differs"
  empty_store "the $name LoRA run"
}
lora_pair bf16 250KiB --set bf16=true
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=lres_bf16 $LORA --set bf16=true --set memory.nvme.path=nvd \
  --set memory.host=250KiB --set resume_from_checkpoint=lnv_bf16/checkpoint-7 >"$L/lres_bf16.out" 2>&1 \
  || { fail "the resumed LoRA run with the tier failed"; cat "$L/lres_bf16.out"; }
same_lora lora_resume lref_bf16 lres_bf16 && ok "LoRA resumed at step 7 with the base on the tier = uninterrupted"
lora_pair fp32 300KiB
lora_pair nf4 200KiB --set bf16=true --set load_in_4bit=true
# random blocks written into the base's file: the fetch's read names it
# shellcheck disable=SC2086
run_corrupting corruptl base.bin 2 1 $LORA --set bf16=true --set memory.nvme.path=nvd --set memory.host=250KiB
if [ $rc = 1 ] && grep -qE "nvd/moetune-[0-9a-f]{16}/base.bin: the extent at offset [0-9]+ " "$L/corruptl.out"; then
  ok "a corrupted base file stops the run naming it: $(grep -o 'base.bin: the extent at offset [0-9]* [^:]*' "$L/corruptl.out" | head -n1)"
else
  fail "corrupted base file: exit $rc, $(tail -n1 "$L/corruptl.out")"
fi
rm -rf nvd/moetune-*

# host memory to spare: the plan keeps everything there
timeout 60 "$MOETUNE" train run.yaml --set output_dir=spare --set memory.nvme.path=nvd >"$L/spare.out" 2>&1 \
  || { fail "the run with host memory to spare failed"; cat "$L/spare.out"; }
grep -q "NVMe tier: not used: the plan fits host memory" "$L/spare.out" && ok "with host memory to spare the tier is not used" \
  || fail "no 'not used' line: $(grep NVMe "$L/spare.out")"
same_run spare ref spare && empty_store "an unused tier"
# a profile without an nvme: section: the directory is measured
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=measured --set hardware=hw_plain.yaml $NV >"$L/measured.out" 2>&1 \
  || { fail "the run measuring its NVMe directory failed"; cat "$L/measured.out"; }
grep -qE "NVMe tier: nvd measured at [0-9.]+ / [0-9.]+ GB/s read / write" "$L/measured.out" \
  && ok "$(grep -o 'nvd measured at [^(]*' "$L/measured.out")" || fail "no measurement line: $(grep NVMe "$L/measured.out")"
same_run measured ref measured && empty_store "the measuring run"

# --- 2. stop and resume --------------------------------------------------------------------
# shellcheck disable=SC2086
timeout 60 "$MOETUNE" train run.yaml --set output_dir=res $NV --set resume_from_checkpoint=nv/checkpoint-7 \
  >"$L/res.out" 2>&1 || { fail "the resumed NVMe run failed"; cat "$L/res.out"; }
same_run resume ref res && ok "resumed at step 7 with the tier = uninterrupted"
timeout 60 "$MOETUNE" train run.yaml --set output_dir=res_host --set resume_from_checkpoint=nv/checkpoint-7 \
  >"$L/res_host.out" 2>&1 || fail "resuming the NVMe run's checkpoint in host memory failed"
same_run resume_host ref res_host && ok "the NVMe run's checkpoint resumes in host memory = uninterrupted"

# --- 3. kill -9 mid-run ----------------------------------------------------------------------
long="--set max_steps=300 --set save_steps=20"
timeout 120 "$MOETUNE" train run.yaml --set output_dir=ref_long $long >"$L/ref_long.out" 2>&1 || fail "long reference run"
rm -rf killed
# shellcheck disable=SC2086
"$MOETUNE" train run.yaml --set output_dir=killed $long $NV >"$L/killed.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -f killed/checkpoint-40/trainer_state.json ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.02
done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
left=$(ls -d nvd/moetune-* 2>/dev/null)
if [ -z "$left" ] || grep -q "trained 300 steps" "$L/killed.out"; then
  fail "the run finished before kill -9 or left nothing: '$left'"
else
  ok "kill -9 left the killed run's subdirectory ($left)"
  # shellcheck disable=SC2086
  timeout 120 "$MOETUNE" train run.yaml --set output_dir=killed $long $NV --set resume_from_checkpoint=true \
    >"$L/killed_res.out" 2>&1 || { fail "resuming after kill -9 failed"; cat "$L/killed_res.out"; }
  grep -q "removed 1 killed run(s)' leftover files" "$L/killed_res.out" \
    && ok "the next run named and removed the killed run's leftovers" || fail "no removal line: $(grep NVMe "$L/killed_res.out")"
  grep -q "in $left through" "$L/killed_res.out" && fail "the resumed run took the killed run's subdirectory"
  [ -e "$left" ] && fail "the killed run's subdirectory is still there"
  same_run killed ref_long killed && ok "resumed after kill -9 = uninterrupted"
  empty_store "the resumed run"
fi

# --- 4. a store file corrupted under a running run -----------------------------------------
# random blocks written into adamw.bin until the run stops: a read checks
# every extent, so the run stops naming the file and offset, not as a
# diverged step (whose advice would be about the learning rate)
# shellcheck disable=SC2086
run_corrupting corrupt adamw.bin 20 4 $NV
# (reported by the optimizer step, or by the step's pass when the host
# optimizer's thread found it first: either names the file)
if [ $rc = 1 ] && grep -qE ": AdamW state: nvd/moetune-[0-9a-f]{16}/adamw.bin: the extent at offset [0-9]+ " "$L/corrupt.out"; then
  grep -q "diverged" "$L/corrupt.out" && fail "a corrupted store reported as a diverged step"
  ok "a corrupted store file stops the run naming it: $(grep -o 'adamw.bin: the extent at offset [0-9]* [^:]*' "$L/corrupt.out" | head -n1)"
else
  fail "corrupted store: exit $rc, $(tail -n1 "$L/corrupt.out")"
fi
# a run that stops on an error removes its own files (one killed above would leave them)
[ $rc = 1 ] && empty_store "a run stopped by a corrupted store" && ok "a run stopped by the error removes its files"
rm -rf nvd/moetune-*

# --- 5. refusals -------------------------------------------------------------------------------
expect_refusal() { # NAME WANT... -- ARGS
  local name="$1"; shift; local want=(); while [ "$1" != "--" ]; do want+=("$1"); shift; done; shift
  timeout 60 "$MOETUNE" train run.yaml --set output_dir=refuse_$name "$@" >"$L/$name.out" 2>&1
  local rc=$? w bad=0
  [ $rc = 0 ] && { fail "$name: not refused"; return; }
  for w in "${want[@]}"; do grep -qF -- "$w" "$L/$name.out" || { fail "$name: no '$w' in: $(tail -n2 "$L/$name.out")"; bad=1; }; done
  [ $bad = 0 ] && ok "$name refused: $(grep -m1 error "$L/$name.out" | cut -c1-150)"
}
# shellcheck disable=SC2086
expect_refusal devices "memory.nvme.path nvd" "several devices" "remove memory.nvme" -- $NV --set devices=2
# shellcheck disable=SC2086
expect_refusal plan_budget "host memory is short" "with optimizer state on NVMe it does not fit either" -- $NV --set memory.nvme.budget=8KiB
# shellcheck disable=SC2086
expect_refusal store_budget "nvd" "budget is 409600 bytes" "the store needs" -- $NV --set memory.nvme.budget=400KiB
expect_refusal missing "nvd/nope" "cannot open the store directory" -- --set memory.nvme.path=nvd/nope
empty_store "the refused runs" && ok "refused runs leave the store directory empty"
echo "$failures failure(s)"
[ "$failures" -eq 0 ]

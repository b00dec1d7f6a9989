#!/usr/bin/env bash
# End-to-end checks of the `moetune` command as a user meets it: a small
# successful run, then bad input of every kind the foundation issue names.
# Each bad case must exit nonzero (never crash or hang) with a message that
# names what is wrong and where.
set -u
MOETUNE="$1"
[ -x "$MOETUNE" ] || { echo "usage: cli_test.sh PATH_TO_MOETUNE"; exit 2; }
MOETUNE="$(cd "$(dirname "$MOETUNE")" && pwd)/$(basename "$MOETUNE")"
W="${TEST_TMPDIR:-$(mktemp -d)}/cli"
rm -rf "$W"; mkdir -p "$W"; cd "$W" || exit 2
failures=0

# expect_fail NAME PATTERN CMD...: CMD exits with 1 (a handled error, not a
# signal: a crash gives 128+) within 60 s and its stderr matches PATTERN.
expect_fail() {
  local name="$1" pattern="$2"; shift 2
  timeout 60 "$@" >"$name.out" 2>"$name.err"; local rc=$?
  if [ "$rc" -ne 1 ]; then
    echo "FAIL $name: exit code $rc, expected 1"; cat "$name.err"; failures=$((failures + 1)); return
  fi
  if ! grep -qE -- "$pattern" "$name.err"; then
    echo "FAIL $name: message does not match /$pattern/:"; cat "$name.err"; failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(head -c 300 "$name.err" | tr '\n' ' ')"
}

cat > tiny.json <<'JSON'
{"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": false, "output_router_logits": true}
JSON
python3 - <<'PY' 2>/dev/null || for i in $(seq 1 40); do echo '{"input_ids": [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45]}'; done > data.jsonl
import json, random
random.seed(0)
with open("data.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"input_ids": [random.randrange(64) for _ in range(random.randrange(8, 20))]}) + "\n")
PY
cat > run.yaml <<'YAML'
base_model: ckpt
base_model_init: tiny.json
datasets:
  - path: data.jsonl
sequence_len: 16
micro_batch_size: 4
max_steps: 6
learning_rate: 1.0e-3
lr_scheduler: linear
warmup_steps: 2
output_dir: out
backend: cpu
logging_steps: 1
YAML

# --- a good run -------------------------------------------------------------
if timeout 120 "$MOETUNE" train run.yaml --set gradient_accumulation_steps=2 >good.out 2>good.err; then
  lines=$(grep -c '"step"' out/metrics.jsonl)
  if [ "$lines" -eq 6 ] && [ -f out/model.safetensors ] && [ -f out/config.json ] && [ -f ckpt/config.json ]; then
    echo "ok   good run: 6 metrics lines, checkpoint written"
  else
    echo "FAIL good run: metrics lines $lines or missing files"; failures=$((failures + 1))
  fi
else
  echo "FAIL good run"; cat good.err; failures=$((failures + 1))
fi
# a second run resumes from the fine-tuned model: output dirs are reusable
if ! timeout 120 "$MOETUNE" train run.yaml --set base_model=out --set output_dir=out2 >/dev/null 2>good2.err; then
  echo "FAIL training from a saved checkpoint"; cat good2.err; failures=$((failures + 1))
else
  echo "ok   training from moetune's own saved checkpoint"
fi
# left padding is not masked as HF does: the run goes on and says so once, naming the first row
printf '{"input_ids": [0, 0, 5, 9, 13], "attention_mask": [0, 0, 1, 1, 1]}\n{"input_ids": [3, 4]}\n%.0s' \
  1 2 3 > leftpad.jsonl
sed 's/data\.jsonl/leftpad.jsonl/' run.yaml > leftpad.yaml
if timeout 120 "$MOETUNE" train leftpad.yaml --set max_steps=1 --set output_dir=out_leftpad \
     >/dev/null 2>leftpad.err \
   && [ "$(grep -c 'warning: 3 row(s) have attention_mask zeros before their last 1' leftpad.err)" -eq 1 ] \
   && grep -q 'leftpad.jsonl:1' leftpad.err; then
  echo "ok   left padding: one warning naming leftpad.jsonl:1"
else
  echo "FAIL left padding warning"; cat leftpad.err; failures=$((failures + 1))
fi
"$MOETUNE" inspect ckpt > inspect.out 2>&1 && grep -q "mixtral" inspect.out \
  && echo "ok   inspect" || { echo "FAIL inspect"; cat inspect.out; failures=$((failures + 1)); }
# inspect fails when the weights lack a tensor config.json implies, naming it
rm -rf ckpt3 && mkdir ckpt3 && cp ckpt/* ckpt3/ \
  && sed -i -E 's/"num_hidden_layers": *2/"num_hidden_layers": 3/' ckpt3/config.json
expect_fail inspect_missing_tensor "missing tensor 'model\.layers\.2\.input_layernorm\.weight'" "$MOETUNE" inspect ckpt3

# --- --version: version, commit, build kind, backends, the CPU features found here ---
if ver=$("$MOETUNE" --version 2>&1); then
  want_kind=optimised; [ -n "${ASAN_OPTIONS:-}" ] && want_kind="sanitised \(ASan\+UBSan\)"
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  cpu_ok=1
  for pair in avx2:AVX2 avx512f:AVX-512F avx512_bf16:AVX512_BF16 amx_bf16:AMX-BF16; do
    f=${pair%%:*}; n=${pair#*:}
    has_flag=0; case " $flags " in *" $f "*) has_flag=1 ;; esac
    has_name=0; case " ${ver##*CPU features } " in *" $n "* | *" $n) "*) has_name=1 ;; esac
    # AMX also needs the OS to enable its tile state, so only "claimed but absent" is wrong there
    if [ "$has_name" -eq 1 ] && [ "$has_flag" -eq 0 ]; then cpu_ok=0; fi
    if [ "$f" != amx_bf16 ] && [ "$has_name" -ne "$has_flag" ]; then cpu_ok=0; fi
  done
  if printf '%s\n' "$ver" | grep -qE "^moetune [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{7,}(-dirty)?|unknown), ${want_kind}; backends CPU, CUDA; CPU features [A-Z0-9 _-]+\)$" \
     && [ "$cpu_ok" -eq 1 ]; then
    echo "ok   --version: $ver"
  else
    echo "FAIL --version: '$ver' (expected build kind $want_kind, CPU features from /proc/cpuinfo: $flags)"; failures=$((failures + 1))
  fi
  # the benchmarks carry the same line
  if timeout 60 "$MOETUNE" bench adam --params 100000 --json 2>&1 | grep -qF "\"build\": \"$ver\""; then
    echo "ok   bench adam --json carries the --version line"
  else
    echo "FAIL bench adam --json lacks \"build\": \"$ver\""; failures=$((failures + 1))
  fi
else
  echo "FAIL --version exited nonzero: $ver"; failures=$((failures + 1))
fi

# --- bad run configs ------------------------------------------------------------
expect_fail missing_config "nope\.yaml" "$MOETUNE" train nope.yaml
printf 'base_model: ckpt\ndatasets: [\n' > bad_yaml.yaml
expect_fail bad_yaml "bad_yaml\.yaml.*line" "$MOETUNE" train bad_yaml.yaml
sed 's/micro_batch_size/micro_batch_sise/' run.yaml > typo.yaml
expect_fail unknown_key "typo\.yaml.*micro_batch_sise.*micro_batch_size" "$MOETUNE" train typo.yaml
expect_fail wrong_type "learning_rate" "$MOETUNE" train run.yaml --set learning_rate=fast
expect_fail cuda_without_gpu "cuda.*(GPU|no CUDA)" "$MOETUNE" train run.yaml --set backend=cuda

# --- bad checkpoints ---------------------------------------------------------------
expect_fail missing_checkpoint "nowhere" "$MOETUNE" train run.yaml --set base_model=nowhere --set base_model_init=
cp -r ckpt trunc; truncate -s 1000 trunc/model.safetensors
expect_fail truncated_safetensors "trunc/model\.safetensors" "$MOETUNE" train run.yaml --set base_model=trunc
cp -r ckpt shape; sed -i 's/"intermediate_size": 48/"intermediate_size": 40/' shape/config.json
expect_fail shape_mismatch "experts\.0\.w1\.weight.*(40|48)" "$MOETUNE" train run.yaml --set base_model=shape
cp -r ckpt mtype; sed -i 's/"mixtral"/"dbrx"/' mtype/config.json
expect_fail unsupported_model_type "dbrx" "$MOETUNE" train run.yaml --set base_model=mtype
cp -r ckpt noconfig; rm noconfig/config.json
expect_fail missing_config_json "noconfig/config\.json" "$MOETUNE" train run.yaml --set base_model=noconfig

# --- bad data -----------------------------------------------------------------------
{ head -n 3 data.jsonl; echo '{"input_ids": [1, 2, '; } > badjson.jsonl
expect_fail bad_jsonl "badjson\.jsonl.*4" "$MOETUNE" train run.yaml --set 'datasets=[{path: badjson.jsonl}]'
{ head -n 2 data.jsonl; echo '{"input_ids": [1, 2, 999]}'; } > oor.jsonl
expect_fail out_of_range_token "oor\.jsonl.*3.*999" "$MOETUNE" train run.yaml --set 'datasets=[{path: oor.jsonl}]'

# --- the staging profiler: three modes on the same plan and data ------------------
if timeout 120 "$MOETUNE" profile run.yaml --compare --steps 2 --set scheduler.policy=offload_all \
     --set output_dir=prof >profile.out 2>profile.err \
   && grep -qE "identical losses across modes +yes" profile.out \
   && grep -qE "compact <= 3 copies per MoE layer.*yes" profile.out \
   && [ -s prof/staging/staging.csv ] && grep -q "<svg" prof/staging/staging.svg; then
  echo "ok   profile --compare: identical losses, staging.csv and staging.svg written"
else
  echo "FAIL profile --compare"; cat profile.out profile.err; failures=$((failures + 1))
fi

# --- bench step: every plan runs, and the numbers it reports are there ----------------
# (what the numbers are is the benchmark's business; here: it runs to the end and reports them)
if timeout 300 "$MOETUNE" bench step --layers 2 --hidden 64 --experts 4 --expert-width 64 --vocab 64 --seq 16 \
     --batch 2 --steps 2 --staging-rounds 1 --compute-threads 1 --link-latency-us 0 --json >bench.out 2>bench.err \
   && grep -qE '"offload_over_keep": [0-9.]+' bench.out \
   && grep -qE '"predicted_offload_all_s": [0-9.]*[1-9]' bench.out \
   && grep -qE '"auto_step_s": [0-9.]*[1-9]' bench.out \
   && grep -qE '"link_bytes_per_s": [0-9.]*[1-9]' bench.out; then
  echo "ok   bench step --json: $(head -c 200 bench.out)"
else
  echo "FAIL bench step"; cat bench.out bench.err; failures=$((failures + 1))
fi

# --- bad staging settings: refused by the pool before training starts ------------
expect_fail staging_cap_too_small "staging.*smaller than model\.embed_tokens\.weight" "$MOETUNE" train run.yaml --set staging.cap=1KiB
expect_fail staging_zero_slabs "staging\.num_slabs = 0" "$MOETUNE" train run.yaml --set staging.num_slabs=0

# --- the later families: init and inspect work; DeepSeek-V3 and gpt-oss train ------
cat > tiny-ds.json <<'JSON'
{"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1,
 "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "q_lora_rank": 16,
 "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "rms_norm_eps": 1e-6,
 "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
cat > tiny-oss.json <<'JSON'
{"model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 32, "head_dim": 8,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
 "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "sliding_window": 4}
JSON
for fam in ds oss; do
  sed -e "s#^base_model:.*#base_model: ./tiny-$fam#" -e "s#^base_model_init:.*#base_model_init: ./tiny-$fam.json#" \
      -e "s#^output_dir:.*#output_dir: ./out-$fam#" run.yaml > run-$fam.yaml
  if timeout 60 "$MOETUNE" init run-$fam.yaml >init-$fam.out 2>&1 && timeout 60 "$MOETUNE" inspect tiny-$fam >inspect-$fam.out 2>&1 \
     && grep -q "all .* tensors present with the expected shapes" inspect-$fam.out; then
    echo "ok   init + inspect of a tiny $fam model"
  else
    echo "FAIL init + inspect $fam"; cat init-$fam.out inspect-$fam.out; failures=$((failures + 1))
  fi
  if [ "$fam" = ds ]; then # DeepSeek-V3 trains (engine/layers/mla.c); gpt-oss below
    if timeout 120 "$MOETUNE" train run-$fam.yaml >train-$fam.out 2>&1 && grep -q '"loss"' out-$fam/metrics.jsonl; then
      echo "ok   train a tiny $fam model"
    else
      echo "FAIL train $fam"; cat train-$fam.out; failures=$((failures + 1))
    fi
  fi
done
# DeepSeek-V3's FP8 release: F8_E4M3 weights with 128 x 128 block scales (weight_scale_inv) and a
# quantization_config. Trained dequantised: the same losses, bit for bit, as the fp32 checkpoint of
# the dequantised values (python below, from the format's definition), saved in bf16 without the
# quantization_config; a quantization_config moetune cannot read is refused by name.
if python3 - <<'PY' 2>fp8.err
import json, math, struct, bisect, os
def e4m3(c):  # the format's definition: s eeee mmm, bias 7, no infinities, 0x7f NaN
    s, e, m = c >> 7, (c >> 3) & 15, c & 7
    v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v
pos = sorted((e4m3(c), c) for c in range(0x7f))
vals = [v for v, _ in pos]
def enc(x):
    a = abs(x); i = bisect.bisect_left(vals, a)
    best = min((j for j in (i - 1, i) if 0 <= j < len(vals)), key=lambda j: abs(vals[j] - a))
    return pos[best][1] | (0x80 if x < 0 and vals[best] != 0 else 0)
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
b = open("tiny-ds/model.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]; h.pop("__metadata__", None)
def floats(t):
    raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
    if t["dtype"] == "F32": return list(struct.unpack("<%df" % (len(raw) // 4), raw))
    assert t["dtype"] == "BF16", t["dtype"]
    return [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
q8, deq = {}, {}
for name, t in h.items():
    x = floats(t)
    if len(t["shape"]) == 2 and name.endswith(".weight") and not any(k in name for k in ("embed_tokens", "lm_head", "mlp.gate.weight")):
        r, c = t["shape"]; br, bc = (r + 127) // 128, (c + 127) // 128
        scale = [0.0] * (br * bc); codes = bytearray(r * c); d = [0.0] * (r * c)
        for bi in range(br):
            for bj in range(bc):
                idx = [i * c + j for i in range(bi * 128, min(r, bi * 128 + 128)) for j in range(bj * 128, min(c, bj * 128 + 128))]
                s = f32(max(abs(x[k]) for k in idx) / 448.0) or 1.0
                scale[bi * bc + bj] = s
                for k in idx:
                    codes[k] = enc(x[k] / s); d[k] = f32(e4m3(codes[k]) * s)
        q8[name] = ("F8_E4M3", [r, c], bytes(codes)); q8[name + "_scale_inv"] = ("F32", [br, bc], struct.pack("<%df" % len(scale), *scale))
        deq[name] = ("F32", t["shape"], struct.pack("<%df" % len(d), *d))
    else:
        q8[name] = deq[name] = ("F32", t["shape"], struct.pack("<%df" % len(x), *x))
def write(path, ts):
    hdr, off, blobs = {}, 0, []
    for k, (dt, sh, raw) in ts.items():
        hdr[k] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(raw)]}; off += len(raw); blobs.append(raw)
    hj = json.dumps(hdr).encode(); hj += b" " * (-len(hj) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
cfg = json.load(open("tiny-ds/config.json"))
for d, ts, qc in (("tiny-ds-fp8", q8, {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}),
                  ("tiny-ds-deq", deq, None), ("tiny-ds-fp8-bad", q8, {"quant_method": "fp8", "weight_block_size": [64, 64]})):
    os.makedirs(d, exist_ok=True); write(d + "/model.safetensors", ts)
    c = dict(cfg)
    if qc: c["quantization_config"] = qc
    json.dump(c, open(d + "/config.json", "w"))
PY
then
  ok_fp8=1
  for d in fp8 deq; do
    timeout 120 "$MOETUNE" train run-ds.yaml --set base_model=./tiny-ds-$d --set base_model_init= \
      --set output_dir=./out-ds-$d >train-ds-$d.out 2>&1 || { ok_fp8=0; cat train-ds-$d.out; }
  done
  if [ $ok_fp8 = 1 ] && python3 - <<'PY'
import json, struct
loss = lambda d: [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l]
a, b = loss("out-ds-fp8"), loss("out-ds-deq")
assert a and a == b, (a, b)
cfg = json.load(open("out-ds-fp8/config.json"))
assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16", cfg
raw = open("out-ds-fp8/model.safetensors", "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
assert not any(k.endswith("_scale_inv") for k in h), "scales saved"
dts = {t["dtype"] for k, t in h.items() if not k.endswith("e_score_correction_bias")}
assert dts == {"BF16"}, dts
PY
  then
    echo "ok   train an FP8 DeepSeek-V3 checkpoint: losses equal the dequantised fp32 one's, saved bf16 without quantization_config"
  else
    echo "FAIL FP8 DeepSeek-V3 training"; failures=$((failures + 1))
  fi
else
  echo "FAIL writing the FP8 checkpoint"; cat fp8.err; failures=$((failures + 1))
fi
expect_fail train_refused_ds_fp8_block "config\.json: key 'quantization_config': weight_block_size is not \[128, 128\]" \
  "$MOETUNE" train run-ds.yaml --set base_model=./tiny-ds-fp8-bad --set base_model_init=
# gpt-oss with GptOssConfig's defaults beyond the file's keys: YaRN RoPE, sinks, fused experts
if timeout 120 "$MOETUNE" train run-oss.yaml >train-oss.out 2>&1 && [ -f out-oss/model.safetensors ] \
   && grep -qE '"step": ?5' out-oss/metrics.jsonl; then
  echo "ok   train a tiny gpt-oss model"
else
  echo "FAIL train gpt-oss"; cat train-oss.out; failures=$((failures + 1))
fi

# gpt-oss as the Hub ships it: the experts in MXFP4 (_blocks + _scales), read by dequantising them
if python3 - <<'PY' 2>mx.err
import json, os, struct
b = open("tiny-oss/model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]
meta = h.pop("__metadata__", None)
out, blobs, off = {}, [], 0
def add(name, dtype, shape, raw):
    global off
    out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
    blobs.append(raw); off += len(raw)
for name, t in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        E, C, R = t["shape"]  # transformers' (E, C, R) is stored as (E, R, C/32, 16) blocks + (E, R, C/32) scales
        add(name + "_blocks", "U8", [E, R, C // 32, 16], bytes([0x21]) * (E * R * C // 2))
        add(name + "_scales", "U8", [E, R, C // 32], bytes([127]) * (E * R * C // 32))
    else:
        add(name, t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
if meta: out["__metadata__"] = meta
hj = json.dumps(out).encode(); hj += b" " * ((8 - len(hj) % 8) % 8)
os.makedirs("tiny-oss-mx", exist_ok=True)
open("tiny-oss-mx/model.safetensors", "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
cfg = json.load(open("tiny-oss/config.json"))
cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
json.dump(cfg, open("tiny-oss-mx/config.json", "w"), indent=2)
PY
then
  if timeout 60 "$MOETUNE" inspect tiny-oss-mx >inspect-mx.out 2>&1 && grep -q "all 37 tensors present" inspect-mx.out \
     && grep -q "4 expert tensors in MXFP4" inspect-mx.out; then
    echo "ok   inspect of gpt-oss with MXFP4 experts"
  else
    echo "FAIL inspect MXFP4"; cat inspect-mx.out; failures=$((failures + 1))
  fi
  sed "s#tiny-oss#tiny-oss-mx#g" run-oss.yaml > run-mx.yaml
  # the MXFP4 experts are dequantised on load (E2M1 0.5 and 1.0 at scale 2^0 here) and train like bf16 ones
  if timeout 120 "$MOETUNE" train run-mx.yaml --set output_dir=./out-mx >train-mx.out 2>&1 \
     && [ -f out-mx/model.safetensors ] && grep -qE '"step": ?5' out-mx/metrics.jsonl \
     && head -c 4096 out-mx/model.safetensors | grep -aq 'experts.gate_up_proj"' \
     && ! grep -q quantization_config out-mx/config.json && ! grep -q "not used by" train-mx.out; then
    echo "ok   train gpt-oss from MXFP4 experts (saved dequantised, without quantization_config)"
  else
    echo "FAIL train gpt-oss from MXFP4"; cat train-mx.out; failures=$((failures + 1))
  fi
else
  echo "skip MXFP4 checkpoint (no python3 to write it): $(head -c 200 mx.err)"
fi

# the good run's files survived all the failures
[ -f out/model.safetensors ] && echo "ok   earlier output intact" || { echo "FAIL earlier output lost"; failures=$((failures + 1)); }

if [ "$failures" -ne 0 ]; then echo "cli_test: $failures failures"; exit 1; fi
echo "cli_test: all ok"

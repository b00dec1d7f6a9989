#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora under tools/fuzz/corpus/<harness>/:
small valid inputs and near-valid ones (one thing wrong each), so libFuzzer
starts next to the branches that matter instead of discovering the format.
Regression inputs for bugs the fuzzers found are committed beside them by
hand (files named regress-*) and are not touched here.

    python3 tools/fuzz/make_corpus.py
"""
import glob
import json
import os
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tools", "fuzz", "corpus")


def put(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def st_file(header, data=b"", pad=True, n=None):
    """A safetensors file: u64 header length, header JSON, data."""
    h = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def safetensors():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    good = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]},
            "__metadata__": {"format": "pt"}}
    body = f32 + b"\x80\x3f\x00\x40"
    put("fuzz_safetensors", "valid", st_file(good, body))
    put("fuzz_safetensors", "valid-scalar-and-empty", st_file(
        {"s": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]},
         "e": {"dtype": "F32", "shape": [0, 4], "data_offsets": [2, 2]},
         "i": {"dtype": "I32", "shape": [1], "data_offsets": [2, 6]}}, b"\x00\x3c" + b"\x01\x00\x00\x00"))
    sizes = [("BOOL", 1), ("U8", 1), ("I8", 1), ("F8_E5M2", 1), ("F8_E4M3", 1), ("I16", 2), ("U16", 2),
             ("F16", 2), ("BF16", 2), ("I32", 4), ("U32", 4), ("F32", 4), ("F64", 8), ("I64", 8), ("U64", 8)]
    hdr, off = {}, 0
    for k, (dt, sz) in enumerate(sizes):
        hdr[f"t{k}"] = {"dtype": dt, "shape": [1], "data_offsets": [off, off + sz]}
        off += sz
    put("fuzz_safetensors", "valid-all-dtypes", st_file(hdr, bytes(off)))
    put("fuzz_safetensors", "near-gap", st_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)))
    put("fuzz_safetensors", "near-overlap", st_file(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)))
    put("fuzz_safetensors", "near-trailing", st_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8)))
    put("fuzz_safetensors", "near-size", st_file({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)))
    put("fuzz_safetensors", "near-dup", st_file(b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                                b'"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)))
    put("fuzz_safetensors", "near-huge-n", st_file(good, body, n=1 << 40))
    put("fuzz_safetensors", "near-overflow-shape", st_file(
        {"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}}))
    put("fuzz_safetensors", "near-bad-dtype", st_file({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, bytes(4)))
    put("fuzz_safetensors", "near-truncated", st_file(good, body)[:40])
    put("fuzz_safetensors", "near-not-utf8", st_file(b'{"\xff\xfe":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)))
    put("fuzz_safetensors", "near-meta-not-string", st_file({"__metadata__": {"format": 1}}))


def checkpoint_index():
    def idx(wm, meta=True):
        d = {"weight_map": wm}
        if meta:
            d["metadata"] = {"total_size": 30}
        return json.dumps(d, indent=2)
    put("fuzz_checkpoint_index", "valid", idx({"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}))
    put("fuzz_checkpoint_index", "valid-subset", idx({"z": "b.safetensors"}, meta=False))
    put("fuzz_checkpoint_index", "near-missing-shard", idx({"x": "a.safetensors", "q": "c.safetensors"}))
    put("fuzz_checkpoint_index", "near-absent-tensor", idx({"x": "b.safetensors"}))
    put("fuzz_checkpoint_index", "near-escape", idx({"x": "../a.safetensors"}))
    put("fuzz_checkpoint_index", "near-not-string", idx({"x": 3}))
    put("fuzz_checkpoint_index", "near-no-map", '{"metadata": {"total_size": 30}}')
    put("fuzz_checkpoint_index", "near-dup-key", '{"weight_map": {"x": "a.safetensors", "x": "b.safetensors"}}')


def model_config():
    paths = sorted(glob.glob(os.path.join(ROOT, "configs", "models", "**", "*.json"), recursive=True))
    paths += sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "*", "ckpt", "config.json")))
    for p in paths:
        name = os.path.relpath(p, ROOT).replace("/", "_")
        with open(p, "rb") as f:
            put("fuzz_model_config", "valid-" + name, f.read())
    tiny = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    put("fuzz_model_config", "valid-tiny-with-overrides",
        json.dumps(tiny).encode() + b"\0" + b'{"output_router_logits": true, "router_aux_loss_coef": 0.02}')
    for key, val in [("hidden_size", -32), ("num_hidden_layers", "2"), ("num_experts_per_tok", 9),
                     ("vocab_size", 2 ** 40), ("num_attention_heads", 0), ("rms_norm_eps", None)]:
        bad = dict(tiny)
        bad[key] = val
        put("fuzz_model_config", f"near-{key}-{val}", json.dumps(bad))
    bad = dict(tiny)
    del bad["hidden_size"]
    put("fuzz_model_config", "near-missing-hidden_size", json.dumps(bad))


def run_config():
    paths = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")) + glob.glob(os.path.join(ROOT, "configs", "runs", "*.yaml")))
    paths += sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "*", "run.yaml")))
    for p in paths:
        with open(p, "rb") as f:
            put("fuzz_run_config", "valid-" + os.path.relpath(p, ROOT).replace("/", "_"), f.read())
    base = ("base_model: ckpt\ndatasets:\n  - path: data.jsonl\nsequence_len: 16\nmicro_batch_size: 4\n"
            "max_steps: 6\nlearning_rate: 1.0e-3\nlr_scheduler: cosine\nwarmup_steps: 2\noutput_dir: out\n"
            "memory: {device: 8GiB, pinned: 1GiB}\nstaging: {mode: compact}\nscheduler: {policy: auto}\n")
    put("fuzz_run_config", "valid-with-sets", base + "\0memory.device=2GiB\0model_config={output_router_logits: true}")
    put("fuzz_run_config", "near-typo", base.replace("micro_batch_size", "micro_batch_sise"))
    put("fuzz_run_config", "near-type", base.replace("1.0e-3", "fast"))
    put("fuzz_run_config", "near-range", base.replace("max_steps: 6", "max_steps: 99999999999999999999"))
    put("fuzz_run_config", "near-syntax", base + "datasets: [\n")
    put("fuzz_run_config", "near-anchor", base + "x: &a [*a]\n")


def data_jsonl():
    # first byte: sequence_len - 1 in the low 4 bits, bit 4 = no vocabulary check
    lines = ['{"input_ids": [1, 5, 9, 13, 17, 21, 25, 29, 33, 37]}',
             '{"input_ids": [3, 4, 5], "labels": [-100, 4, 5], "attention_mask": [1, 1, 1]}',
             '{"input_ids": [0, 0, 5, 9], "attention_mask": [0, 0, 1, 1]}']
    put("fuzz_data_jsonl", "valid", b"\x07" + ("\n".join(lines) + "\n").encode())
    with open(os.path.join(ROOT, "tests", "fixtures", "ref_mixtral", "data.jsonl"), "rb") as f:
        put("fuzz_data_jsonl", "valid-fixture", b"\x1f" + f.read())
    put("fuzz_data_jsonl", "near-out-of-range", b"\x07" + b'{"input_ids": [1, 2, 999]}\n')
    put("fuzz_data_jsonl", "near-negative", b"\x07" + b'{"input_ids": [1, -2]}\n')
    put("fuzz_data_jsonl", "near-mask-length", b"\x07" + b'{"input_ids": [1, 2], "attention_mask": [1]}\n')
    put("fuzz_data_jsonl", "near-float", b"\x07" + b'{"input_ids": [1.5, 2]}\n')
    put("fuzz_data_jsonl", "near-no-ids", b"\x07" + b'{"labels": [1, 2]}\n\n')
    put("fuzz_data_jsonl", "near-empty", b"\x07")


def data_bin():
    def hdr(magic, version, count):
        return struct.pack("<256i", magic, version, count, *([0] * 253))
    toks = list(range(1, 40))
    put("fuzz_data_bin", "valid-u16", b"\x07" + hdr(20240520, 1, len(toks)) + struct.pack(f"<{len(toks)}H", *toks))
    put("fuzz_data_bin", "valid-u32", b"\x03" + hdr(20240801, 7, len(toks)) + struct.pack(f"<{len(toks)}I", *toks))
    put("fuzz_data_bin", "near-count", b"\x07" + hdr(20240520, 1, 1000) + struct.pack("<4H", 1, 2, 3, 4))
    put("fuzz_data_bin", "near-negative-count", b"\x07" + hdr(20240520, 1, -5) + struct.pack("<4H", 1, 2, 3, 4))
    put("fuzz_data_bin", "near-magic", b"\x07" + hdr(20240521, 1, 4) + struct.pack("<4H", 1, 2, 3, 4))
    put("fuzz_data_bin", "near-version", b"\x07" + hdr(20240801, 1, 4) + struct.pack("<4I", 1, 2, 3, 4))
    put("fuzz_data_bin", "near-out-of-range", b"\x07" + hdr(20240801, 7, 4) + struct.pack("<4I", 1, 2, 3, 70000))
    put("fuzz_data_bin", "near-short-header", b"\x07" + hdr(20240520, 1, 4)[:100])


def hw():
    for p in sorted(glob.glob(os.path.join(ROOT, "configs", "hw", "*.yaml"))):
        with open(p, "rb") as f:
            put("fuzz_hw", "valid-" + os.path.basename(p), f.read())


def trainer_state():
    """A real checkpoint's trainer_state.json (the bad-input corpus's run), its
    directory number first, and near ones: each one key of the wrong type,
    missing, or out of range."""
    p = os.path.join(ROOT, "tests", "bad_inputs", "_shared", "run", "checkpoint-2", "trainer_state.json")
    with open(p, "rb") as f:
        text = f.read()
    good = json.loads(text)
    put("fuzz_trainer_state", "valid", b"\x02" + text)
    put("fuzz_trainer_state", "valid-unnamed-dir", b"\xff" + text)

    def near(name, edit, n=2):
        st = json.loads(text)
        edit(st)
        put("fuzz_trainer_state", "near-" + name, bytes([n]) + json.dumps(st, indent=1).encode())
    near("step-string", lambda st: st.__setitem__("global_step", "2"))
    near("step-missing", lambda st: st.pop("global_step"))
    near("step-other-dir", lambda st: None, n=3)
    near("step-float", lambda st: st.__setitem__("global_step", 2.0))
    near("step-huge", lambda st: st.__setitem__("global_step", 2 ** 63 - 1))
    near("cursor-negative", lambda st: st["data"].__setitem__("cursor", -1))
    near("data-list", lambda st: st.__setitem__("data", [1, 2]))
    near("skipped-past-step", lambda st: st.__setitem__("nonfinite_steps_skipped", 3))
    near("log-step-zero", lambda st: st["log_history"][0].__setitem__("step", 0))
    near("log-loss-string", lambda st: st["log_history"][0].__setitem__("loss", "nan"))
    near("log-entry-list", lambda st: st["log_history"].append([1]))
    near("log-null-values", lambda st: st["log_history"][0].update(loss=None, learning_rate=None, grad_norm=None))
    assert good["global_step"] == 2
    put("fuzz_trainer_state", "near-not-object", b"\x02[1, 2]")
    put("fuzz_trainer_state", "near-truncated", b"\x02" + text[: len(text) // 2])


def adapter_config():
    """Every adapter_config.json in the test fixtures (PEFT-written ones among
    them: rank and alpha patterns, target_parameters, regex targets) and
    near ones: one key of the wrong type, a pattern of the wrong kind."""
    paths = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "**", "adapter_config.json"), recursive=True))
    for p in paths:
        with open(p, "rb") as f:
            put("fuzz_adapter_config", "valid-" + os.path.relpath(p, ROOT).replace("/", "_"), f.read())
    with open(paths[0], "rb") as f:
        base = json.loads(f.read())

    def near(name, edit):
        c = json.loads(json.dumps(base))
        edit(c)
        put("fuzz_adapter_config", "near-" + name, json.dumps(c, indent=1).encode())
    near("r-string", lambda c: c.__setitem__("r", "8"))
    near("r-zero", lambda c: c.__setitem__("r", 0))
    near("alpha-null", lambda c: c.__setitem__("lora_alpha", None))
    near("rank-pattern", lambda c: c.__setitem__("rank_pattern", {"q_proj": 4, ".*experts.*": 2}))
    near("rank-pattern-float", lambda c: c.__setitem__("rank_pattern", {"q_proj": 4.5}))
    near("alpha-pattern", lambda c: c.__setitem__("alpha_pattern", {"down_proj": 32}))
    near("target-regex", lambda c: c.__setitem__("target_modules", ".*\\.(q|v)_proj"))
    near("target-parameters", lambda c: c.__setitem__("target_parameters", ["mlp.experts.gate_up_proj"]))
    near("dora", lambda c: c.__setitem__("use_dora", True))
    near("modules-to-save", lambda c: c.__setitem__("modules_to_save", ["lm_head"]))


if __name__ == "__main__":
    safetensors()
    checkpoint_index()
    model_config()
    run_config()
    data_jsonl()
    data_bin()
    hw()
    trainer_state()
    adapter_config()
    for h in sorted(os.listdir(OUT)):
        print(h, len(os.listdir(os.path.join(OUT, h))))

#!/usr/bin/env python3
"""Writes the bad-input corpus that tests/bad_inputs_test.sh runs through the
real `moetune` binary: one directory per case, each with a run.yaml (or the
command in its `expect` file), the broken files it needs, and `expect`:

    exit 1                     the exit status (always 1: a handled error)
    stderr TEXT                a substring the message must contain (the file,
                               key or tensor at fault)
    cmd ARGS...                moetune's arguments (default: train run.yaml)
    fifo PATH                  the runner makes PATH a FIFO before running
    pending WHY                a known gap: reported, not failed

Cases share _shared/ (a tiny valid Mixtral checkpoint and data) through
relative paths; a case that breaks the checkpoint carries its own copy.

    python3 tests/bad_inputs/make_cases.py          # rewrites every case
    python3 tests/bad_inputs/make_cases.py --moetune bazel-bin/tools/moetune
                                                    # and first trains the runs
                                                    # the resume cases alter
"""
import json
import os
import shutil
import struct
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "_shared")

TINY_CONFIG = OrderedDict([
    ("model_type", "mixtral"), ("vocab_size", 32), ("hidden_size", 16), ("intermediate_size", 16),
    ("num_hidden_layers", 1), ("num_attention_heads", 2), ("num_key_value_heads", 1),
    ("num_local_experts", 2), ("num_experts_per_tok", 1), ("rms_norm_eps", 1e-5),
    ("rope_theta", 10000.0), ("tie_word_embeddings", False), ("torch_dtype", "float32")])

# key order of the run config every case starts from
BASE_RUN = OrderedDict([
    ("base_model", "../_shared/ckpt"),
    ("datasets", "\n  - path: ../_shared/data.jsonl"),
    ("sequence_len", "8"),
    ("micro_batch_size", "2"),
    ("max_steps", "1"),
    ("learning_rate", "1.0e-3"),
    ("output_dir", "out"),
    ("backend", "cpu"),
])

CASES = []


def run_yaml(drop=(), extra="", **over):
    lines = []
    for k, v in BASE_RUN.items():
        if k in drop:
            continue
        v = over.pop(k, v)
        lines.append(f"{k}:{'' if v.startswith(chr(10)) else ' '}{v}")
    for k, v in over.items():
        lines.append(f"{k}: {v}")
    return "\n".join(lines) + "\n" + extra


def case(name, stderr, files=None, yaml=None, cmd=None, fifo=None, pending=None):
    files = dict(files or {})
    if yaml is not None:
        files["run.yaml"] = yaml
    elif "run.yaml" not in files:
        files["run.yaml"] = run_yaml()
    CASES.append((name, stderr, files, cmd, fifo, pending))


# --- safetensors ------------------------------------------------------------

def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n], object_pairs_hook=OrderedDict)
    return hdr, raw[8 + n:]


def st_bytes(hdr, data, n=None):
    h = hdr if isinstance(hdr, bytes) else json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def adapter_config(r=4, **extra):
    """A PEFT adapter_config.json for q_proj (the tiny model's, 16 x 16)."""
    c = OrderedDict([("peft_type", "LORA"), ("task_type", "CAUSAL_LM"), ("r", r), ("lora_alpha", 8),
                     ("lora_dropout", 0.0), ("target_modules", ["q_proj"]), ("bias", "none"),
                     ("use_rslora", False), ("use_dora", False)])
    c.update(extra)
    return json.dumps(c, indent=2) + "\n"


def adapter_weights(r, in_dim, fill=b"\0\0\0\0"):
    """q_proj's lora_A (r, in_dim) and lora_B (16, r) in fp32, every element `fill` (zeros)."""
    hdr, data = OrderedDict(), b""
    names = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
             "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    for name, shape in zip(names, ([r, in_dim], [16, r])):
        n = 4 * shape[0] * shape[1]
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += fill * (n // 4)
    return st_bytes(hdr, data)


def st_zeros(shapes):
    """A safetensors file of fp32 zeros: {name: shape}, in order."""
    hdr, data = OrderedDict(), b""
    for name, shape in shapes.items():
        n = 4 * shape[0] * shape[1]
        hdr[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(data), len(data) + n]}
        data += b"\0" * n
    return st_bytes(hdr, data)


def fused_weights(r_gate_up, r_down):
    """PEFT's transformers-5 fused expert adapter on the tiny Mixtral (2 experts, H 16, I 16):
    gate_up_proj (the inner wrapper) at rank r_gate_up per expert, down_proj at r_down."""
    pre = "base_model.model.model.layers.0.mlp.experts"
    return st_zeros(OrderedDict([(f"{pre}.base_layer.lora_A.weight", (2 * r_gate_up, 16)),
                                 (f"{pre}.base_layer.lora_B.weight", (32, 2 * r_gate_up)),
                                 (f"{pre}.lora_A.weight", (2 * r_down, 16)),
                                 (f"{pre}.lora_B.weight", (16, 2 * r_down))]))


class Link(str):
    """A file the case shares unchanged with _shared/ (written as a symlink)."""


def pack(hdr, data, keys):
    """A safetensors file holding only `keys` of (hdr, data), laid out afresh."""
    out, pieces, off = OrderedDict(), [], 0
    for k in keys:
        b, e = hdr[k]["data_offsets"]
        out[k] = dict(hdr[k], data_offsets=[off, off + e - b])
        pieces.append(data[b:e])
        off += e - b
    return st_bytes(out, b"".join(pieces))


def shared_ckpt_files():
    return {"ckpt/" + fn: Link("_shared/ckpt/" + fn) for fn in sorted(os.listdir(os.path.join(SHARED, "ckpt")))}


def shared_bytes(rel):
    with open(os.path.join(HERE, rel), "rb") as f:
        return f.read()


def ckpt_case(name, stderr, st=None, config=None, extra_files=None, drop=(), pending=None, yaml=None):
    files = shared_ckpt_files()
    if st is not None:
        files["ckpt/model.safetensors"] = st
    if config is not None:
        files["ckpt/config.json"] = config if isinstance(config, (bytes, str)) else json.dumps(config, indent=1)
    for d in drop:
        files.pop(d, None)
    files.update(extra_files or {})
    case(name, stderr, files, yaml=yaml or run_yaml(base_model="ckpt"), pending=pending)


def safetensors_cases():
    hdr, data = read_st(os.path.join(SHARED, "ckpt", "model.safetensors"))
    names = [k for k in hdr if k != "__metadata__"]
    first = min(names, key=lambda k: hdr[k]["data_offsets"][0])
    second = sorted(names, key=lambda k: hdr[k]["data_offsets"][0])[1]
    last = max(names, key=lambda k: hdr[k]["data_offsets"][1])
    good = st_bytes(hdr, data)

    def mut(fn):
        h = json.loads(json.dumps(hdr), object_pairs_hook=OrderedDict)
        fn(h)
        return h

    ST = "model.safetensors"
    ckpt_case("st_empty_file", ST, st=b"")
    ckpt_case("st_shorter_than_8", ST, st=b"\x10\x00\x00")
    ckpt_case("st_header_len_huge", ST, st=st_bytes(hdr, data, n=100_000_001))
    ckpt_case("st_header_len_past_eof", ST, st=st_bytes(hdr, data, n=len(good) + 8))
    ckpt_case("st_header_len_zero", ST, st=st_bytes(b"", data, n=0))
    ckpt_case("st_header_len_u64_max", ST, st=struct.pack("<Q", 2 ** 64 - 1) + good[8:])
    ckpt_case("st_header_invalid_json", ST, st=st_bytes(b'{"a": {"dtype": "F32",', data))
    ckpt_case("st_header_not_utf8", ST, st=st_bytes(b'{"\xff\xfe": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
    ckpt_case("st_header_array", ST, st=st_bytes(b"[1, 2, 3]", data))
    ckpt_case("st_header_nul_padding", ST, st=struct.pack("<Q", len(json.dumps(hdr)) + 8) + json.dumps(hdr).encode() + b"\0" * 8 + data)
    dup = json.dumps(hdr, separators=(",", ":"))
    entry = json.dumps({first: hdr[first]}, separators=(",", ":"))[1:-1]
    ckpt_case("st_duplicate_name", first, st=st_bytes(("{" + entry + "," + dup[1:]).encode(), data))
    ckpt_case("st_unknown_dtype", first, st=st_bytes(mut(lambda h: h[first].__setitem__("dtype", "F33")), data))
    ckpt_case("st_dtype_not_string", first, st=st_bytes(mut(lambda h: h[first].__setitem__("dtype", 32)), data))
    ckpt_case("st_missing_dtype", first, st=st_bytes(mut(lambda h: h[first].pop("dtype")), data))
    ckpt_case("st_shape_not_list", first, st=st_bytes(mut(lambda h: h[first].__setitem__("shape", "2x3")), data))
    ckpt_case("st_shape_negative", first, st=st_bytes(mut(lambda h: h[first]["shape"].__setitem__(0, -h[first]["shape"][0])), data))
    ckpt_case("st_shape_float", first, st=st_bytes(mut(lambda h: h[first]["shape"].__setitem__(0, h[first]["shape"][0] + 0.5)), data))
    ckpt_case("st_shape_overflow", first, st=st_bytes(mut(lambda h: h[first].__setitem__("shape", [2 ** 62, 2 ** 62, 16])), data))
    ckpt_case("st_missing_offsets", first, st=st_bytes(mut(lambda h: h[first].pop("data_offsets")), data))
    ckpt_case("st_offsets_three", first, st=st_bytes(mut(lambda h: h[first]["data_offsets"].append(7)), data))
    ckpt_case("st_offsets_reversed", first, st=st_bytes(mut(lambda h: h[first]["data_offsets"].reverse()), data))
    ckpt_case("st_offsets_negative", first, st=st_bytes(mut(lambda h: h[first].__setitem__("data_offsets", [-4, h[first]["data_offsets"][1]])), data))
    ckpt_case("st_bytes_not_shape", first, st=st_bytes(mut(lambda h: h[first]["shape"].__setitem__(-1, h[first]["shape"][-1] - 1)), data))

    def gap(h):  # the second tensor starts 4 bytes late; its end (and every later one) moves too
        for k in names:
            b, e = h[k]["data_offsets"]
            if b >= h[second]["data_offsets"][0]:
                h[k]["data_offsets"] = [b + 4, e + 4]
    ckpt_case("st_gap_between_tensors", ST, st=st_bytes(mut(gap), data + b"\0" * 4))

    def overlap(h):
        b, e = h[second]["data_offsets"]
        h[second]["data_offsets"] = [b - 4, e - 4]
    ckpt_case("st_overlapping_tensors", ST, st=st_bytes(mut(overlap), data))
    ckpt_case("st_first_not_at_zero", ST, st=st_bytes(mut(lambda h: [h[k].__setitem__("data_offsets", [h[k]["data_offsets"][0] + 4, h[k]["data_offsets"][1] + 4]) for k in names]), b"\0" * 4 + data))
    ckpt_case("st_trailing_bytes", ST, st=good + b"\0" * 8)
    ckpt_case("st_truncated_data", ST, st=good[:-6])
    ckpt_case("st_truncated_in_header", ST, st=good[:40])
    ckpt_case("st_metadata_not_strings", ST, st=st_bytes(mut(lambda h: h.__setitem__("__metadata__", {"format": 1})), data))
    ckpt_case("st_entry_not_object", first, st=st_bytes(mut(lambda h: h.__setitem__(first, [1, 2])), data))
    # a weight stored as integers: moetune converts F32/BF16/F16 only
    def as_i32(h):
        h[first]["dtype"] = "I32"
    ckpt_case("st_weight_int32", first, st=st_bytes(mut(as_i32), data))

    # non-finite weights: training would produce NaN losses from step 1
    b, e = hdr[last]["data_offsets"]
    nan = bytearray(data)
    nan[b:b + 4] = struct.pack("<f", float("nan"))
    ckpt_case("st_weight_nan", last, st=st_bytes(hdr, bytes(nan)))
    inf = bytearray(data)
    inf[b:b + 4] = struct.pack("<f", float("inf"))
    ckpt_case("st_weight_inf", last, st=st_bytes(hdr, bytes(inf)))

    # checkpoint vs config.json
    ckpt_case("st_missing_tensor", "lm_head.weight", st=pack(hdr, data, [k for k in names if k != "lm_head.weight"]))
    ckpt_case("st_wrong_shape", first, st=st_bytes(mut(lambda h: h[first].__setitem__("shape", list(reversed(h[first]["shape"])))), data)
              if hdr[first]["shape"][0] != hdr[first]["shape"][-1] else good)


def checkpoint_cases():
    files = shared_ckpt_files()
    hdr, data = read_st(os.path.join(SHARED, "ckpt", "model.safetensors"))
    names = [k for k in hdr if k != "__metadata__"]
    # split into two shards by tensor
    half = names[: len(names) // 2], names[len(names) // 2:]

    s1, s2 = pack(hdr, data, half[0]), pack(hdr, data, half[1])
    n1, n2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    wm = OrderedDict([(k, n1) for k in half[0]] + [(k, n2) for k in half[1]])
    index = {"metadata": {"total_size": len(data)}, "weight_map": wm}

    def sharded(name, stderr, idx=index, shard1=s1, shard2=s2, pending=None):
        f = {"ckpt/config.json": Link("_shared/ckpt/config.json"), "ckpt/" + n1: shard1,
             "ckpt/model.safetensors.index.json": idx if isinstance(idx, (str, bytes)) else json.dumps(idx, indent=1)}
        if shard2 is not None:
            f["ckpt/" + n2] = shard2
        case(name, stderr, f, yaml=run_yaml(base_model="ckpt"), pending=pending)

    sharded("shard_missing", n2, shard2=None)
    sharded("shard_truncated", n2, shard2=s2[:-10])
    sharded("shard_header_garbage", n2, shard2=b"\x08\0\0\0\0\0\0\0garbage!")
    wm_absent = OrderedDict(wm)
    wm_absent["model.not_there.weight"] = n1
    sharded("index_tensor_not_in_shard", "model.not_there.weight", idx={"weight_map": wm_absent})
    wm_wrong = OrderedDict(wm)
    wm_wrong[half[1][0]] = n1
    sharded("index_tensor_in_other_shard", half[1][0], idx={"weight_map": wm_wrong})
    sharded("index_invalid_json", "model.safetensors.index.json", idx='{"weight_map": {')
    sharded("index_no_weight_map", "weight_map", idx={"metadata": {"total_size": 1}})
    sharded("index_weight_map_list", "weight_map", idx={"weight_map": [n1, n2]})
    wm_esc = OrderedDict(wm)
    wm_esc[half[0][0]] = "../" + n1
    sharded("index_shard_escapes_dir", half[0][0], idx={"weight_map": wm_esc})
    wm_num = OrderedDict(wm)
    wm_num[half[0][0]] = 1
    sharded("index_shard_not_string", half[0][0], idx={"weight_map": wm_num})
    wm_missing = OrderedDict((k, v) for k, v in wm.items() if k != half[1][-1])
    sharded("index_omits_tensor", half[1][-1], idx={"weight_map": wm_missing})

    case("ckpt_dir_missing", "no_such_ckpt", yaml=run_yaml(base_model="no_such_ckpt"))
    case("ckpt_dir_empty", "empty_ckpt", {"empty_ckpt/.keep": ""}, yaml=run_yaml(base_model="empty_ckpt"))
    case("ckpt_is_a_file", "a_file", {"a_file": "not a directory\n"}, yaml=run_yaml(base_model="a_file"))
    case("ckpt_pytorch_bin_only", "pytorch_model.bin",
         {"ckpt/config.json": Link("_shared/ckpt/config.json"), "ckpt/pytorch_model.bin": b"PK\x03\x04"},
         yaml=run_yaml(base_model="ckpt"))


def config_json_cases():
    def cfg(**over):
        c = OrderedDict(TINY_CONFIG)
        for k, v in over.items():
            if v is DROP:
                c.pop(k)
            else:
                c[k] = v
        return c
    CJ = "config.json"
    ckpt_case("cfg_missing", CJ, drop=["ckpt/config.json"])
    ckpt_case("cfg_invalid_json", CJ, config='{"model_type": "mixtral",')
    ckpt_case("cfg_empty", CJ, config="")
    ckpt_case("cfg_root_array", CJ, config="[1, 2]")
    ckpt_case("cfg_is_directory", CJ, drop=["ckpt/config.json"], extra_files={"ckpt/config.json/.keep": ""})
    ckpt_case("cfg_model_type_missing", "model_type", config=cfg(model_type=DROP))
    ckpt_case("cfg_model_type_unsupported", "dbrx", config=cfg(model_type="dbrx"))
    ckpt_case("cfg_model_type_number", "model_type", config=cfg(model_type=7))
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "intermediate_size"):
        ckpt_case(f"cfg_{key}_missing", key, config=cfg(**{key: DROP}))
    # MixtralConfig's default (8 experts), as transformers reads it, disagrees with the checkpoint
    ckpt_case("cfg_num_local_experts_missing", "block_sparse_moe.gate.weight", config=cfg(num_local_experts=DROP))
    for key, val in (("hidden_size", "16"), ("num_hidden_layers", 1.5), ("vocab_size", [32]),
                     ("num_attention_heads", True), ("rms_norm_eps", "small"), ("rope_theta", "big"),
                     ("tie_word_embeddings", "no")):
        ckpt_case(f"cfg_{key}_wrong_type", key, config=cfg(**{key: val}))
    for key, val in (("hidden_size", -16), ("num_hidden_layers", -1), ("vocab_size", 0),
                     ("num_attention_heads", 0), ("intermediate_size", -16), ("num_local_experts", 0),
                     ("num_key_value_heads", -1)):
        ckpt_case(f"cfg_{key}_{'negative' if val < 0 else 'zero'}", key, config=cfg(**{key: val}))
    ckpt_case("cfg_topk_above_experts", "num_experts_per_tok", config=cfg(num_experts_per_tok=3))
    # head_dim = hidden_size // num_attention_heads (as HF): the projections' shapes disagree
    ckpt_case("cfg_heads_not_dividing_hidden", "self_attn.q_proj.weight", config=cfg(num_attention_heads=3))
    ckpt_case("cfg_kv_heads_not_dividing", "num_key_value_heads", config=cfg(num_key_value_heads=3, num_attention_heads=2))
    ckpt_case("cfg_hidden_size_huge", "hidden_size", config=cfg(hidden_size=2 ** 40))
    ckpt_case("cfg_vocab_size_int_overflow", "vocab_size", config=cfg(vocab_size=2 ** 31))
    ckpt_case("cfg_rms_norm_eps_negative", "rms_norm_eps", config=cfg(rms_norm_eps=-1e-5))
    # config.json that disagrees with the checkpoint: shape errors name the tensor
    ckpt_case("cfg_vs_ckpt_intermediate", "experts.0.w1.weight", config=cfg(intermediate_size=24))
    ckpt_case("cfg_vs_ckpt_vocab", "embed_tokens.weight", config=cfg(vocab_size=48))
    ckpt_case("cfg_vs_ckpt_layers", "model.layers.1", config=cfg(num_hidden_layers=2))
    ckpt_case("cfg_vs_ckpt_experts", "block_sparse_moe.gate.weight", config=cfg(num_local_experts=3))


class _Drop:
    pass


DROP = _Drop()


def yaml_cases():
    RY = "run.yaml"
    case("yaml_unclosed_flow", RY, yaml=run_yaml(extra="memory: {device: 8GiB\n"))
    case("yaml_bad_indent", RY, yaml=run_yaml() + "staging:\n  mode: compact\n mode2: x\n")
    case("yaml_tab_indent", RY, yaml=run_yaml() + "staging:\n\tmode: compact\n")
    case("yaml_unterminated_quote", RY, yaml=run_yaml(output_dir='"out'))
    case("yaml_root_list", RY, yaml="- base_model: ckpt\n- max_steps: 1\n")
    case("yaml_root_scalar", RY, yaml="just a string\n")
    case("yaml_empty", RY, yaml="")
    case("yaml_duplicate_key", "max_steps", yaml=run_yaml() + "max_steps: 2\n")
    case("yaml_nul_byte", RY, yaml=run_yaml() + "seed: 1\0\n")
    case("yaml_alias_bomb", RY, yaml=run_yaml() + "".join(
        f"b{i}: &b{i} [" + ",".join([f"*b{i-1}"] * 9) + "]\n" if i else "b0: &b0 [x,x,x,x,x,x,x,x,x]\n" for i in range(10)))
    # nested 100,000 levels (200 KB): refused at the 65th, at once, naming its line
    case("yaml_deep_nesting", "run.yaml:10: nesting deeper than 64 levels",
         yaml=run_yaml() + "model_config: " + "[" * 100000 + "]" * 100000 + "\n")
    case("yaml_missing_file", "nope.yaml", cmd="train nope.yaml")
    case("yaml_is_directory", "adir", {"adir/.keep": ""}, cmd="train adir")
    case("yaml_fifo", "run.yaml", fifo="run.yaml", yaml="")
    # unknown keys, with the nearest valid key suggested
    case("key_typo_top", "micro_batch_sise", yaml=run_yaml(drop=("micro_batch_size",), micro_batch_sise="2"))
    case("key_typo_memory", "devcie", yaml=run_yaml(extra="memory:\n  devcie: 8GiB\n"))
    case("key_typo_staging", "mod", yaml=run_yaml(extra="staging:\n  mod: compact\n"))
    case("key_typo_scheduler", "polcy", yaml=run_yaml(extra="scheduler:\n  polcy: auto\n"))
    case("key_typo_dataset", "pth", yaml=run_yaml(datasets="\n  - pth: ../_shared/data.jsonl"))
    case("key_unknown_section", "optimiser", yaml=run_yaml(extra="optimiser:\n  lr: 1\n"))
    # wrong types
    for key, val in (("learning_rate", "fast"), ("max_steps", "many"), ("micro_batch_size", "[2]"),
                     ("sequence_len", "1.5"), ("bf16", "maybe"), ("datasets", "data.jsonl"),
                     ("memory", "lots"), ("seed", "-1"), ("shuffle", "{a: 1}"), ("weight_decay", "[]")):
        case(f"type_{key}", key, yaml=run_yaml(**{key: val}))
    # out-of-range values
    for key, val in (("micro_batch_size", "0"), ("micro_batch_size", "-1"), ("sequence_len", "0"),
                     ("max_steps", "99999999999999999999"), ("micro_batch_size", "4294967297"),
                     ("gradient_accumulation_steps", "0"), ("learning_rate", "-1.0"),
                     ("warmup_steps", "-1"), ("adam_beta1", "1.5"), ("adam_beta2", "-0.1"),
                     ("adam_epsilon", "-1e-8"), ("max_grad_norm", "-1"), ("logging_steps", "-1"),
                     ("save_steps", "-5"), ("learning_rate", ".nan"), ("learning_rate", ".inf")):
        slug = val.replace("-", "neg").replace(".", "p")
        case(f"range_{key}_{slug}", key, yaml=run_yaml(**{key: val}))
    case("range_memory_device_negative", "memory", yaml=run_yaml(extra="memory:\n  device: -1GiB\n"))
    case("range_memory_device_huge", "memory", yaml=run_yaml(extra="memory:\n  device: 99999999999999EiB\n"))
    case("range_staging_num_slabs_zero", "num_slabs", yaml=run_yaml(extra="staging:\n  num_slabs: 0\n"))
    case("range_compute_threads_negative", "compute_threads", yaml=run_yaml(extra="backend_options:\n  compute_threads: -2\n"))
    # values outside their set
    for key, val in (("lr_scheduler", "sawtooth"), ("backend", "tpu"), ("optimizer", "sgd")):
        case(f"enum_{key}", val, yaml=run_yaml(**{key: val}))
    case("enum_scheduler_policy", "greedy", yaml=run_yaml(extra="scheduler:\n  policy: greedy\n"))
    case("enum_staging_mode", "bigslab", yaml=run_yaml(extra="staging:\n  mode: bigslab\n"))
    # LoRA: refused before training, naming what and where
    case("lora_no_targets", "lora_target_modules", yaml=run_yaml(adapter="lora"))
    case("lora_target_matches_nothing", "gate_proj",
         yaml=run_yaml(adapter="lora", lora_target_modules="[gate_proj]"))
    case("lora_target_bad_regex", "regular expression",
         yaml=run_yaml(adapter="lora", lora_target_modules="'.*q_proj('"))
    case("lora_rank_too_large", "q_proj", yaml=run_yaml(adapter="lora", lora_r="64", lora_target_modules="[q_proj]"))
    case("lora_dropout_out_of_range", "lora_dropout",
         yaml=run_yaml(adapter="lora", lora_dropout="1.5", lora_target_modules="[q_proj]"))
    case("lora_head_target", "lm_head", yaml=run_yaml(adapter="lora", lora_target_modules="[lm_head]"))
    case("lora_keys_without_adapter", "adapter: lora", yaml=run_yaml(merge_lora="true"))
    lora_run = run_yaml(adapter="lora", lora_r="4", lora_alpha="8", lora_target_modules="[q_proj]",
                        lora_model_dir="adapter")
    case("lora_model_dir_missing", "adapter_config.json", yaml=lora_run)
    case("lora_model_dir_is_output_dir", "lora_model_dir",
         {"out/adapter_config.json": adapter_config(), "out/adapter_model.safetensors": adapter_weights(4, 16)},
         yaml=run_yaml(adapter="lora", lora_r="4", lora_alpha="8", lora_target_modules="[q_proj]",
                       lora_model_dir="out"))
    case("lora_adapter_nan", "holds NaN",
         {"adapter/adapter_config.json": adapter_config(),
          "adapter/adapter_model.safetensors": adapter_weights(4, 16, fill=b"\x00\x00\xc0\x7f")}, yaml=lora_run)
    case("lora_adapter_not_json", "adapter_config.json",
         {"adapter/adapter_config.json": "{r: 4,\n", "adapter/adapter_model.safetensors": adapter_weights(4, 16)},
         yaml=lora_run)
    case("lora_adapter_truncated", "adapter_model.safetensors",
         {"adapter/adapter_config.json": adapter_config(),
          "adapter/adapter_model.safetensors": adapter_weights(4, 16)[:-40]}, yaml=lora_run)
    case("lora_adapter_dora", "use_dora",
         {"adapter/adapter_config.json": adapter_config(use_dora=True),
          "adapter/adapter_model.safetensors": adapter_weights(4, 16)}, yaml=lora_run)
    case("lora_adapter_rank_disagrees", "lora_r",
         {"adapter/adapter_config.json": adapter_config(r=8),
          "adapter/adapter_model.safetensors": adapter_weights(8, 16)}, yaml=lora_run)
    case("lora_adapter_shape_mismatch", "lora_A",
         {"adapter/adapter_config.json": adapter_config(),
          "adapter/adapter_model.safetensors": adapter_weights(4, 32)}, yaml=lora_run)
    # PEFT's own transformers-5 files: a fused gate_up at rank 8 where the config says r 4 (no rank_pattern),
    # a rank_pattern that disagrees with a tensor, a target_parameters entry this model has nothing for,
    # and a pattern key in Python-only regex syntax
    fused_run = run_yaml(adapter="lora", lora_r="4", lora_alpha="8", lora_target_modules="[w1, w2, w3]",
                         lora_model_dir="adapter")
    case("lora_adapter_fused_wrong_rank",
         "adapter/adapter_model.safetensors: tensor base_model.model.model.layers.0.mlp.experts.base_layer.lora_A"
         ".weight has shape [16, 16]; expected [8, 16]",
         {"adapter/adapter_config.json": adapter_config(target_modules=[],
                                                        target_parameters=["gate_up_proj", "down_proj"]),
          "adapter/adapter_model.safetensors": fused_weights(8, 4)}, yaml=fused_run)
    case("lora_adapter_rank_pattern_disagrees",
         "adapter/adapter_model.safetensors: tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight "
         "has shape [4, 16]; expected [2, 16]",
         {"adapter/adapter_config.json": adapter_config(rank_pattern={"q_proj": 2}),
          "adapter/adapter_model.safetensors": adapter_weights(4, 16)}, yaml=lora_run)
    case("lora_adapter_unknown_target_parameter",
         "adapter/adapter_config.json: target_parameters entry 'mlp.experts.gate_up_projection'",
         {"adapter/adapter_config.json": adapter_config(target_parameters=["mlp.experts.gate_up_projection"]),
          "adapter/adapter_model.safetensors": adapter_weights(4, 16)}, yaml=lora_run)
    case("lora_adapter_pattern_python_regex", "rank_pattern key 'layers\\.\\d+\\.q_proj'",
         {"adapter/adapter_config.json": adapter_config(rank_pattern={"layers\\.\\d+\\.q_proj": 2}),
          "adapter/adapter_model.safetensors": adapter_weights(4, 16)}, yaml=lora_run)
    # a pattern key POSIX regcomp would expand into gigabytes (found by fuzzing adapter_config.json)
    case("lora_adapter_pattern_stacked_repeats", "rank_pattern key '.*expert+++++q_proj' is refused",
         {"adapter/adapter_config.json": adapter_config(rank_pattern={".*expert+++++q_proj": 2}),
          "adapter/adapter_model.safetensors": adapter_weights(4, 16)}, yaml=lora_run)
    case("lora_target_regex_stacked_repeats", "lora_target_modules: 'q_pro+++++j' is refused",
         yaml=run_yaml(adapter="lora", lora_target_modules="'q_pro+++++j'"))
    case("datasets_empty", "datasets", yaml=run_yaml(datasets="[]"))
    case("base_model_missing_key", "base_model", yaml=run_yaml(drop=("base_model",)))
    case("hardware_unknown_name", "tpu-v9", yaml=run_yaml(hardware="tpu-v9"))
    case("hardware_file_syntax", "bad_hw.yaml", {"bad_hw.yaml": "device: {memory: 80GiB\n"},
         yaml=run_yaml(hardware="bad_hw.yaml"))
    case("hardware_file_unknown_key", "memroy", {"typo_hw.yaml": "name: x\ndevice:\n  memroy: 80GiB\n"},
         yaml=run_yaml(hardware="typo_hw.yaml"))
    # the optional nvme: section of a profile: given, its rates are checked like the others
    good_hw = ("name: x\ndevice: {memory: 80GiB, memory_bandwidth: 2TB/s, memory_bandwidth_achievable: 0.8,\n"
               "  peak_tflops: {fp32: 50, tf32: 400, bf16: 800}, achievable: {fp32: 0.5, tf32: 0.5, bf16: 0.5}}\n"
               "link: {peak_bandwidth: 63GB/s, h2d_achievable: 0.8, d2h_achievable: 0.8, copy_latency_us: 10}\n"
               "host: {memory: 1TiB, pinned: 64GiB, memory_bandwidth: 300GB/s, memory_bandwidth_achievable: 0.6,"
               " cores: 32}\n")
    case("hardware_nvme_bad_bandwidth", "nvme.read: expected a bandwidth",
         {"nvme_hw.yaml": good_hw + "nvme: {read: 26GB, write: 20GB/s, queue_depth: 64}\n"},
         yaml=run_yaml(hardware="nvme_hw.yaml"))
    case("hardware_nvme_missing_key", "missing key 'nvme.write'",
         {"nvme_hw.yaml": good_hw + "nvme: {read: 26GB/s, queue_depth: 64}\n"},
         yaml=run_yaml(hardware="nvme_hw.yaml"))
    case("set_unknown_key", "nosuchkey", cmd="train run.yaml --set nosuchkey=1")
    case("set_wrong_type", "micro_batch_size", cmd="train run.yaml --set micro_batch_size=two")


def tiny_tokenizer(model_type="BPE"):
    """A tokenizer.json whose 32 ids fit the shared tiny model: SentencePiece-style
    BPE without merges over a-z, ChatML's two special tokens among its added ones."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|im_start|>": 3, "<|im_end|>": 4, "\u2581": 5}
    for i, c in enumerate("abcdefghijklmnopqrstuvwxyz"):
        vocab[c] = 6 + i
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for c, i in list(vocab.items())[:5]]
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                       "normalizer": None, "pre_tokenizer": meta, "post_processor": None, "decoder": meta,
                       "model": {"type": model_type, "dropout": None, "unk_token": "<unk>",
                                 "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                                 "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": []}})


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + ' ' + m['content'] + '<|im_end|>' }}{% endfor %}")


def text_data_cases():
    """Text datasets: a conversation with an unknown role, a template that fails, a tokenizer.json of
    a model type moetune does not read, text that is not UTF-8, conversations with nothing to train,
    a tokenizer whose ids do not fit the model."""
    def tcase(name, stderr, rows, tok=None, cfg=None, extra=""):
        files = {"tok/tokenizer.json": tok or tiny_tokenizer(),
                 "tok/tokenizer_config.json": json.dumps(cfg or {"eos_token": "<|im_end|>", "chat_template": CHATML}),
                 "chats.jsonl": rows}
        case(name, stderr, files, yaml=run_yaml(datasets="\n  - path: chats.jsonl\n    type: chat_template",
                                                extra="tokenizer_config: tok\n" + extra))
    conv = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n"
    tcase("chat_unknown_role", "chats.jsonl:2: message 0 has role 'wizard'",
          conv + json.dumps({"messages": [{"role": "wizard", "content": "x"}]}) + "\n")
    tcase("chat_template_raises", "chats.jsonl:1: the chat template failed",
          conv, cfg={"eos_token": "<|im_end|>", "chat_template": "{{ raise_exception('system prompts only') }}"})
    tcase("chat_template_syntax", "tok/tokenizer_config.json", conv,
          cfg={"eos_token": "<|im_end|>", "chat_template": "{% for m in messages %}{{ m.content }"})
    tcase("tokenizer_unknown_model", "WordPiece", conv, tok=tiny_tokenizer("WordPiece"))
    tcase("chat_not_utf8", "chats.jsonl:2", conv.encode() + b'{"messages": [{"role": "user", "content": "' + bytes([0xff, 0xfe]) + b'"}]}\n')
    tcase("chat_nothing_trained", "no example has a token to learn",
          json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    tcase("chat_messages_missing", "chats.jsonl:1: \"messages\" is missing", '{"conversations": []}\n')
    tcase("chat_template_jinja_without_text", "chat_template_jinja", conv, extra="chat_template: jinja\n")
    wide = json.loads(tiny_tokenizer())
    wide["model"]["vocab"]["zz"] = 40
    wide["model"]["merges"] = [["z", "z"]]
    tcase("chat_tokenizer_beyond_vocab", "outside the model's vocabulary of 32",
          json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "zz"}]}) + "\n",
          tok=json.dumps(wide))


def data_cases():
    def dcase(name, stderr, content, fn="data.jsonl", pending=None):
        case(name, stderr, {fn: content}, yaml=run_yaml(datasets=f"\n  - path: {fn}"), pending=pending)
    ok = '{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]}\n'
    dcase("data_bad_json_line", "data.jsonl:3", ok * 2 + '{"input_ids": [1, 2,\n' + ok)
    dcase("data_token_too_large", "data.jsonl:2", ok + '{"input_ids": [1, 2, 32]}\n')
    dcase("data_token_negative", "data.jsonl:1", '{"input_ids": [1, -2, 3]}\n' + ok)
    dcase("data_token_beyond_int32", "data.jsonl:1", '{"input_ids": [1, 4294967297]}\n' + ok)
    dcase("data_token_float", "data.jsonl:1", '{"input_ids": [1, 2.5]}\n' + ok)
    dcase("data_token_string", "data.jsonl:2", ok + '{"input_ids": ["1", "2"]}\n')
    dcase("data_input_ids_missing", "data.jsonl:1", '{"text": "hello"}\n' + ok)
    dcase("data_input_ids_not_list", "data.jsonl:1", '{"input_ids": 5}\n' + ok)
    dcase("data_input_ids_empty", "data.jsonl:1", '{"input_ids": []}\n' + ok)
    dcase("data_line_is_array", "data.jsonl:2", ok + '[1, 2, 3]\n')
    dcase("data_labels_length", "data.jsonl:1", '{"input_ids": [1, 2, 3], "labels": [1, 2]}\n' + ok)
    dcase("data_mask_length", "data.jsonl:1", '{"input_ids": [1, 2, 3], "attention_mask": [1, 1]}\n' + ok)
    dcase("data_mask_value", "data.jsonl:1", '{"input_ids": [1, 2, 3], "attention_mask": [1, 2, 1]}\n' + ok)
    dcase("data_label_out_of_range", "data.jsonl:1", '{"input_ids": [1, 2, 3], "labels": [1, 99, 3]}\n' + ok)
    dcase("data_no_labels_at_all", "data.jsonl", '{"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}\n' * 4)
    dcase("data_empty_file", "data.jsonl", "")
    dcase("data_blank_lines", "data.jsonl", "\n\n\n")
    dcase("data_unknown_extension", "data.txt", "1 2 3\n", fn="data.txt")
    case("data_missing_file", "nowhere.jsonl", yaml=run_yaml(datasets="\n  - path: nowhere.jsonl"))
    case("data_is_directory", "ddir", {"ddir/.keep": ""}, yaml=run_yaml(datasets="\n  - path: ddir"))
    case("data_fifo", "data.jsonl", fifo="data.jsonl", yaml=run_yaml(datasets="\n  - path: data.jsonl"))

    def bin_hdr(magic, version, count):
        return struct.pack("<256i", magic, version, count, *([0] * 253))
    toks = list(range(1, 30))
    dcase("bin_bad_magic", "data.bin", bin_hdr(20240521, 1, len(toks)) + struct.pack(f"<{len(toks)}H", *toks), fn="data.bin")
    dcase("bin_bad_version", "data.bin", bin_hdr(20240801, 1, len(toks)) + struct.pack(f"<{len(toks)}I", *toks), fn="data.bin")
    dcase("bin_short_header", "data.bin", bin_hdr(20240520, 1, 4)[:100], fn="data.bin")
    dcase("bin_count_beyond_file", "data.bin", bin_hdr(20240520, 1, 1000) + struct.pack(f"<{len(toks)}H", *toks), fn="data.bin")
    dcase("bin_count_negative", "data.bin", bin_hdr(20240520, 1, -5) + struct.pack(f"<{len(toks)}H", *toks), fn="data.bin")
    dcase("bin_token_out_of_range", "data.bin", bin_hdr(20240801, 7, len(toks)) + struct.pack(f"<{len(toks)}I", *(toks[:-1] + [70000])), fn="data.bin")
    dcase("bin_too_few_tokens", "data.bin", bin_hdr(20240520, 1, 4) + struct.pack("<4H", 1, 2, 3, 4), fn="data.bin")
    dcase("bin_odd_payload", "data.bin", bin_hdr(20240520, 1, len(toks)) + struct.pack(f"<{len(toks)}H", *toks) + b"\x01", fn="data.bin")


def output_cases():
    case("out_equals_base_model", "output_dir", files=shared_ckpt_files(),
         yaml=run_yaml(base_model="ckpt", output_dir="ckpt"))
    case("out_equals_base_model_slash", "output_dir", files=shared_ckpt_files(),
         yaml=run_yaml(base_model="ckpt", output_dir="./ckpt/"))
    case("out_is_a_file", "out_file", {"out_file": "precious\n"}, yaml=run_yaml(output_dir="out_file"))
    case("out_parent_is_a_file", "blocker", {"blocker": "precious\n"}, yaml=run_yaml(output_dir="blocker/out"))


def inspect_cases():
    case("inspect_missing_dir", "no_such_dir", cmd="inspect no_such_dir")
    f = shared_ckpt_files()
    f["ckpt/model.safetensors"] = shared_bytes("_shared/ckpt/model.safetensors")[:30]
    case("inspect_truncated", "model.safetensors", f, cmd="inspect ckpt")

# --- quantized checkpoints and the other families' config.json ---------------

FIXTURES = os.path.join(HERE, "..", "fixtures")


def fixture_ckpt(name):
    """_shared/<name>/: the reference fixture's config.json and weights (DeepSeek-V3, gpt-oss)."""
    d = os.path.join(SHARED, name)
    os.makedirs(d, exist_ok=True)
    for fn in ("config.json", "model.safetensors"):
        shutil.copyfile(os.path.join(FIXTURES, "ref_" + name, "ckpt", fn), os.path.join(d, fn))
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f, object_pairs_hook=OrderedDict)
    return cfg, read_st(os.path.join(d, "model.safetensors"))


def family_case(name, stderr, family, config=None, st=None):
    files = {"ckpt/config.json": Link(f"_shared/{family}/config.json") if config is None else json.dumps(config, indent=1),
             "ckpt/model.safetensors": Link(f"_shared/{family}/model.safetensors") if st is None else st}
    case(name, stderr, files, yaml=run_yaml(base_model="ckpt"))


def as_fp8(hdr, data, name, scale=None, scale_shape=(1, 1), scale_dtype="F32"):
    """(hdr, data) with `name` (an fp32 2-D weight, every |x| < 448) as F8_E4M3 bytes (0x38 = 1.0, the values
    themselves do not matter here) and, unless scale is None, NAME_scale_inv of scale_shape filled with scale."""
    h = OrderedDict((k, dict(v)) for k, v in hdr.items() if k != "__metadata__")
    pieces = OrderedDict()
    for k in h:
        b, e = h[k]["data_offsets"]
        pieces[k] = data[b:e]
    rows, cols = h[name]["shape"]
    h[name]["dtype"] = "F8_E4M3"
    pieces[name] = b"\x38" * (rows * cols)
    if scale is not None:
        n = scale_shape[0] * scale_shape[1]
        h[name + "_scale_inv"] = {"dtype": scale_dtype, "shape": list(scale_shape)}
        pieces[name + "_scale_inv"] = struct.pack(f"<{n}f", *([scale] * n)) if scale_dtype == "F32" else b"\0" * n
    out, off, blob = OrderedDict(), 0, b""
    for k, v in h.items():
        out[k] = dict(v, data_offsets=[off, off + len(pieces[k])])
        blob += pieces[k]
        off += len(pieces[k])
    return st_bytes(out, blob)


def add_tensors(hdr, data, extra):
    """(hdr, data) with the tensors of `extra` ({name: (dtype, shape, bytes)}) appended."""
    h = OrderedDict((k, v) for k, v in hdr.items() if k != "__metadata__")
    off = len(data)
    for k, (dt, shape, raw) in extra.items():
        h[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    return st_bytes(h, data)


def quant_cases():
    # FP8 (DeepSeek-V3 / GLM's quant_method fp8) on the tiny Mixtral: the checks do not depend on the family
    hdr, data = read_st(os.path.join(SHARED, "ckpt", "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    ckpt_case("fp8_scale_inv_missing", q + "_scale_inv", st=as_fp8(hdr, data, q))
    ckpt_case("fp8_scale_inv_zero", q + "_scale_inv", st=as_fp8(hdr, data, q, scale=0.0))
    ckpt_case("fp8_scale_inv_negative", q + "_scale_inv", st=as_fp8(hdr, data, q, scale=-1.0))
    ckpt_case("fp8_scale_inv_nan", q + "_scale_inv", st=as_fp8(hdr, data, q, scale=float("nan")))
    ckpt_case("fp8_scale_inv_inf", q + "_scale_inv", st=as_fp8(hdr, data, q, scale=float("inf")))
    ckpt_case("fp8_scale_inv_wrong_shape", q + "_scale_inv", st=as_fp8(hdr, data, q, scale=1.0, scale_shape=(2, 1)))
    ckpt_case("fp8_scale_inv_int", q + "_scale_inv", st=as_fp8(hdr, data, q, scale=1.0, scale_dtype="U8"))
    # block scales beside a weight that is not FP8: nothing reads them
    o = "model.layers.0.self_attn.o_proj.weight"
    ckpt_case("fp8_scale_inv_beside_f32", o + "_scale_inv",
              st=add_tensors(hdr, data, {o + "_scale_inv": ("F32", [1, 1], struct.pack("<f", 1.0))}))

    # MXFP4 (gpt-oss): gate_up_proj (E=4, C=32, R=48) as _blocks (4, 48, 1, 16) and _scales (4, 48, 1)
    _, (ghdr, gdata) = fixture_ckpt("gpt_oss")
    gu = "model.layers.0.mlp.experts.gate_up_proj"
    blocks = ("U8", [4, 48, 1, 16], b"\x22" * (4 * 48 * 16))
    scales = ("U8", [4, 48, 1], b"\x7f" * (4 * 48))
    plain = [k for k in ghdr if k != "__metadata__" and k != gu]
    without = pack(ghdr, gdata, plain)
    whdr, wdata = read_st_bytes(without)
    family_case("mxfp4_beside_plain_tensor", gu + "_blocks", "gpt_oss",
                st=add_tensors(ghdr, gdata, {gu + "_blocks": blocks, gu + "_scales": scales}))
    family_case("mxfp4_scales_missing", gu + "_scales", "gpt_oss", st=add_tensors(whdr, wdata, {gu + "_blocks": blocks}))
    family_case("mxfp4_blocks_missing", gu + "_blocks", "gpt_oss", st=add_tensors(whdr, wdata, {gu + "_scales": scales}))
    family_case("mxfp4_blocks_bad_shape", gu + "_blocks", "gpt_oss",
                st=add_tensors(whdr, wdata, {gu + "_blocks": ("U8", [4, 48, 2, 8], blocks[2]), gu + "_scales": scales}))
    family_case("mxfp4_scales_not_u8", gu + "_scales", "gpt_oss",
                st=add_tensors(whdr, wdata, {gu + "_blocks": blocks, gu + "_scales": ("F32", [4, 48, 1], b"\0" * (4 * 48 * 4))}))
    family_case("mxfp4_scales_nan", gu + "_scales", "gpt_oss",
                st=add_tensors(whdr, wdata, {gu + "_blocks": blocks, gu + "_scales": ("U8", [4, 48, 1], b"\xff" * (4 * 48))}))


def bnb4_cases():
    """A checkpoint bitsandbytes stored in 4 bits (q_proj 16 x 16: 128 code bytes, 4 blocks of 64), damaged."""
    hdr, data = read_st(os.path.join(SHARED, "ckpt", "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    keep = [k for k in hdr if k != "__metadata__" and k != q]
    whdr, wdata = read_st_bytes(pack(hdr, data, keep))
    state = OrderedDict([("quant_type", "nf4"), ("blocksize", 64), ("dtype", "float32"), ("shape", [16, 16])])
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    config = OrderedDict(list(TINY_CONFIG.items()) + [("quantization_config", qc)])

    def parts(drop=(), **over):
        st = json.dumps(OrderedDict(state, **over)).encode()
        p = OrderedDict([(q, ("U8", [128, 1], b"\x77" * 128)),
                         (q + ".absmax", ("F32", [4], struct.pack("<4f", 0.1, 0.2, 0.3, 0.4))),
                         (q + ".quant_map", ("F32", [16], b"\0" * 64)),
                         (q + ".quant_state.bitsandbytes__nf4", ("U8", [len(st)], st))])
        for d in drop:
            p.pop(q + d)
        return add_tensors(whdr, wdata, p)
    ckpt_case("bnb4_absmax_missing", q + ".absmax", st=parts(drop=(".absmax",)), config=config)
    ckpt_case("bnb4_quant_state_missing", q + ".quant_state", st=parts(drop=(".quant_state.bitsandbytes__nf4",)),
              config=config)
    ckpt_case("bnb4_quant_state_shape", "implies [16, 16] for '" + q, st=parts(shape=[8, 32]), config=config)
    ckpt_case("bnb4_quant_type_bogus", "quant_type \"int4\"", st=parts(quant_type="int4"), config=config)
    ckpt_case("bnb4_blocksize_unsupported", "blocksize 100", st=parts(blocksize=100), config=config)


def read_st_bytes(raw):
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n], object_pairs_hook=OrderedDict), raw[8 + n:]


def family_config_cases():
    """config.json values that were replaced without a word: each is used as given or refused naming the key."""
    ds, _ = fixture_ckpt("deepseek_v3")
    go, _ = fixture_ckpt("gpt_oss")

    def with_(base, **over):
        c = OrderedDict(base)
        c.update(over)
        return c
    for key, val in (("routed_scaling_factor", 0.0), ("routed_scaling_factor", -2.5), ("n_group", 0),
                     ("topk_group", 0), ("qk_rope_head_dim", 5)):
        tag = "zero" if val == 0 else ("negative" if val < 0 else "odd")
        family_case(f"cfg_dsv3_{key}_{tag}", f"'{key}' = ", "deepseek_v3", config=with_(ds, **{key: val}))
    family_case("cfg_gpt_oss_sliding_window_zero", "'sliding_window' = 0", "gpt_oss", config=with_(go, sliding_window=0))
    ckpt_case("cfg_mixtral_sliding_window_zero", "'sliding_window' = 0",
              config=OrderedDict(list(TINY_CONFIG.items()) + [("sliding_window", 0)]))
    # quantization_config: read formats pass, the rest are refused by quant_method
    for tag, qc, want in (("unknown", {"quant_method": "hqq", "nbits": 4}, "unknown quant_method \"hqq\""),
                          ("bitsandbytes", {"quant_method": "bitsandbytes", "load_in_8bit": True}, "load_in_8bit"),
                          ("missing", {"bits": 4}, "quant_method is missing")):
        ckpt_case(f"cfg_quant_method_{tag}", want,
                  config=OrderedDict(list(TINY_CONFIG.items()) + [("quantization_config", qc)]))


def run_key_cases():
    case("dataset_type_unknown", "completion, pretrain, chat_template",
         yaml=run_yaml(datasets="\n  - path: ../_shared/data.jsonl\n    type: bogus"))
    case("devices_ordinal_out_of_range", "ordinal 1000", yaml=run_yaml(devices="[0, 1000]", gradient_accumulation_steps="2"))
    # the host model alone is larger than a 1 KiB host budget
    case("memory_host_too_small", "host memory is short", yaml=run_yaml(extra="memory:\n  host: 1KiB\n"))
    # a quantised base: load_in_4bit needs a LoRA run; load_in_8bit is refused
    qlora = dict(adapter="lora", lora_r="4", lora_alpha="8", lora_target_modules="[q_proj]")
    case("load_in_4bit_skip_modules_not_list", "llm_int8_skip_modules: expected a list of module names",
         yaml=run_yaml(load_in_4bit="true", llm_int8_skip_modules="o_proj", **qlora))
    case("load_in_4bit_full_finetune", "needs adapter: lora", yaml=run_yaml(load_in_4bit="true"))
    case("load_in_8bit", "load_in_8bit: true is not supported", yaml=run_yaml(load_in_8bit="true", **qlora))
    case("bnb_4bit_quant_type_unknown", "nf4, fp4", yaml=run_yaml(bnb_4bit_quant_type="int4", **qlora))


# --- resuming: a real run's checkpoint-2, each case altering one thing ------------

def make_resume_runs(moetune):
    """Trains the tiny model 3 steps (full and LoRA, a checkpoint every step)
    and keeps each run's checkpoint-2 in _shared/ as what the resume cases
    alter; run once with --moetune when the checkpoint format changes."""
    import subprocess
    import tempfile
    for name, extra in (("run", ""), ("lora_run", "adapter: lora\nlora_r: 4\nlora_alpha: 8\nlora_target_modules: [q_proj]\n")):
        with tempfile.TemporaryDirectory() as t:
            y = run_yaml(base_model=os.path.join(SHARED, "ckpt"), output_dir=os.path.join(t, "out"), max_steps="3",
                         datasets=f"\n  - path: {os.path.join(SHARED, 'data.jsonl')}", save_steps="1") + extra
            with open(os.path.join(t, "run.yaml"), "w") as f:
                f.write(y)
            subprocess.run([moetune, "train", os.path.join(t, "run.yaml")], check=True, capture_output=True)
            dst = os.path.join(SHARED, name, "checkpoint-2")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(os.path.join(t, "out", "checkpoint-2"), dst)


def resume_files(run="run", n=2, alter=None):
    """checkpoint-N/ of the case: _shared's checkpoint-2, its files linked but
    for those in `alter` (name -> bytes or str)."""
    src = os.path.join(SHARED, run, "checkpoint-2")
    files = {f"ckpt/checkpoint-{n}/{fn}": Link(f"_shared/{run}/checkpoint-2/{fn}") for fn in sorted(os.listdir(src))}
    for fn, content in (alter or {}).items():
        files[f"ckpt/checkpoint-{n}/{fn}"] = content
    return files


def trainer_state(edit, run="run"):
    """_shared's trainer_state.json after edit(state)."""
    st = json.loads(shared_bytes(f"_shared/{run}/checkpoint-2/trainer_state.json"), object_pairs_hook=OrderedDict)
    edit(st)
    return json.dumps(st, indent=1)


def optimizer_with(name, values):
    """_shared's optimizer.safetensors with tensor `name` rewritten in place
    (same size and save id, so the completion manifest still matches):
    values(n) gives its new bytes."""
    raw = bytearray(shared_bytes("_shared/run/checkpoint-2/optimizer.safetensors"))
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    b, e = hdr[name]["data_offsets"]
    new = values(e - b)
    assert len(new) == e - b
    raw[8 + n + b:8 + n + e] = new
    return bytes(raw)


def resume_yaml(n=2, extra="", **over):
    return run_yaml(extra=extra, resume_from_checkpoint=f"ckpt/checkpoint-{n}", **dict(dict(max_steps="3"), **over))


def step_cases():
    """Values that would be trained on as non-finite, refused before any save."""
    case("optim_adam_epsilon_zero", "adam_epsilon: 0; expected a positive number",
         yaml=run_yaml(adam_epsilon="0"))
    case("optim_learning_rate_huge", "learning_rate: 1e+38 is above 1",
         yaml=run_yaml(learning_rate="1.0e38", save_steps="1", max_steps="2"))
    emb = "model.embed_tokens.weight"
    nan = lambda n: struct.pack("<f", float("nan")) + bytes(n - 4)
    case("resume_exp_avg_nan", f"tensor '{emb}.exp_avg' holds NaN at [0, 0]",
         resume_files(alter={"optimizer.safetensors": optimizer_with(emb + ".exp_avg", nan)}), yaml=resume_yaml())
    neg = lambda n: bytes(4) + struct.pack("<f", -1.0) + bytes(n - 8)
    case("resume_exp_avg_sq_negative", f"tensor '{emb}.exp_avg_sq' holds -1 at [0, 1]",
         resume_files(alter={"optimizer.safetensors": optimizer_with(emb + ".exp_avg_sq", neg)}), yaml=resume_yaml())
    # finite state whose next update overflows: stops at step 3, naming the
    # resumed checkpoint as the last good one, saving nothing (a run that
    # trains writes metrics.jsonl: into a new output_dir here)
    huge = lambda n: struct.pack(f"<{n // 4}f", *([3.0e38] * (n // 4)))
    # (resident weights: the host updates in the step, whatever the
    # machine's calibration would plan; streamed ones are the deferred cases below)
    case("resume_update_overflows", f"step 3: the AdamW update left parameter '{emb}' -Inf",
         resume_files(alter={"optimizer.safetensors": optimizer_with(emb + ".exp_avg", huge)}),
         yaml=resume_yaml(save_steps="1", max_steps="4", output_dir="out_resumed",
                          extra="scheduler:\n  weights: resident\n  optimizer: host\n"))
    case("resume_update_overflows_device_optimizer", f"step 3: the AdamW update left parameter '{emb}' -Inf",
         resume_files(alter={"optimizer.safetensors": optimizer_with(emb + ".exp_avg", huge)}),
         yaml=resume_yaml(save_steps="1", max_steps="4", output_dir="out_resumed",
                          extra="scheduler:\n  weights: resident\n  optimizer: device\n"))
    # streamed weights with host gradients and AdamW: the update runs on the
    # host worker after the step returns; the next step reports it, and a
    # save due first refuses to write it
    stream = "scheduler:\n  weights: stream\n  grads: host\n  optimizer: host\n"
    case("resume_update_overflows_deferred",
         f"step 4: the AdamW update of the previous step left parameter '{emb}' -Inf",
         resume_files(alter={"optimizer.safetensors": optimizer_with(emb + ".exp_avg", huge)}),
         yaml=resume_yaml(max_steps="5", output_dir="out_resumed", extra=stream))
    case("resume_update_overflows_deferred_save", f"parameter '{emb}' holds -Inf at [0, 0]",
         resume_files(alter={"optimizer.safetensors": optimizer_with(emb + ".exp_avg", huge)}),
         yaml=resume_yaml(save_steps="1", max_steps="5", output_dir="out_resumed", extra=stream))
    expert = "model.layers.0.block_sparse_moe.experts.0.w1.weight.step"
    for tag, v in (("negative", -5), ("huge", 2 ** 62)):
        case(f"resume_expert_step_{tag}", f"tensor '{expert}' is {v}; expected a step count from 0",
             resume_files(alter={"optimizer.safetensors": optimizer_with(expert, lambda n, v=v: struct.pack("<q", v))}),
             yaml=resume_yaml())


def trainer_state_cases():
    """trainer_state.json's values taken for what they say, or refused."""
    def setk(k, v):
        return lambda st: st.__setitem__(k, v)
    case("resume_global_step_string", "trainer_state.json: key 'global_step' is \"2\"; expected an integer",
         resume_files(alter={"trainer_state.json": trainer_state(setk("global_step", "2"))}), yaml=resume_yaml())
    case("resume_global_step_missing", "trainer_state.json: key 'global_step' is nothing",
         resume_files(alter={"trainer_state.json": trainer_state(lambda st: st.pop("global_step"))}),
         yaml=resume_yaml())
    case("resume_global_step_behind", "trainer_state.json: key 'global_step' is 1; expected 2",
         resume_files(alter={"trainer_state.json": trainer_state(setk("global_step", 1))}), yaml=resume_yaml())
    case("resume_global_step_past_max", "trainer_state.json: key 'global_step' is 50; expected at most 3",
         resume_files(n=50, alter={"trainer_state.json": trainer_state(setk("global_step", 50))}),
         yaml=resume_yaml(n=50))
    case("resume_cursor_float", "trainer_state.json: key 'data.cursor' is 2.5",
         resume_files(alter={"trainer_state.json": trainer_state(lambda st: st["data"].__setitem__("cursor", 2.5))}),
         yaml=resume_yaml())


def resume_adapter_cases():
    """A resume whose adapter settings are not the checkpoint's names them."""
    case("resume_lora_by_full_run", "is a LoRA adapter checkpoint", resume_files(run="lora_run"),
         yaml=resume_yaml())
    lora = dict(adapter="lora", lora_r="8", lora_alpha="8", lora_target_modules="[q_proj]")
    case("resume_lora_r_changed", "lora_r is 8, but the checkpoint being resumed has r 4",
         resume_files(run="lora_run"), yaml=resume_yaml(**lora))


def main():
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--moetune":
        make_resume_runs(os.path.abspath(sys.argv[2]))
    for name in os.listdir(HERE):
        p = os.path.join(HERE, name)
        if os.path.isdir(p) and name != "_shared":
            shutil.rmtree(p)
    safetensors_cases()
    checkpoint_cases()
    config_json_cases()
    yaml_cases()
    data_cases()
    output_cases()
    inspect_cases()
    step_cases()
    trainer_state_cases()
    resume_adapter_cases()
    quant_cases()
    bnb4_cases()
    family_config_cases()
    run_key_cases()
    text_data_cases()
    seen = set()
    for name, stderr, files, cmd, fifo, pending in CASES:
        assert name not in seen, name
        seen.add(name)
        d = os.path.join(HERE, name)
        os.makedirs(d)
        for rel, content in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if isinstance(content, Link):
                os.symlink(os.path.relpath(os.path.join(HERE, content), os.path.dirname(p)), p)
                continue
            with open(p, "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
        with open(os.path.join(d, "expect"), "w") as f:
            f.write("exit 1\n")
            f.write(f"stderr {stderr}\n")
            if cmd:
                f.write(f"cmd {cmd}\n")
            if fifo:
                f.write(f"fifo {fifo}\n")
            if pending:
                f.write(f"pending {pending}\n")
    print(f"{len(CASES)} cases, {sum(1 for c in CASES if c[5])} pending")


if __name__ == "__main__":
    main()

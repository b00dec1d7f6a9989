"""Does PEFT on transformers 5 load everything moetune saves, and compute
with it what moetune computes?

For each case: `moetune train` on the fixture's run.yaml (with the case's
extra settings) into a temporary output_dir, then:

  * weights: PeftModel.from_pretrained(HF model from ckpt/, output_dir), and
    every lora weight PEFT holds is compared with what moetune's file says
    it should be: per-expert keys (`…experts.3.w1.lora_A.weight`) fused as
    PEFT documents (A's stacked gate then up along the rank, B
    block-diagonal; lora_A (E·r, in) read (E, r, in), lora_B (out, E·r) read
    (out, r, E)), Mixtral's `block_sparse_moe` read as transformers 5's
    `mlp`, everything else by name.  Reported: file tensors PEFT has no
    place for ("dropped"), PEFT adapter weights no file tensor filled
    ("not loaded"), and the largest difference of the rest;
  * function: a second `moetune train` that starts from the saved adapter
    (lora_model_dir = that output_dir, one step of one micro-batch) logs the
    loss of the first micro-batch with that adapter; PEFT's loss on the same rows with the
    same adapter is compared with it (relative difference);
  * moetune's warnings at save (what it says PEFT will drop, and why).

Prints one JSON line per case and a summary, writes them to
tests/fixtures/lora_peft_save_check.json, and exits 1 when a case has a
dropped tensor, an unloaded weight, a weight difference or a loss difference
above 1e-5 relative that moetune did not warn about.

Run: /work/venv/bin/python tests/reference/check_peft_moetune_save.py bazel-bin/tools/moetune
(transformers 5.24, peft 0.21.2 when written).  Not part of CI.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

PREFIX = "base_model.model."
GATE, UP, DOWN = ("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")

# (fixture, extra --set assignments, what the case shows)
CASES = [
    ("lora_mixtral_attn", [], "attention only"),
    ("lora_qwen3_experts", [], "per-expert routed adapters under rsLoRA"),
    ("lora_qwen2_all", [], "every linear layer: shared expert, dense layer, routed experts"),
    ("lora_deepseek_v3_mla", [], "MLA projections"),
    ("lora_peft_mixtral_fused", [], "PEFT's fused adapter continued (rank_pattern from PEFT)"),
    ("lora_peft_qwen3_fused", [], "PEFT's fused adapter continued (user patterns, rsLoRA)"),
    ("lora_qwen3_dense_first", [], "dense first layer, experts and q_proj"),
    ("lora_qwen3_dense_first", ["lora_target_modules=model\\.layers\\.1\\..*_proj"],
     "a regex that skips the dense layer"),
    ("lora_qwen3_dense_first", ["lora_target_modules=.*\\.experts\\.[0-9]+\\.(gate|up|down)_proj"],
     "a regex naming the experts by index"),
    ("lora_qwen3_dense_first", ["lora_target_modules=[gate_proj, up_proj, down_proj]", "use_rslora=true"],
     "MLPs only, rsLoRA"),
    ("lora_qwen3_dense_first", ["lora_dropout=0.1"], "dropout: PEFT's ParamWrapper refuses it (moetune warns)"),
    ("lora_qwen3_dense_first", ["lora_target_modules=.*\\.experts\\.[01]\\.(gate|up|down)_proj"],
     "two of four experts (moetune warns)"),
]


def run_moetune(moetune, work, sets):
    cmd = [moetune, "train", "run.yaml", "--set", "progress=false"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"moetune {' '.join(sets)}: exit {p.returncode}: {p.stderr[-800:]}")
    return p.stderr


def first_loss(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as fh:
        for line in fh:
            j = json.loads(line)
            if "loss" in j:
                return j["loss"]
    raise RuntimeError(f"{out_dir}: no loss logged")


def expected_weights(file, num_experts):
    """What PEFT on transformers 5 should hold for each adapter weight of
    moetune's file (keys as PEFT names its parameters, less '.default')."""
    want, per_expert = {}, {}
    for k, v in file.items():
        name = k.replace(".block_sparse_moe.", ".mlp.")
        m = re.fullmatch(r"(.*\.experts)\.(\d+)\.(\w+)\.lora_([AB])\.weight", name)
        if not m:
            want[name] = (v, [k])
            continue
        pre, e, leaf, ab = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        which = "gate" if leaf in GATE else "up" if leaf in UP else "down"
        per_expert.setdefault(pre, {}).setdefault((which, ab), {})[e] = (v, k)
    for pre, parts in per_expert.items():
        E = num_experts
        if ("down", "A") in parts:
            A = torch.stack([parts[("down", "A")][e][0] for e in range(E)])        # (E, r, I)
            B = torch.stack([parts[("down", "B")][e][0] for e in range(E)], -1)    # (H, r, E)
            keys = [parts[(("down", ab))][e][1] for ab in "AB" for e in range(E)]
            want[f"{pre}.lora_A.weight"] = (A.reshape(-1, A.shape[-1]), keys)
            want[f"{pre}.lora_B.weight"] = (B.reshape(B.shape[0], -1), keys)
        if ("gate", "A") in parts:
            A = torch.stack([torch.cat([parts[("gate", "A")][e][0], parts[("up", "A")][e][0]]) for e in range(E)])
            B = torch.stack([torch.block_diag(parts[("gate", "B")][e][0], parts[("up", "B")][e][0])
                             for e in range(E)], -1)
            keys = [parts[(w, ab)][e][1] for w in ("gate", "up") for ab in "AB" for e in range(E)]
            want[f"{pre}.base_layer.lora_A.weight"] = (A.reshape(-1, A.shape[-1]), keys)
            want[f"{pre}.base_layer.lora_B.weight"] = (B.reshape(B.shape[0], -1), keys)
    return want


def check_weights(ckpt, adapter_dir, num_experts):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, adapter_dir)
    held = {n.replace(".default", ""): p.detach() for n, p in model.named_parameters() if ".lora_" in n}
    file = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    want = expected_weights({k: v for k, v in file.items() if ".lora_" in k}, num_experts)
    dropped, diff, used = [], 0.0, set()
    for name, (v, keys) in want.items():
        if name not in held or held[name].shape != v.shape:
            dropped += keys
            continue
        used.add(name)
        diff = max(diff, (held[name] - v).abs().max().item())
    not_loaded = sorted(n for n in held if n not in used)
    peft_warnings = sorted({str(w.message)[:200] for w in caught if "lora" in str(w.message).lower()
                            or "missing" in str(w.message).lower()})
    return model, sorted(set(dropped)), not_loaded, diff, peft_warnings


def peft_loss(model, rows):
    ids, labels, mask = mf.batch_tensors(rows, [0, 1])
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()


def moetune_warnings(stderr):
    return [l.strip() for l in stderr.splitlines() if "PEFT" in l and ("warning" in l.lower() or "drop" in l.lower())]


def run_case(moetune, fixture, sets, what):
    d = os.path.join(mf.FIXTURES, fixture)
    with open(os.path.join(d, "data.jsonl")) as fh:  # moetune's first micro-batch: rows 0 and 1
        rows = mf.rows_from_examples([json.loads(line) for line in fh if line.strip()])
    entry = {"case": fixture, "sets": sets, "what": what}
    cfg = json.load(open(os.path.join(d, "ckpt", "config.json")))
    E = cfg.get("num_local_experts", cfg.get("num_experts", cfg.get("n_routed_experts", 0)))
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, fixture)
        shutil.copytree(d, work, ignore=shutil.ignore_patterns("out"))
        try:
            err = run_moetune(moetune, work, sets + ["output_dir=saved"])
        except RuntimeError as e:  # moetune refusing the case is a finding too
            entry.update(moetune_error=str(e)[-400:], peft_loads_everything=False, ok=False)
            return entry
        entry["moetune_warnings"] = moetune_warnings(err)
        saved = os.path.join(work, "saved")
        acfg = json.load(open(os.path.join(saved, "adapter_config.json")))
        entry["saved_config"] = {k: acfg.get(k) for k in ("r", "lora_alpha", "use_rslora", "target_modules",
                                                          "target_parameters", "rank_pattern", "alpha_pattern")}
        run_moetune(moetune, work, sets + ["lora_model_dir=saved", "max_steps=1", "gradient_accumulation_steps=1",
                                          "output_dir=again"])
        entry["moetune_loss"] = first_loss(os.path.join(work, "again"))
        try:
            model, dropped, not_loaded, diff, pw = check_weights(os.path.join(d, "ckpt"), saved, E)
            entry.update(dropped=dropped, not_loaded=not_loaded, max_weight_diff=diff, peft_warnings=pw)
            entry["peft_loss"] = peft_loss(model, rows)
            entry["loss_rel_diff"] = abs(entry["peft_loss"] - entry["moetune_loss"]) / abs(entry["moetune_loss"])
        except Exception as e:  # recorded: PEFT refusing the file is a finding
            entry["peft_error"] = f"{type(e).__name__}: {e}"[:400]
    complete = ("peft_error" not in entry and not entry["dropped"] and not entry["not_loaded"]
                and entry["max_weight_diff"] == 0.0 and entry["loss_rel_diff"] < 1e-5)
    entry["peft_loads_everything"] = complete
    entry["ok"] = complete or bool(entry["moetune_warnings"])
    return entry


def main():
    import peft
    import transformers
    if len(sys.argv) != 2:
        sys.exit("usage: check_peft_moetune_save.py PATH/TO/moetune")
    moetune = os.path.abspath(sys.argv[1])
    torch.set_num_threads(1)
    out = {"transformers": transformers.__version__, "peft": peft.__version__, "cases": []}
    print(json.dumps({k: out[k] for k in ("transformers", "peft")}))
    bad = 0
    for fixture, sets, what in CASES:
        entry = run_case(moetune, fixture, sets, what)
        print(json.dumps(entry))
        out["cases"].append(entry)
        bad += not entry["ok"]
    out["summary"] = (f"{len(CASES) - bad} of {len(CASES)} cases: PEFT loads everything moetune saved and computes "
                      f"the same loss, or moetune warned what PEFT cannot load")
    print(out["summary"])
    with open(os.path.join(mf.FIXTURES, "lora_peft_save_check.json"), "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

"""Loads each LoRA fixture's adapters with transformers + peft and compares
the logits with lora_ref.py's, writing the numbers to
tests/fixtures/lora_peft_check.json.

This is the check that the fixtures' adapter files mean to PEFT what they
mean to the reference (names, layout, scaling): the HF model is built from
the fixture's ckpt/, PeftModel.from_pretrained loads adapter_init/ and
adapter_final/, and the logits of the first micro-batch are compared with
the reference model carrying the same adapter.  For the fused layout
(lora_qwen3_experts/adapter_init/adapter_model_fused.safetensors) a copy of
the adapter directory with that file and target_parameters is loaded too.

Run: /tmp/loravenv/bin/python tests/reference/check_peft_load.py
(the committed JSON is from transformers 5.23 and peft 0.21.2 from PyPI).  Not
part of CI: its result is the committed JSON.
"""

import json
import os
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_moe_ref as ref  # noqa: E402
import lora_ref as lr  # noqa: E402
import make_fixtures as mf  # noqa: E402
import make_lora_fixtures as mlf  # noqa: E402


def ref_logits(case, adapter_path, ids, mask, drop_routed=False):
    d = os.path.join(mlf.FIXTURES, case["name"])
    cfg = ref.Config(case["config"])
    model = ref.MoeForCausalLM(cfg)
    state, _ = ref.load_safetensors(os.path.join(d, "ckpt", "model.safetensors"))
    model.load_state_dict(state)
    targets = lr.select_targets(model, case["targets"], case["linear"])
    lr.apply_lora(model, targets, case["r"], case["alpha"], case["rslora"])
    ad, _ = ref.load_safetensors(adapter_path)
    lr.load_adapter_state(model, ad)
    if drop_routed:  # what PEFT computes when it ignores the routed experts' adapters
        with torch.no_grad():
            for n, m in lr.lora_modules(model):
                if ".experts." in n:
                    m.lora_B.weight.zero_()
    with torch.no_grad():
        return model(ids, mask)["logits"]


def peft_logits(ckpt, adapter_dir, ids, mask, fix_scaling=None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    base.eval()
    with torch.no_grad():
        base_logits = base(input_ids=ids, attention_mask=mask).logits
    model = PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    notes = []
    for n, mod in model.named_modules():
        sc = getattr(mod, "scaling", None)
        if isinstance(sc, dict) and "default" in sc and fix_scaling is not None and sc["default"] != fix_scaling:
            notes.append(f"{n}: PEFT scaling {sc['default']:.6g}, r {mod.r['default']}")
            sc["default"] = fix_scaling
    if notes:
        with torch.no_grad():
            fixed = model(input_ids=ids, attention_mask=mask).logits
        return fixed, base_logits, notes
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return logits, base_logits, []


def adapted_modules(ckpt, adapter_dir):
    """The modules PEFT put an adapter on (leaf kinds with counts)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32), adapter_dir)
    kinds = {}
    for n, _ in m.named_parameters():
        if ".lora_A." in n:
            k = ".".join(n.split(".lora_A.")[0].split(".")[5:])
            kinds[k] = kinds.get(k, 0) + 1
    return kinds


def main():
    import peft
    import transformers
    torch.set_num_threads(1)
    rows = mf.rows_from_examples(mlf.examples())
    ids, _, mask = mf.batch_tensors(rows, [0, 1])
    out = {"transformers": transformers.__version__, "peft": peft.__version__, "cases": []}
    for case in mlf.CASES:
        d = os.path.join(mlf.FIXTURES, case["name"])
        variants = [("adapter_init", "adapter_model.safetensors", None),
                    ("adapter_final", "adapter_model.safetensors", None)]
        if case.get("fused"):
            variants.append(("adapter_init", "adapter_model_fused.safetensors", None))
        if case["linear"]:  # and as "all-linear", which PEFT resolves itself
            variants.append(("adapter_init", "adapter_model.safetensors", "all-linear"))
        for sub, fname, targets in variants:
            with tempfile.TemporaryDirectory() as tmp:
                adir = os.path.join(tmp, "adapter")
                os.makedirs(adir)
                cfgj = json.load(open(os.path.join(d, sub, "adapter_config.json")))
                json.dump(cfgj, open(os.path.join(adir, "adapter_config.json"), "w"))
                shutil.copy(os.path.join(d, sub, fname), os.path.join(adir, "adapter_model.safetensors"))
                if targets:
                    cfgj["target_modules"] = targets
                json.dump(cfgj, open(os.path.join(adir, "adapter_config.json"), "w"))
                entry = {"case": case["name"], "adapter": f"{sub}/{fname}",
                         "target_modules": cfgj["target_modules"]}
                try:
                    want = ref_logits(case, os.path.join(d, sub, "adapter_model.safetensors"), ids, mask)
                    got, base, _ = peft_logits(os.path.join(d, "ckpt"), adir, ids, mask)
                    entry["max_abs_diff_vs_reference"] = (got - want).abs().max().item()
                    scale = case["alpha"] / (case["r"] ** 0.5 if case["rslora"] else case["r"])
                    fixed, _, notes = peft_logits(os.path.join(d, "ckpt"), adir, ids, mask, fix_scaling=scale)
                    if notes:  # PEFT's own scaling differs from alpha/r (or alpha/sqrt(r)) somewhere
                        entry["peft_scaling_differs"] = notes[:4]
                        entry["max_abs_diff_with_per_expert_scaling"] = (fixed - want).abs().max().item()
                    if case["config"]["model_type"] == "qwen2_moe":
                        alt = ref_logits(case, os.path.join(d, sub, "adapter_model.safetensors"), ids, mask, True)
                        entry["max_abs_diff_vs_reference_without_routed_expert_adapters"] = \
                            (got - alt).abs().max().item()
                    entry["peft_adapted_modules"] = adapted_modules(os.path.join(d, "ckpt"), adir)
                    entry["adapter_effect_max_abs"] = (want - base).abs().max().item()
                    entry["ok"] = entry["max_abs_diff_vs_reference"] < 1e-4
                except Exception as e:  # recorded, not hidden: a PEFT defect is a finding
                    entry["error"] = f"{type(e).__name__}: {e}"[:400]
                    entry["ok"] = False
                print(json.dumps(entry))
                out["cases"].append(entry)
    with open(os.path.join(mlf.FIXTURES, "lora_peft_check.json"), "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()

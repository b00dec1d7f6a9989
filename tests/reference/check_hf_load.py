#!/usr/bin/env python3
"""Checks that models moetune saved load in Hugging Face transformers unchanged.

For each directory given (a moetune output_dir holding config.json and
safetensors), loads it with AutoModelForCausalLM.from_pretrained twice:
with dtype="auto" (which must give the dtype config.json states, i.e. the
dtype moetune saved) and with torch_dtype=torch.bfloat16.  Either load must
report no missing, unexpected or mismatched keys, and a forward pass on a
few tokens must give finite logits.  Prints one JSON object per directory;
--out FILE also writes them as a JSON list (the committed record is
tests/reference/hf_load_results.json).

Needs torch and transformers (a venv; CI does not run this):
    python3 tests/reference/check_hf_load.py DIR... [--out FILE]
"""
import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def check(path):
    cfg = AutoConfig.from_pretrained(path)
    stated = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    result = {"dir": path, "model_type": cfg.model_type, "config_dtype": str(stated), "loads": []}
    ok = True
    for how, kwargs in (("dtype=auto", {"dtype": "auto"}), ("torch_dtype=bfloat16", {"torch_dtype": torch.bfloat16})):
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kwargs)
        model.eval()
        keys = {k: sorted(info.get(k, [])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        ids = torch.arange(1, 9).unsqueeze(0) % cfg.vocab_size
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        param_dtypes = sorted({str(p.dtype) for p in model.parameters()})
        load = {"how": how, "param_dtypes": param_dtypes, "finite_logits": bool(torch.isfinite(logits).all()),
                **{k: v for k, v in keys.items()}}
        good = not any(keys.values()) and load["finite_logits"]
        if how == "dtype=auto":
            want = str(stated) if str(stated).startswith("torch.") else "torch." + str(stated)
            good = good and param_dtypes == [want]
        load["ok"] = good
        ok = ok and good
        result["loads"].append(load)
    result["ok"] = ok
    return result


def main(argv):
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    results = []
    for path in argv:
        r = check(path)
        print(json.dumps(r))
        results.append(r)
    if out:
        with open(out, "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "results": results}, f,
                      indent=1)
            f.write("\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

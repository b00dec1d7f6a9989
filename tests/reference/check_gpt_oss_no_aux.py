#!/usr/bin/env python3
"""gpt-oss without the load-balancing loss (output_router_logits false):
moetune's 5 losses against transformers' GptOssForCausalLM's on the
ref_gpt_oss checkpoint and data (the committed fixture has the aux loss on).

    /tmp/loravenv/bin/python tests/reference/check_gpt_oss_no_aux.py bazel-bin/tools/moetune /tmp/noaux
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import make_gpt_oss_fixture as g  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "ref_gpt_oss")


def reference_losses():
    torch.set_num_threads(1)
    g.CONFIG["output_router_logits"] = False
    model = g.build()
    model.load_state_dict(load_file(os.path.join(FIXTURE, "ckpt", "model.safetensors")))
    run = dict(mf.RUN_BASE)
    rows = mf.rows_from_examples(mf.make_examples())
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=run["learning_rate"], betas=(run["adam_beta1"], run["adam_beta2"]),
                            eps=run["adam_epsilon"], weight_decay=run["weight_decay"])
    it = mf.micro_batches(rows, run["micro_batch_size"])
    losses = []
    for _ in range(run["max_steps"]):
        opt.zero_grad(set_to_none=True)
        ids, labels, mask = mf.batch_tensors(rows, next(it))
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        assert out.aux_loss is None
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, run["max_grad_norm"])
        opt.step()
        losses.append(out.loss.item())
    return losses


def main(moetune, work):
    ckpt = os.path.join(work, "ckpt")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.join(FIXTURE, "ckpt"), ckpt)
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    cfg["output_router_logits"] = False
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    out = os.path.join(work, "out")
    r = subprocess.run([moetune, "train", os.path.join(FIXTURE, "run.yaml"), "--set", "base_model=" + ckpt,
                        "--set", "output_dir=" + out], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(os.path.join(out, "metrics.jsonl")) as f:
        got = [json.loads(line) for line in f if '"loss"' in line]
    ref = reference_losses()
    rel = max(abs(a["loss"] - b) / abs(b) for a, b in zip(got, ref))
    aux = max(abs(a.get("aux_loss", 0.0)) for a in got)
    ok = len(got) == len(ref) and rel <= 1e-6
    print(json.dumps({"moetune": [a["loss"] for a in got], "transformers": ref, "max_rel": rel,
                      "moetune_aux_loss_max": aux, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

#!/usr/bin/python3
"""Times PyTorch's CPU AdamW (torch.optim.AdamW, foreach=True) on N parameters,
to compare with `moetune bench adam --params N` on the same machine.

Why this shape: the parameters are split into tensors of --tensor-params
elements (a transformer layer's worth by default), as a real model's are;
foreach=True is torch's fastest non-fused path on CPU. Gradients are set
once and reused; each timed call is one optimizer.step(). The first steps
are untimed (they allocate the optimizer state and touch every page). The
report is the median of --repeats steps, in params/s and in bytes/s at the
same 28 bytes per parameter moetune counts (the minimum traffic; torch's
per-op passes move several times that).

Usage: /usr/bin/python3 tools/bench/torch_adamw.py [--params N] [--threads T]
           [--repeats R] [--tensor-params K] [--json]
"""
import argparse
import json
import os
import statistics
import sys
import time


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=200e6, help="parameters (default 2e8)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch intra-op threads (default: one per core)")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps, median reported")
    ap.add_argument("--tensor-params", type=float, default=4 * 1024 * 1024,
                    help="elements per parameter tensor (default 4M)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    n = int(a.params)
    k = int(a.tensor_params)
    if n < 1 or k < 1 or a.repeats < 1 or a.threads < 1:
        ap.error("--params, --tensor-params, --repeats and --threads must be >= 1")

    import torch  # imported late so --help works without torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    sizes = [k] * (n // k) + ([n % k] if n % k else [])
    params = []
    for s in sizes:
        p = torch.nn.Parameter(torch.randn(s) * 0.02)
        p.grad = torch.randn(s) * 1e-3
        params.append(p)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            foreach=True)
    for _ in range(2):  # state allocation and first touch
        opt.step()
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    pps = n / t
    out = {
        "impl": "torch.optim.AdamW(foreach=True)",
        "torch": torch.__version__,
        "params": n,
        "tensors": len(sizes),
        "threads": torch.get_num_threads(),
        "repeats": a.repeats,
        "seconds": t,
        "params_per_s": pps,
        "bytes_per_s": pps * 28,
    }
    if a.json:
        print(json.dumps(out))
    else:
        print("torch %s AdamW(foreach=True): %d params in %d tensors, %d thread(s), median of %d"
              % (out["torch"], n, len(sizes), out["threads"], a.repeats))
        print("  %.4f s/step  %.3f G params/s  %.2f GB/s at 28 B/param"
              % (t, pps * 1e-9, pps * 28e-9))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Where do the CPU and CUDA backends part ways? Runs the same prompt (prefill + a few decode
steps) on both, records every op's output, and prints the normalised error op by op.

    python scripts/compare_backends.py [MODEL] [--prompt TEXT] [--steps 2]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_args  # noqa: E402
from pocketcupy import Engine, SamplingParams  # noqa: E402

TRACED = ("embedding", "rms_norm", "add_rms_norm", "silu_mul", "linear", "rope", "attention")


class Tracing:
    """Wraps an ops object; records (op, host copy of the first output) for every traced call."""

    def __init__(self, ops, records):
        self._ops, self._records = ops, records

    def __getattr__(self, name):
        fn = getattr(self._ops, name)
        if name not in TRACED:
            return fn

        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            first = out[0] if isinstance(out, tuple) else out
            self._records.append((name, np.asarray(self._ops.to_host(first), np.float64)))
            return out
        return call


def trace(path, device, prompt, steps):
    eng = Engine(path, device=device, progress=False, cuda_graphs=False)
    records = []
    eng.model.ops = Tracing(eng.ops, records)
    out = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))[0]
    return records, out.outputs[0].token_ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--prompt", default="The history of the Roman Empire")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--show", type=int, default=40, help="ops to print with the largest errors")
    a = ap.parse_args()
    bench_args.require_gpu(ap, "compares the CPU backend with the CUDA one")
    cpu, cpu_ids = trace(a.model, "cpu", a.prompt, a.steps)
    gpu, gpu_ids = trace(a.model, "cuda", a.prompt, a.steps)
    rows = []
    for i, ((n1, x), (n2, y)) in enumerate(zip(cpu, gpu)):
        err = float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)) if x.shape == y.shape else float("inf")
        rows.append({"i": i, "op": n1, "shape": list(x.shape), "err": err})
    worst = sorted(rows, key=lambda r: -r["err"])[: a.show]
    by_op = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r["err"])
    print(json.dumps({"cpu_tokens": cpu_ids, "gpu_tokens": gpu_ids, "ops": len(rows),
                      "max_err_by_op": {k: max(v) for k, v in by_op.items()},
                      "median_err_by_op": {k: float(np.median(v)) for k, v in by_op.items()},
                      "first_20": rows[:20], "worst": worst}))


if __name__ == "__main__":
    main()

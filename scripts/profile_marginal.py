"""What each op costs inside the replayed decode graph: the graph is captured again with one op
(or one weight's linears) removed, and the difference in replay time is that op's share of the
step, PDL overlap and launch gaps included (which ncu's serialised per-kernel times leave out).
Prints one JSON object.

    python scripts/profile_marginal.py MODEL [--batch 1] [--context 512] [--kv-cache-dtype int8] \\
        [--remove rope_attention,add_rms_norm,add_rms_norm_linear,add_rms_norm_mlp,linears,linear:wqkv,linear:wo,\\
         linear:w_gate_up,linear:w_down,silu_mul_linear,linear:lm_head]

A removal spec is an ops method name, optionally with ":attr": then only the calls whose weight
(second argument) is that attribute of a layer or of the model (wo, w_gate_up, lm_head, ...). A
removed call returns the output the same call gave in the capture's warm-up forward, so the
captured graph holds no kernel of it (the tokens it then produces are meaningless; only the
time counts)."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_args  # noqa: E402
from profile_decode import recaptured_us, replay_us  # noqa: E402
from profile_kernels import start_decodes  # noqa: E402

DEFAULT_REMOVE = ("rope_attention,add_rms_norm,add_rms_norm_linear,add_rms_norm_mlp,linears,linear:wqkv,linear:wo,"
                  "linear:w_gate_up,linear:w_down,silu_mul_linear,linear_add_rms_norm:wo,linear_add_rms_norm:w_down,"
                  "linear:lm_head")


class OpRemoval:
    """While active (a context manager), `spec`'s calls return the output they gave the first
    time at the same place of a forward (call index and input shape) instead of running."""

    def __init__(self, model, spec: str):
        self.model, self.spec = model, spec
        op, _, attr = spec.partition(":")
        if not callable(getattr(model.ops, op, None)):
            raise ValueError(f"remove: the ops have no method {op!r}")
        self.op = op
        self.targets = None
        if attr:
            owners = [model, *model.layers]
            self.targets = {id(getattr(o, attr)) for o in owners if getattr(o, attr, None) is not None}
            if not self.targets:
                raise ValueError(f"remove: neither the model nor its layers have a weight {attr!r}")
        self.cache: dict = {}
        self.skipped = 0              # calls served from the cache in the last forward
        self._index = itertools.count()

    def __enter__(self):
        ops, model, real = self.model.ops, self.model, getattr(self.model.ops, self.op)
        forward = model.forward

        def removed(*args, **kw):
            if self.targets is not None and (len(args) < 2 or id(args[1]) not in self.targets):
                return real(*args, **kw)
            x = getattr(args[0], "x", args[0]) if args else None   # Q8Rows / Half16Rows: their x
            key = (next(self._index), getattr(x, "shape", None))
            if key in self.cache:
                self.skipped += 1
                return self.cache[key]
            out = self.cache[key] = real(*args, **kw)
            return out

        def counted_forward(*args, **kw):
            self._index, self.skipped = itertools.count(), 0
            return forward(*args, **kw)

        self._saved = [(o, name, vars(o).get(name)) for o, name in ((ops, self.op), (model, "forward"))]
        setattr(ops, self.op, removed)
        model.forward = counted_forward
        return self

    def __exit__(self, *exc):
        for o, name, before in self._saved:     # the instance attribute as it was (usually none)
            if before is None:
                delattr(o, name)
            else:
                setattr(o, name, before)
        return False


def main():
    from pocketcupy import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512, help="prompt tokens of each sequence")
    ap.add_argument("--remove", default=DEFAULT_REMOVE, help="comma list of removal specs")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--kv-cache-dtype", default="auto", help="EngineArgs.kv_cache_dtype (auto, int8, fp8, k8v4)")
    a = ap.parse_args()
    bench_args.require_gpu(ap, "measures CUDA graph replays")
    eng = Engine(a.model, device="cuda", progress=False, max_num_seqs=max(a.batch, 1), kv_cache_dtype=a.kv_cache_dtype)
    graphs = eng.runner.graphs
    if graphs is None:
        raise SystemExit("profile_marginal: the engine runs without CUDA graphs")
    start_decodes(eng, a.batch, a.context, 3)   # prefill, then decode steps on the graph
    b = graphs.bucket_for(a.batch)

    base = replay_us(graphs, b, a.reps)
    res = {"batch": a.batch, "bucket": b, "context": a.context, "graph_replay_us": base, "removed": {}}
    for spec in filter(None, a.remove.split(",")):
        try:
            with OpRemoval(eng.runner.model, spec) as r:
                us = recaptured_us(eng, b, a.reps)
        except ValueError as e:
            res["removed"][spec] = {"error": str(e)}
            continue
        saved = round(base - us, 1)
        res["removed"][spec] = {"graph_replay_us": us, "saved_us": saved, "calls": r.skipped,
                                "saved_us_per_call": round(saved / r.skipped, 2) if r.skipped else None}
    res["graph_replay_us_after"] = recaptured_us(eng, b, a.reps)   # everything back: should be graph_replay_us again
    print(json.dumps(res))


if __name__ == "__main__":
    main()

"""Decode-graph replay time under variants of the backend's launch policies, alternated in one
process (one engine, one model load): a variant sets module constants of pocketcupy.backend, the
graph of the batch's bucket is captured again and replayed, then the constants go back. Rounds
alternate the variants so that clock drift falls on all of them. Prints one JSON object.

    python scripts/profile_variants.py MODEL --batch 64 \\
        --variant base= --variant splits2='attn_cuda.DECODE_BLOCKS_PER_SM={"plain": 4, "mma": 2}'
    python scripts/profile_variants.py MODEL --variant base= \\
        --variant no_tall=linear_cuda.Q8_B1_TALL_ROWS=10**9 --variant r8=linear_cuda.Q8_B1_LONG_ROW_ROWS=8

A variant is NAME=ASSIGNMENTS, assignments `module.CONSTANT=value` joined by ";" (module: one of
pocketcupy.backend's; value: a Python literal or integer arithmetic); "NAME=" keeps the defaults."""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import operator
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_args  # noqa: E402

_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
          ast.FloorDiv: operator.floordiv, ast.LShift: operator.lshift}


def _value(text: str):
    """A Python literal, or arithmetic of literals (10**9, 1 << 20)."""
    def ev(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return _ARITH[type(node.op)](ev(node.left), ev(node.right))
        return ast.literal_eval(node)
    return ev(ast.parse(text, mode="eval").body)


def parse_variant(spec: str) -> tuple[str, list[tuple[str, str, object]]]:
    """"NAME=mod.CONST=value;mod.CONST=value" -> (NAME, [(module, constant, value), ...]); ValueError
    naming the part that is wrong."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise ValueError(f"--variant {spec!r}: expected NAME=ASSIGNMENTS (NAME= for the defaults)")
    sets = []
    for part in filter(None, (p.strip() for p in rest.split(";"))):
        target, sep, value = part.partition("=")
        mod, dot, const = target.strip().rpartition(".")
        if not sep or not dot:
            raise ValueError(f"--variant {name}: {part!r} is not module.CONSTANT=value")
        try:
            sets.append((mod, const, _value(value.strip())))
        except (ValueError, SyntaxError) as e:
            raise ValueError(f"--variant {name}: {value!r} is not a Python literal ({e})") from None
    return name, sets


class Settings:
    """While active, the assignments of one variant hold on pocketcupy.backend's modules."""

    def __init__(self, sets):
        self.sets = []
        for mod, const, value in sets:
            module = importlib.import_module(f"pocketcupy.backend.{mod}")
            if not hasattr(module, const):
                raise ValueError(f"pocketcupy.backend.{mod} has no {const}")
            self.sets.append((module, const, value))

    def __enter__(self):
        self.saved = [(m, c, getattr(m, c)) for m, c, _ in self.sets]
        for m, c, v in self.sets:
            setattr(m, c, v)
        return self

    def __exit__(self, *exc):
        for m, c, v in reversed(self.saved):
            setattr(m, c, v)
        return False


def main(argv=None) -> int:
    from pocketcupy import Engine
    from profile_decode import recaptured_us
    from profile_kernels import start_decodes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512, help="prompt tokens of each sequence")
    ap.add_argument("--variant", action="append", required=True, help="NAME=module.CONSTANT=value[;...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--kv-cache-dtype", default="auto", help="EngineArgs.kv_cache_dtype (auto, int8, fp8, k8v4)")
    a = ap.parse_args(argv)
    try:                                         # unknown modules / constants fail here, before the model loads
        variants = dict(parse_variant(v) for v in a.variant)
        settings = {name: Settings(sets) for name, sets in variants.items()}
    except (ValueError, ImportError) as e:
        ap.error(str(e))
    bench_args.require_gpu(ap, "measures CUDA graph replays")
    eng = Engine(a.model, device="cuda", progress=False, max_num_seqs=max(a.batch, 1), kv_cache_dtype=a.kv_cache_dtype)
    if eng.runner.graphs is None:
        raise SystemExit("profile_variants: the engine runs without CUDA graphs")
    start_decodes(eng, a.batch, a.context, 3)   # prefill, then decode steps on the graph
    b = eng.runner.graphs.bucket_for(a.batch)
    res = {name: [] for name in variants}
    for _ in range(a.rounds):
        for name, s in settings.items():
            with s:
                res[name].append(recaptured_us(eng, b, a.reps))
    recaptured_us(eng, b, a.reps)               # the defaults' graph again for whatever runs next
    print(json.dumps({"batch": a.batch, "bucket": b, "context": a.context, "graph_replay_us": res,
                      "min_us": {n: min(v) for n, v in res.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

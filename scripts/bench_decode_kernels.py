"""Launch-shape sweep for the small-model decode kernels on the GPU. Prints ONE JSON object.

    python scripts/bench_decode_kernels.py                         # SmolLM2-135M shapes + 8B-shaped GEMVs
    python scripts/bench_decode_kernels.py --only gemv --batches 1,2 --configs lanes:8:2,lanes:16:2,xs:4,xs:8
    python scripts/bench_decode_kernels.py --only small            # norms, rope+store: old vs new kernels

GEMV: every config on every shape: lanes:L:R, xs:R, block:R (fp32 activations, see
linear_cuda.F32Gemv); q8[:R[:T]] (llama.cpp's scheme, int8 activations and DP4A, R rows per block of
T threads; plain q8: linear()'s launch), q8mma[:TG:W[:U[:B[:RW[:ACC[:MT]]]]]] (int8 tensor cores with activations
per 256, batch 2-64; the launch shape, see kquant_mma_cuda.kquant_mma_shape), q8tile:MT:RG:KW:ST (the
shared-memory tile kernel gemm_kquant_tile.cu, batches up to 64), gemm (dequantization + cuBLAS)
kq:R:U (Q4_K /
Q5_K / Q6_K over 64-value groups, gemv_kquant.cu: R rows per warp, U groups in flight per lane) and kqs:R:U
(the same, R rows per block whose threads split the rows' groups), the
activations quantized beforehand as the fused norm does. "*" marks linear()'s
default launch of each kind; weights cycled over copies larger than twice the L2 so they stream from
HBM as in a decode step of a model bigger than the L2; frac_copy_bw: their GB/s (weight bytes) over
the device-to-device copy bandwidth measured in the same run ("copy"). Timing as in bench_kernels.py
(CUDA-graph replay of back-to-back calls, median)."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402
from bench_kernels import _SCALE_FIELDS, L2_BYTES, copy_bandwidth, make_weight, time_us, weight_bytes  # noqa: E402

SMOL = [("Q4_1", 960, 576), ("Q4_1", 576, 576), ("Q4_1", 3072, 576), ("Q4_1", 576, 1536), ("Q8_0", 49152, 576)]
BIG = [("Q8_0", 14336, 4096), ("Q4_K", 14336, 4096), ("Q4_K", 4096, 14336), ("Q6_K", 4096, 14336)]
CONFIGS = ("lanes:32:1,lanes:32:2,lanes:16:1,lanes:16:2,lanes:8:2,lanes:8:4,lanes:4:4,xs:2,xs:4,xs:8,xsw:2,xsw:4,"
           "block:1,block:2,block:4")
BENCHES = ("gemv", "small")
LAYOUTS = ("relaid", "raw")
SHAPE_QTYPES = tuple(_SCALE_FIELDS)     # the GGUF formats make_weight builds
# each --configs kind: how many numbers may follow it (parse_config)
CONFIG_FIELDS = {"lanes": {2}, "xs": {1}, "xsw": {1}, "block": {1}, "q8": {0, 1, 2}, "q8mma": {0, 2, 3, 4, 5, 6, 7},
                 "q8tile": {4}, "gemm": {0}, "kq": {2}, "kqs": {2}}


def parse_config(s: str):
    from pocketcupy.backend import linear_cuda as lc

    kind, *nums = s.split(":")
    if kind == "q8tile":      # q8tile:MT:RG:KW:ST: gemm_kquant_tile.cu (batches <= 64), see launch_gemm_kquant_tile
        return s
    if kind in ("q8mma", "gemm"):   # K-quant past batch 2: int8 tensor cores (gemv_kquant_mma.cu), or
        return s if nums else kind  # dequantization + cuBLAS; q8mma:TG:W[:U[:B[:RW[:ACC[:MT]]]]]: TG tiles a pass, W
        #                             warps, U super-blocks in flight, B blocks per SM the registers allow,
        #                             RW row groups a block, ACC, MT 16-row tiles a warp
    if kind == "q8":          # q8[:R[:T]]: int8 activations + DP4A (gemv_gguf.cu), R rows per block of T threads
        return lc.Q8Gemv("block", *(int(v) for v in nums)) if nums else "q8"
    if kind == "kq":          # kq:R:U: the K-quant kernel, R rows per warp, U 64-value groups in flight per lane
        return lc.Q8Gemv("kquant", int(nums[0]), unroll=int(nums[1]))
    if kind == "kqs":         # kqs:R:U: the K-quant kernel, R rows per block whose threads split the groups
        return lc.Q8Gemv("kqsplit", int(nums[0]), unroll=int(nums[1]))
    if kind == "lanes":
        return lc.F32Gemv(kind, int(nums[1]), int(nums[0]))
    return lc.F32Gemv(kind, int(nums[0]))


def bench_gemv(args, copy_gbps: float) -> dict:
    import cupy as cp

    from pocketcupy.backend import kquant_mma_cuda as kq
    from pocketcupy.backend import kquant_tile_cuda as kt
    from pocketcupy.backend import linear_cuda as lc
    from pocketcupy.backend.weight_cuda import RELAID_QTYPES

    rng = np.random.default_rng(0)
    shapes = SMOL + ([] if args.small_only else BIG)
    if args.shapes:
        shapes = []
        for s in args.shapes.split(","):
            q, rc = s.split(":")
            shapes.append((q, *(int(v) for v in rc.split("x"))))
    out = {}
    layouts = args.q6k_layouts.split(",")
    for qtype, rows, cols, layout in [(q, r, c, lay) for q, r, c in shapes
                                      for lay in (layouts if q in RELAID_QTYPES else ["relaid"])]:
        relay = layout == "relaid"
        w0 = make_weight(qtype, rows, cols, rng, relay)
        copies = [w0] + [make_weight(qtype, rows, cols, rng, relay)
                         for _ in range(-(-2 * L2_BYTES // weight_bytes(w0)) - 1)]
        tag = "" if layout == "relaid" else f"-{layout}"
        for nb in [int(b) for b in args.batches.split(",")]:
            x = cp.random.standard_normal((nb, cols), dtype=cp.float32)
            y = cp.empty((nb, rows), cp.float32)
            default = lc.f32_gemv_config(cols // 32, nb, qtype, rows)
            xq, xds = lc.quantize_x(x)
            xk = kq.quantize_x_q8k(x) if cols % 256 == 0 else None
            for cfg in [default] + [parse_config(c) for c in args.configs.split(",")]:
                if cfg == "q8":
                    cfg = lc.q8_gemv_launch(qtype, rows, cols, nb)
                if isinstance(cfg, lc.Q8Gemv) and cfg.kquant and qtype not in lc.KQUANT_QTYPES or \
                        str(cfg).startswith("q8mma") and not kq.gguf_mma_tiles(copies[0], nb) or \
                        str(cfg).startswith("q8tile") and (copies[0].kernel_qtype not in kt.TILE_KERNEL_QTYPES or nb > 64):
                    continue
                f32 = isinstance(cfg, lc.F32Gemv)
                if not str(cfg).startswith(("q8mma", "q8tile", "gemm")) and ((cfg.rows_per_group if f32 else cfg.rows) * nb > 32
                                       or (f32 and cfg.kind == "lanes" and cfg.lanes > 32)):
                    continue
                if str(cfg).startswith(("q8mma", "q8tile", "gemm")):
                    name = cfg.replace(":", "_")
                elif isinstance(cfg, lc.Q8Gemv):
                    name = f"q8_{cfg.name()}" + ("*" if cfg == lc.q8_gemv_launch(qtype, rows, cols, nb) else "")
                else:
                    name = f"{cfg.kind}_r{cfg.rows_per_group}" + (f"_l{cfg.lanes}" if cfg.kind == "lanes" else "") + \
                        ("*" if cfg == default else "")
                key = f"{qtype.lower()}{tag}-{rows}x{cols}-bs{nb}-{name}"
                if key.rstrip("*") in {k.rstrip("*") for k in out}:
                    continue
                it = iter(range(1 << 62))

                def run():
                    w = copies[next(it) % len(copies)]
                    if str(cfg).startswith("q8mma"):
                        groups = tuple(int(v) for v in cfg.split(":")[1:]) or None
                        kq.launch_gemv_kquant_mma(w, xk, None, y, nb, kq.gguf_mma_tiles(w, nb), groups)
                    elif str(cfg).startswith("q8tile"):
                        kt.launch_gemm_kquant_tile(w, xk, None, y, nb, tuple(int(v) for v in cfg.split(":")[1:]))
                    elif cfg == "gemm":
                        lc._gemm(x, w, None, y)
                    elif isinstance(cfg, lc.Q8Gemv):
                        lc.launch_gemv_q8(w, xq, xds, None, y, nb, cfg)
                    else:
                        lc.launch_gemv_f32(w, x, None, y, nb, cfg)
                try:
                    t = time_us(run, args.reps, len(copies) * max(1, 16 // len(copies)))
                except Exception as e:                      # a config that does not compile / launch
                    out[key] = {"error": f"{type(e).__name__}: {e}"[:200]}
                    continue
                gbps = weight_bytes(w0) / t["us"] / 1e3
                out[key] = {**t, "GBps": round(gbps, 1), "frac_copy_bw": round(gbps / copy_gbps, 3)}
        copies = w0 = None     # freed before the next shape's
    return out


def bench_small(args) -> dict:
    """Per-layer small ops of SmolLM2-135M at batch 1 and 8: the kernels this change replaces and
    their replacements (old kernels are still in the .cu files)."""
    import cupy as cp

    from pocketcupy.backend import elementwise_cuda as ew
    from pocketcupy.backend.elementwise_cuda import _k

    f32, i32 = np.float32, np.int32
    out = {}
    hq, hkv, d, nblk, bs = 9, 3, 64, 64, 16
    for n in (1, 8):
        x = cp.random.standard_normal((n, 576), dtype=cp.float32)
        res = cp.random.standard_normal((n, 576), dtype=cp.float32)
        w = cp.ones(576, cp.float32)
        o = cp.empty_like(x)
        block = _k("norm.cu", "add_rms_norm_f32")
        out[f"add_rms_norm-576-n{n}-block"] = time_us(
            lambda: block((n,), (160,), (x, res, w, o, res, i32(576), f32(1e-5))), args.reps, 50)
        out[f"add_rms_norm-576-n{n}-warp"] = time_us(lambda: ew.add_rms_norm(x, res, w, 1e-5, out=o), args.reps, 50)
        qkv = cp.random.standard_normal((n, (hq + 2 * hkv) * d), dtype=cp.float32)
        q, k, v = (qkv[:, :hq * d].reshape(n, hq, d), qkv[:, hq * d:(hq + hkv) * d].reshape(n, hkv, d),
                   qkv[:, (hq + hkv) * d:].reshape(n, hkv, d))
        pos = cp.arange(n, dtype=cp.int64) + 100
        slots = cp.arange(n, dtype=cp.int64) + 7
        inv = cp.asarray((1.0 / 10000.0 ** (np.arange(0, d, 2) / d)).astype(np.float32))
        kc = cp.zeros((nblk, bs, hkv, d), cp.float16)
        vc = cp.zeros_like(kc)
        qo, ko = cp.empty((n, hq, d), cp.float32), cp.empty((n, hkv, d), cp.float32)

        def old():
            ew.rope(q, pos, inv, True, out=qo)
            ew.rope(k, pos, inv, True, out=ko)
            ew.store_kv(kc, vc, ko, v, slots)
        out[f"rope_q+rope_k+store_kv-n{n}"] = time_us(old, args.reps, 50)
        out[f"rope_store_kv-n{n}"] = time_us(
            lambda: ew.rope_store_kv(q, k, v, pos, inv, True, kc, vc, slots, out=qo), args.reps, 50)
    return out


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Usage errors before anything touches the GPU (on one, a bad --configs, --shapes or --batches entry
    was a traceback mid-run, an unknown --only name ran nothing)."""
    for flag, given, known in (("--only", args.only, BENCHES), ("--q6k-layouts", args.q6k_layouts, LAYOUTS)):
        bad = [v for v in given.split(",") if v not in known]
        if bad:
            ap.error(f"{flag}: unknown {bad[0]!r} (choose from {', '.join(known)})")
    bad = [b for b in args.batches.split(",") if not (b.isdigit() and int(b) >= 1)]
    if bad:
        ap.error(f"--batches: {bad[0]!r} is not a batch size of at least 1")
    for c in args.configs.split(","):
        kind, *nums = c.split(":")
        if len(nums) not in CONFIG_FIELDS.get(kind, ()) or not all(n.isdigit() for n in nums):
            ap.error(f"--configs: {c!r} is not a launch config (kinds {', '.join(CONFIG_FIELDS)}; see --help)")
    for sh in args.shapes.split(",") if args.shapes else ():
        qtype, _, dims = sh.partition(":")
        rows, _, cols = dims.partition("x")
        if qtype not in SHAPE_QTYPES or not (rows.isdigit() and cols.isdigit()):
            ap.error(f"--shapes: {sh!r} is not QTYPE:ROWSxCOLS with QTYPE one of {', '.join(SHAPE_QTYPES)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="gemv,small")
    ap.add_argument("--batches", default="1,2,8")
    ap.add_argument("--configs", default=CONFIGS, help="lanes:L:R, xs:R, block:R list, e.g. lanes:16:2,xs:4,block:2")
    ap.add_argument("--shapes", default="", help="QTYPE:ROWSxCOLS list, e.g. Q4_1:960x576,Q8_0:14336x4096")
    ap.add_argument("--small-only", action="store_true", help="GEMV: SmolLM2 shapes only")
    ap.add_argument("--q6k-layouts", default="relaid", help="Q6_K upload layouts to time: relaid,raw")
    ap.add_argument("--reps", type=bench_args.count(), default=20)
    args = ap.parse_args(argv)
    check_args(ap, args)
    bench_args.require_gpu(ap, "times CUDA kernels")
    only = set(args.only.split(","))
    res: dict = {}
    if "small" in only:
        res["small"] = bench_small(args)
    if "gemv" in only:
        res["copy"] = copy_bandwidth(args.reps)        # the roofline the GEMVs' GB/s are a fraction of
        res["gemv"] = bench_gemv(args, res["copy"]["GBps"])
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

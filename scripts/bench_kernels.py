"""GEMV / GEMM (and decode/prefill attention) microbenchmarks on the GPU, against ceilings
measured in the same run: device-to-device copy bandwidth (bytes read + written) and the
cuBLAS fp16 GEMM 8192^3 rate. Prints ONE JSON object.

    python scripts/bench_kernels.py                  # everything
    python scripts/bench_kernels.py --quick          # fewer repetitions and shapes
    python scripts/bench_kernels.py --only gemv,batch,gemm,attention
    python scripts/bench_kernels.py --only batch            # BF16 through cuBLAS at batches 16-64
    python scripts/bench_kernels.py --only batch --qtypes BF16,FP8,NVFP4   # and FP8 / NVFP4 by each path
    python scripts/bench_kernels.py --only gemv --qtypes BF16,FP8,NVFP4   # these formats' GEMVs (+ FP8 without the cvt, NVFP4 at U 8)

Timing: CUDA events around CUDA-graph replays of `inner` back-to-back calls (Python launch
cost excluded, as in the engine's decode graphs), median of `reps`; eager events if capture
fails. Weights are cycled over enough copies to exceed the L2 twice, so GEMVs stream from HBM.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402
from pocketcupy.quant.kv_quant import KV_CACHE_DTYPES, kv_pair_bytes  # noqa: E402
from pocketcupy.quant.qtensor import QTensor  # noqa: E402

L2_BYTES = 60 << 20
_SCALE_FIELDS = {"Q4_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208], "Q5_K": [0, 2], "Q2_K": [80, 82],
                 "Q3_K": [108], "IQ4_XS": [0], "IQ2_XXS": [0], "IQ3_XXS": [0], "Q4_1": [0, 2],
                 "Q5_0": [0], "Q5_1": [0, 2]}


def _cp():
    import cupy

    return cupy


def time_us(fn, reps: int, inner: int, graph: bool = True) -> dict:
    """Median microseconds per fn() call: `inner` back-to-back calls replayed as one CUDA graph, or
    launched eagerly where capture fails or graph is False."""
    cp = _cp()
    cp.cuda.Device().synchronize()   # fn's inputs, made on the legacy stream, which the one below does not wait for
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        fn()
        stream.synchronize()
        captured = None
        if graph:
            try:
                stream.begin_capture()
                for _ in range(inner):
                    fn()
                captured = stream.end_capture()
            except Exception:                               # capture unsupported: eager timing
                try:
                    stream.end_capture()
                except Exception:
                    pass
        times = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            if captured is not None:
                captured.launch(stream)
            else:
                for _ in range(inner):
                    fn()
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1000.0 / inner)
    return {"us": round(statistics.median(times), 2), "graph": captured is not None}


def copy_bandwidth(reps: int) -> dict:
    cp = _cp()
    n = 1 << 30
    a, b = cp.ones(n, cp.uint8), cp.empty(n, cp.uint8)

    def run():
        b.data.copy_from_device_async(a.data, n, cp.cuda.get_current_stream())
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:   # the GPU leaves its idle clocks first (--quick measured 2.77 TB/s cold)
        run()
        cp.cuda.get_current_stream().synchronize()
    # timed eagerly: captured in a graph the copy becomes a memcpy node, which ran at 2.71 TB/s on the
    # H200 (below the GEMVs this is the ceiling for) against 4.21-4.25 TB/s for the stream's own copy
    t = time_us(run, reps, 4, graph=False)
    return {**t, "bytes": 2 * n, "GBps": round(2 * n / t["us"] / 1e3, 1)}


def gemm_peak(reps: int, n: int = 8192) -> dict:
    cp = _cp()
    a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    b = cp.random.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    c = cp.empty((n, n), cp.float16)
    t = time_us(lambda: cp.matmul(a, b, out=c), reps, 2)
    return {**t, "TFLOPs": round(2 * n ** 3 / t["us"] / 1e6, 1)}


def make_weight(qtype: str, rows: int, cols: int, rng, relay: bool | None = None):
    """A CudaWeight of random data in the given format (valid blocks: small fp16 scales); relay as
    weight_cuda.prepare_weight's."""
    from pocketcupy.backend import weight_cuda as wc

    if qtype in ("F16", "BF16"):
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.05).astype(np.float16)
        data = w if qtype == "F16" else (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return wc.prepare_weight(QTensor(qtype, (rows, cols), data))
    if qtype == "FP8":      # E4M3 codes without NaN (0x7f / 0xff), a scale per row and 128 columns
        signs = rng.integers(0, 2, (rows, cols), dtype=np.uint8) << 7
        codes = rng.integers(0, 0x7F, (rows, cols), dtype=np.uint8) | signs
        scales = np.full((rows, -(-cols // 128)), 0.01, np.float32)
        return wc.prepare_weight(QTensor("FP8", (rows, cols), codes, scales))
    if qtype == "NVFP4":    # E2M1 codes, E4M3 scales of 16 columns (normal codes), a tensor scale
        codes = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
        scales = rng.integers(0x30, 0x50, (rows, cols // 16), dtype=np.uint8)
        return wc.prepare_weight(QTensor("NVFP4", (rows, cols), codes, scales, 0.01))
    _, qk, ts = wc.GGUF_QTYPES[qtype]
    nblk = rows * cols // qk
    b = rng.integers(0, 256, size=(nblk, ts), dtype=np.uint8)
    for off in _SCALE_FIELDS[qtype]:
        b[:, off:off + 2] = np.array([0.02], np.float16).view(np.uint8)
    return wc.prepare_weight(QTensor(qtype, (rows, cols), b.reshape(rows, -1)), relay=relay)


def weight_bytes(w) -> int:
    """The weight's bytes as its file stores them (GB/s figures stay comparable across the upload
    layouts, weight_cuda.RELAID_QTYPES)."""
    from pocketcupy.backend import weight_cuda as wc

    if getattr(w, "qtype", None) in wc.GGUF_QTYPES:
        _, qk, ts = wc.GGUF_QTYPES[w.qtype]
        return w.rows * (w.cols // qk) * ts
    if getattr(w, "qtype", None) == "NVFP4":     # codes and their E4M3 scales (the tensor scales are negligible)
        return int(w.data.nbytes + w.scales.nbytes)
    return int(w.data.nbytes)


def bench_gemv(args, copy_gbps: float) -> dict:
    cp = _cp()
    from pocketcupy.backend import kquant_mma_cuda as kq
    from pocketcupy.backend import linear_cuda as lc
    from pocketcupy.backend import weight_cuda as wc

    rng = np.random.default_rng(0)
    qtypes = args.qtypes.split(",") if args.qtypes else ["F16", "Q8_0", "Q4_K"] if args.quick else \
        ["F16", "BF16", "FP8", "NVFP4", "Q8_0", "Q4_K", "Q6_K", "Q4_0"]
    shapes = [(14336, 4096), (4096, 14336)]
    batches = [1, 8] if args.quick else [1, 4, 8]
    out = {}
    for rows, cols in shapes:
        for qtype in qtypes:
            w0 = make_weight(qtype, rows, cols, rng)
            copies = [w0] + [make_weight(qtype, rows, cols, rng) for _ in range(-(-2 * L2_BYTES // weight_bytes(w0)) - 1)]
            for nb in batches:
                # GGUF: int8 and fp32 activations; dense past batch 1: the tensor-core GEMV and the fp32 one
                # (and their DP4A int8 GEMV where Q4_K / Q6_K take tensor cores)
                if qtype in wc.GGUF_QTYPES:
                    kinds = ("f32", "q8") + (("q8dp4a",) if nb > 1 and qtype in kq.GGUF_MMA_QTYPES else ())
                elif qtype in lc.CODES_GEMV_MAX_BATCH:    # and a variant: FP8 without sm_89+'s cvt, NVFP4 at U 8
                    kinds = ("codes", "swcvt" if qtype == "FP8" else "u8")
                else:
                    kinds = ("mma", "plain") if nb > 1 else ("plain",)
                for kind in kinds:
                    x = cp.random.standard_normal((nb, cols), dtype=cp.float32)
                    y = cp.empty((nb, rows), cp.float32)
                    it = iter(range(1 << 62))
                    ws = [dataclasses.replace(c, act_q8=kind.startswith("q8")) for c in copies]

                    def run():
                        w = ws[next(it) % len(ws)]
                        if w.is_dense:
                            lc.gemv_dense(x, w, None, y, kind=kind)
                        elif kind == "q8dp4a":
                            lc.launch_gemv_q8(w, *lc.quantize_x(x), None, y, nb)
                        else:
                            lc.linear(x, w, out=y)
                    saved = lc.FP8_HW_CVT, lc.NVFP4_UNROLL
                    lc.FP8_HW_CVT = saved[0] and kind != "swcvt"
                    lc.NVFP4_UNROLL = 8 if kind == "u8" else saved[1]
                    try:
                        t = time_us(run, args.reps, len(ws) * max(1, 8 // len(ws)))
                    finally:
                        lc.FP8_HW_CVT, lc.NVFP4_UNROLL = saved
                    gbps = weight_bytes(w0) / t["us"] / 1e3
                    if kind == "q8dp4a":
                        name = f"gemv_{qtype.lower()}_q8dp4a_bs{nb}"
                    elif qtype in wc.GGUF_QTYPES:
                        name = f"{lc.gemv_variant(ws[0], nb)}_{kind}act"
                    elif kind in ("codes", "swcvt", "u8"):
                        name = lc.gemv_variant(ws[0], nb) + ("" if kind == "codes" else f"_{kind}")
                    else:
                        name = lc.gemv_variant(ws[0], nb, dense_kind=kind)
                    out[f"{name}-{rows}x{cols}"] = {**t, "GBps": round(gbps, 1), "frac_copy_bw": round(gbps / copy_gbps, 3)}
            del copies, ws, w0
        # cuBLAS GEMV baseline: [nb, K] x [K, N] fp16 (cupy matmul)
        wts = [cp.random.standard_normal((cols, rows), dtype=cp.float32).astype(cp.float16)
               for _ in range(max(1, -(-2 * L2_BYTES // (rows * cols * 2))))]
        for nb in batches:
            x16 = cp.random.standard_normal((nb, cols), dtype=cp.float32).astype(cp.float16)
            y16 = cp.empty((nb, rows), cp.float16)
            it = iter(range(1 << 62))
            t = time_us(lambda: cp.matmul(x16, wts[next(it) % len(wts)], out=y16), args.reps, 2 * len(wts))
            gbps = rows * cols * 2 / t["us"] / 1e3
            out[f"cublas_gemv_f16_bs{nb}-{rows}x{cols}"] = {**t, "GBps": round(gbps, 1),
                                                           "frac_copy_bw": round(gbps / copy_gbps, 3)}
        del wts
    return out


# linear()'s paths for FP8 / NVFP4 past the GEMVs, as (module, setting, value) overrides: the tile kernel
# (the default), dequantization to fp16 tiles + cuBLAS
_CODES_BATCH_VARIANTS = {"tile": (), "dequant": (("codes_tile_cuda", "CODES_TILE_MAX_BATCH", 0),)}


def bench_batch(args, copy_gbps: float) -> dict:
    """The 8B decode step's weights at batches 16-64 (many sequences decoding), past the GEMVs: BF16
    through cuBLAS; FP8 / NVFP4 (--qtypes) by each of linear()'s paths (_CODES_BATCH_VARIANTS), their
    activations rounded to fp16 beforehand as the norms write them. GB/s of the weights as stored,
    cycled over copies larger than twice the L2."""
    cp = _cp()
    from pocketcupy.backend import linear_cuda as lc
    from pocketcupy.backend.settings import overridden
    from pocketcupy.backend.weight_cuda import Half16Rows

    rng = np.random.default_rng(3)
    out = {}
    for qtype in (args.qtypes.split(",") if args.qtypes else ["BF16"]):
        for rows, cols in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (49152, 4096)):
            w0 = make_weight(qtype, rows, cols, rng)
            copies = [w0] + [make_weight(qtype, rows, cols, rng)
                             for _ in range(-(-2 * L2_BYTES // weight_bytes(w0)) - 1)]
            for nb in ((32, 64) if args.quick else (16, 32, 48, 64)):
                x = cp.random.standard_normal((nb, cols), dtype=cp.float32)
                x16 = lc._cast(x, "BF16" if qtype == "BF16" else "F16")
                y = cp.empty((nb, rows), cp.float32)
                it = iter(range(1 << 62))
                variants = {"cublas": ()} if qtype == "BF16" else dict(_CODES_BATCH_VARIANTS)
                if qtype != "BF16":     # --tile-shapes: "tile_24134" = (MT, RG, KW, ST) (2, 4, 1, 3), 4 splits
                    variants.update({f"tile_{sh}": (
                        ("codes_tile_cuda", "SHAPE_OVERRIDE", tuple(map(int, sh[:4]))),
                        ("codes_tile_cuda", "SPLITS_OVERRIDE", int(sh[4:]) if sh[4:] else None))
                        for sh in args.tile_shapes.split(",") if sh})
                for variant, overrides in variants.items():
                    if qtype == "BF16":
                        def run():
                            lc._gemm_dense(x16, copies[next(it) % len(copies)], y)
                    else:
                        h = Half16Rows(x, x16, "F16")

                        def run():
                            lc.linear(h, copies[next(it) % len(copies)], out=y)
                    with overridden(overrides):
                        t = time_us(run, args.reps, len(copies) * max(1, 8 // len(copies)))
                    gbps = weight_bytes(w0) / t["us"] / 1e3
                    out[f"{qtype.lower()}_{variant}_bs{nb}-{rows}x{cols}"] = {
                        **t, "GBps": round(gbps, 1), "frac_copy_bw": round(gbps / copy_gbps, 3),
                        "TFLOPs": round(2 * nb * rows * cols / t["us"] / 1e6, 1)}
            del copies, w0
    return out


def bench_rows_per_block(args, copy_gbps: float) -> dict:
    """Batch-1 GEMV kernels launched directly with R = 1, 2, 4, 8 rows per block (linear()
    uses linear_cuda.rows_per_block), fp16 and Q4_K at 14336x4096."""
    cp = _cp()
    from pocketcupy.backend import linear_cuda as lc
    from pocketcupy.backend.kernels import kernel

    rng = np.random.default_rng(2)
    rows, cols = 14336, 4096
    x = cp.random.standard_normal((1, cols), dtype=cp.float32)
    y = cp.empty((1, rows), cp.float32)
    out = {}
    for qtype in ("F16", "Q4_K"):
        w0 = make_weight(qtype, rows, cols, rng)
        copies = [w0] + [make_weight(qtype, rows, cols, rng) for _ in range(-(-2 * L2_BYTES // weight_bytes(w0)) - 1)]
        xq, xds = lc.quantize_x(x)
        for r in (1, 2, 4, 8):
            if qtype == "F16":
                expr = f"gemv_dense<0, 1, {r}>"
                fn = kernel("gemv.cu", expr, name_expressions=(expr,))
                args_of = lambda w: (w.data, np.int32(rows), np.int32(cols), x, np.uint64(0), y)  # noqa: E731
            else:
                expr = f"gemv_gguf<12, 1, {r}>"
                fn = kernel("gemv_gguf.cu", expr, name_expressions=(expr,))
                args_of = lambda w: (w.data, np.int64(w.data.shape[1]), np.int32(rows), np.int32(cols),  # noqa: E731
                                     xq, xds, np.uint64(0), np.uint64(0), y)
            it = iter(range(1 << 62))
            t = time_us(lambda: fn(((rows + r - 1) // r,), (lc.GEMV_THREADS,), args_of(copies[next(it) % len(copies)])),
                        args.reps, len(copies) * max(1, 8 // len(copies)))
            gbps = weight_bytes(w0) / t["us"] / 1e3
            out[f"gemv_{qtype.lower()}_bs1_R{r}-{rows}x{cols}"] = {**t, "GBps": round(gbps, 1),
                                                                  "frac_copy_bw": round(gbps / copy_gbps, 3)}
        del copies, w0
    return out


def bench_gemm(args, peak_tflops: float, copy_gbps: float) -> dict:
    """linear() past the GEMVs (a prefill) on the 8B model's q/k/v-, gate/up- and down-shaped weights:
    cuBLAS for BF16, dequantization into fp16 tiles + cuBLAS for GGUF types; for those also the
    dequantization alone (GB/s of blocks read + fp16 written)."""
    cp = _cp()
    from pocketcupy.backend import linear_cuda as lc

    rng = np.random.default_rng(1)
    shapes = [(2048, 14336, 4096), (2048, 4096, 14336), (8192, 6144, 4096), (8192, 28672, 4096)] + \
        ([] if args.quick else [(512, 14336, 4096), (512, 4096, 14336)])
    out = {}
    for qtype in ("BF16", "Q4_K", "Q6_K"):
        for n, k in sorted({(n, k) for _, n, k in shapes}):
            w = make_weight(qtype, n, k, rng)
            for m in [m for m, n2, k2 in shapes if (n2, k2) == (n, k)]:
                x = cp.random.standard_normal((m, k), dtype=cp.float32)
                y = cp.empty((m, n), cp.float32)
                t = time_us(lambda: lc.linear(x, w, out=y), max(3, args.reps // 4), 2)
                tf = 2 * m * k * n / t["us"] / 1e6
                out[f"linear_{qtype.lower()}-{m}x{k}x{n}"] = {**t, "TFLOPs": round(tf, 1),
                                                               "frac_f16_peak": round(tf / peak_tflops, 3)}
            if w.is_dense:
                continue
            tile = lc.dequant_tile_rows(n, k)
            scratch = cp.empty((tile, k), cp.float16)

            def run():
                for r0 in range(0, n, tile):
                    lc.dequant_tile(w, r0, min(tile, n - r0), scratch)
            t = time_us(run, args.reps, 2)
            gbps = (weight_bytes(w) + 2 * n * k) / t["us"] / 1e3
            out[f"dequant_{qtype.lower()}-{n}x{k}"] = {**t, "GBps": round(gbps, 1),
                                                       "frac_copy_bw": round(gbps / copy_gbps, 3)}
    return out


def _bench_decode_attention(args, copy_gbps, cache, tag, hq, hkv, d, shapes, bs) -> dict:
    """Decode attention over (context, batch) shapes for one head layout: each variant with the
    launcher's split count, and the tensor-core kernel with forced split counts at batches <= 16."""
    from pocketcupy.backend import attn_cuda
    from pocketcupy.backend.attention_meta import AttentionMetadata

    cp = _cp()
    out = {}
    variants = (["plain"] if args.kv_cache_dtype == "auto" else []) + \
        (["mma"] if attn_cuda.decode_variant(d) == "mma" else [])   # codes: the mma kernel only
    for ctx, batch in shapes:
        kc, vc, tables = cache(batch, ctx, hkv, d)
        meta = AttentionMetadata(np.arange(batch + 1, dtype=np.int32), np.full(batch, ctx, np.int32),
                                 tables, (tables[:, -1].astype(np.int64) * bs + (ctx - 1) % bs), bs,
                                 decode_only=True)
        dmeta = attn_cuda.device_meta(meta)
        q = cp.random.standard_normal((batch, hq, d), dtype=cp.float32)
        o = cp.empty_like(q)
        kv_bytes = batch * ctx * hkv * kv_pair_bytes(args.kv_cache_dtype, d, 2)
        for variant in variants:
            t = time_us(lambda: attn_cuda.attn_decode(q, kc, vc, dmeta, d ** -0.5, out=o, variant=variant),
                        args.reps, 10)
            gbps = kv_bytes / t["us"] / 1e3
            out[f"{tag}attn_decode_{variant}-ctx{ctx}-b{batch}"] = {**t, "GBps": round(gbps, 1),
                                                                    "frac_copy_bw": round(gbps / copy_gbps, 3)}
        if batch <= 16 and "mma" in variants:         # the launcher's split count against forced ones
            for splits in (1, 2, 4, 8, 16, 32, 64):
                t = time_us(lambda s=splits: attn_cuda.attn_decode(q, kc, vc, dmeta, d ** -0.5, out=o, num_splits=s,
                                                                   variant="mma"), args.reps, 10)
                out[f"{tag}attn_decode_mma-ctx{ctx}-b{batch}-splits{splits}"] = t
        del kc, vc
    return out


def bench_attention(args, copy_gbps: float) -> dict:
    """Decode attention (plain and tensor-core kernels) at context 512 with batch 1 / 4 / 16, 4096 /
    32768 with batch 1 / 16 and context 1024 with batch 64 (and SmolLM2's heads at a few of them),
    prefill 2048, and a 48-token chunk over an 8064-token cached prefix with and without split-KV
    (Llama-3-8B heads: 32 q, 8 kv, dim 128, paged cache of 16-token blocks: fp16, or --kv-cache-dtype's
    codes with their scales)."""
    try:
        from pocketcupy.backend import attn_cuda
        from pocketcupy.backend.attention_meta import AttentionMetadata
    except ImportError as e:
        return {"skipped": f"attention launchers not importable: {e}"}
    cp = _cp()
    hq, hkv, d, bs = 32, 8, 128, 16
    out = {}

    def cache(batch, ctx, hkv=hkv, d=d):
        from pocketcupy.backend.kv_pages_cuda import empty_kv_pages

        nblk = batch * (-(-ctx // bs))
        tables = np.arange(nblk, dtype=np.int32).reshape(batch, -1)
        if args.kv_cache_dtype == "auto":
            return tuple(cp.random.standard_normal((nblk, bs, hkv, d), dtype=cp.float32).astype(cp.float16)
                         for _ in range(2)) + (tables,)
        pages = empty_kv_pages(nblk, bs, hkv, d, args.kv_cache_dtype)
        for c in pages:          # random codes (E4M3: finite ones), scales of unit-variance rows
            if c.kind == "int4":     # two codes a byte; (scale, minimum) pairs per group
                c.codes[...] = cp.random.randint(0, 256, c.codes.shape, dtype=np.int32).astype(c.codes.dtype)
                c.params[..., 0::2], c.params[..., 1::2] = 0.25, -1.9
                continue
            codes = cp.random.randint(0, 0x7F, c.codes.shape, dtype=np.int32)
            if c.kind == "fp8":
                codes |= cp.random.randint(0, 2, c.codes.shape, dtype=np.int32) << 7
            c.codes[...] = (codes - 63 if c.kind == "int8" else codes).astype(c.codes.dtype)
            c.params[...] = 0.03
        return pages + (tables,)

    shapes = [(512, 1), (512, 4), (512, 16), (4096, 1), (4096, 16), (1024, 64)] + \
        ([] if args.quick else [(32768, 1), (32768, 16)])
    # Llama-3-8B's heads, then SmolLM2's (9 q, 3 kv, dim 64; keys tagged "smol-")
    for tag, hq_, hkv_, d_, shapes_ in (("", hq, hkv, d, shapes), ("smol-", 9, 3, 64, [(512, 1), (512, 4), (4096, 1)])):
        out.update(_bench_decode_attention(args, copy_gbps, cache, tag, hq_, hkv_, d_, shapes_, bs))
    n = 2048
    kc, vc, tables = cache(1, n)
    meta = AttentionMetadata(np.array([0, n], np.int32), np.array([n], np.int32), tables,
                             np.arange(n, dtype=np.int64), bs)
    dmeta = attn_cuda.device_meta(meta)
    q = cp.random.standard_normal((n, hq, d), dtype=cp.float32)
    o = cp.empty_like(q)
    t = time_us(lambda: attn_cuda.attn_prefill(q, kc, vc, dmeta, d ** -0.5, out=o), max(3, args.reps // 4), 2)
    flops = 4 * n * n * hq * d / 2                            # causal: half of QK^T and PV
    out[f"attn_prefill-{n}"] = {**t, "TFLOPs": round(flops / t["us"] / 1e6, 1)}
    del kc, vc, q, o
    out.update(bench_prefill_over_prefix(args, cache, hq, d, bs))
    return out


def bench_prefill_over_prefix(args, cache, hq: int, d: int, bs: int, prefix: int = 8064, n: int = 48) -> dict:
    """A prefix-cache hit: n new tokens over `prefix` cached ones, one (query tile, head) block per
    head unsplit; timed unsplit, with the launcher's split count, and over a sweep of counts."""
    from pocketcupy.backend import attn_cuda
    from pocketcupy.backend.attention_meta import AttentionMetadata

    cp = _cp()
    ctx = prefix + n
    kc, vc, tables = cache(1, ctx)
    meta = AttentionMetadata(np.array([0, n], np.int32), np.array([ctx], np.int32), tables,
                             np.arange(prefix, ctx, dtype=np.int64), bs)
    dmeta = attn_cuda.device_meta(meta)
    q = cp.random.standard_normal((n, hq, d), dtype=cp.float32)
    o = cp.empty_like(q)
    variant = attn_cuda.prefill_variant(d)
    auto = attn_cuda.prefill_splits(n // attn_cuda.PREFILL_TILE[variant] + 1, hq, tables.shape[1] * bs,
                                    attn_cuda.num_sms())
    flops = 4 * n * ctx * hq * d
    out = {}
    for splits in sorted({1, auto} | ({2, 4, 8, 16, 32} if not args.quick else set())):
        t = time_us(lambda s=splits: attn_cuda.attn_prefill(q, kc, vc, dmeta, d ** -0.5, out=o, num_splits=s),
                    args.reps, 10)
        tag = "auto" if splits == auto else "forced"
        out[f"attn_prefill-{n}-over-{prefix}-{variant}-splits{splits}"] = {
            **t, "TFLOPs": round(flops / t["us"] / 1e6, 2), "choice": tag}
    base = out[f"attn_prefill-{n}-over-{prefix}-{variant}-splits1"]["us"]
    split_us = out[f"attn_prefill-{n}-over-{prefix}-{variant}-splits{auto}"]["us"]
    print(f"attn_prefill {n} tokens over {prefix} cached ({variant}, hq {hq}, hd {d}): "
          f"unsplit {base:.1f} us, split x{auto} {split_us:.1f} us ({base / split_us:.1f}x)", file=sys.stderr)
    return out


BENCHES = ("gemv", "batch", "gemm", "attention")
QTYPES = ("F16", "BF16", "FP8", "NVFP4", *_SCALE_FIELDS)     # the formats make_weight builds


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Usage errors before anything runs (an unknown qtype was a KeyError once the GPU had timed the ceilings)."""
    for flag, given, known in (("--only", args.only, BENCHES), ("--qtypes", args.qtypes or "", QTYPES)):
        bad = [v for v in given.split(",") if v and v not in known]
        if bad:
            ap.error(f"{flag}: unknown {bad[0]!r} (choose from {', '.join(known)})")
    bad = [sh for sh in args.tile_shapes.split(",") if sh and not (len(sh) in (4, 5) and sh.isdigit())]
    if bad:
        ap.error(f"--tile-shapes: {bad[0]!r} is not 4 or 5 digits (MT RG KW ST [splits])")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="gemv,batch,gemm,attention",
                    help="comma list of gemv, batch, gemm, attention")
    ap.add_argument("--reps", type=bench_args.count(), default=None)
    ap.add_argument("--qtypes", default=None,
                    help="the gemv and batch benchmarks' weight formats, e.g. BF16,FP8,NVFP4")
    ap.add_argument("--tile-shapes", default="",
                    help="the batch benchmark's extra gemm_codes_tile launches, as MT RG KW ST digits and the "
                         "splits of K (none: its own choice), e.g. 24131,24138,1242")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                    help="the attention benchmarks' KV pages (quantized: codes and their scales)")
    args = ap.parse_args(argv)
    check_args(ap, args)
    bench_args.require_gpu(ap, "times CUDA kernels")
    args.reps = args.reps or (5 if args.quick else 30)
    only = set(args.only.split(","))
    cp = _cp()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    res: dict = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                 "kv_cache_dtype": args.kv_cache_dtype}
    res["copy"] = copy_bandwidth(args.reps)
    res["gemm_f16_8192"] = gemm_peak(max(3, args.reps // 3))
    copy_gbps, peak = res["copy"]["GBps"], res["gemm_f16_8192"]["TFLOPs"]
    if "gemv" in only:
        res["gemv"] = bench_gemv(args, copy_gbps)
        if not args.quick:
            res["gemv_rows_per_block"] = bench_rows_per_block(args, copy_gbps)
    if "batch" in only:
        res["batch"] = bench_batch(args, copy_gbps)
    if "gemm" in only:
        res["gemm"] = bench_gemm(args, peak, copy_gbps)
    if "attention" in only:
        try:
            res["attention"] = bench_attention(args, copy_gbps)
        except Exception as e:                              # another engineer's launchers: report, go on
            res["attention"] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

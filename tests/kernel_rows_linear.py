"""Kernel-table rows for linear (GEMV for N <= 8, tiled GEMV for quantized N <= 32, cuBLAS
GEMM beyond) and get_rows, for every weight format the CUDA backend reads.

Inputs: dense weights are random normals; GGUF blocks come from tests/gguf_blocks.py (the gguf
quantizer where it has one, else random bytes with small fp16 scales). Reference: the weights
dequantized by the gguf package, float64 NumPy, with the activations rounded to int8 blocks
(act_q8.q8_roundtrip) where the weight takes int8 activations ("auto": rows longer than 2048).
Tolerances: the GEMV's integer dot products are exact (~1e-6); the GEMM path and the tensor-core
GEMV (dense, batch 1-8, rows of whole 64-weight chunks) cast the activations to fp16 (~3e-4) or bf16
(~1e-3); the plain dense GEMV (other rows) keeps them fp32."""
from __future__ import annotations

import numpy as np

from pocketcupy.backend import kquant_mma_cuda, kquant_tile_cuda, weight_cuda
from pocketcupy.backend.linear_cuda import KQUANT_QTYPES, Q8Gemv
from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.quant.act_q8 import q8_roundtrip, q8k_roundtrip, uses_q8
from pocketcupy.quant.dequant import f32_to_bf16
from pocketcupy.quant.qtensor import QTensor
from tests.gguf_blocks import QTYPES, random_blocks
from tests.kernel_table import KernelRow

ROWS_OUT = 67                   # not a multiple of the rows per block (2 or 4)
BATCHES = (1, 2, 4, 8, 33)


def _cols(qtype: str) -> int:
    if qtype in QTYPES:
        return 5120 if QTYPES[qtype][1] == 256 else 4128      # 160 / 129 units per row
    return 1048                                                # 131 16-byte chunks


def _weight(rng, qtype: str, rows: int, cols: int) -> np.ndarray:
    if qtype in QTYPES:
        return random_blocks(rng, qtype, rows, cols)
    w = rng.standard_normal((rows, cols), dtype=np.float32) * 0.05
    if qtype == "F16":
        return w.astype(np.float16)
    if qtype == "BF16":
        return f32_to_bf16(w)
    return w                                                  # F32: uploaded as fp16


def _deq64(inp) -> np.ndarray:
    return QTensor(inp["qtype"], inp["shape"], inp["w"]).dequantize().astype(np.float64)


def _make_linear(qtype: str, n: int, cols: int, bias: bool, act: str = "auto", rows: int = ROWS_OUT):
    def make(rng):
        inp = {"qtype": qtype, "shape": (rows, cols), "w": _weight(rng, qtype, rows, cols),
               "x": rng.standard_normal((n, cols), dtype=np.float32), "act": act}
        if bias:
            inp["bias"] = rng.standard_normal(rows, dtype=np.float32)
        return inp
    return make


def _ref_x(inp, x) -> np.ndarray:
    """The activations as the weight's linear sees them, float64: rounded to int8 per 32 values, or
    per 256 on the K-quant tensor-core path (inp["act_block"]: that block size whatever linear picks,
    for rows that launch a kernel themselves)."""
    from pocketcupy.backend.kquant_mma_cuda import kquant_mma_applies

    qtype, cols = inp["qtype"], inp["shape"][1]
    if uses_q8(qtype, cols, inp["act"]):
        block = inp.get("act_block") or (256 if kquant_mma_applies(qtype, cols, x.shape[0], True) else 32)
        x = q8k_roundtrip(x) if block == 256 else q8_roundtrip(x)
    return x.astype(np.float64)


def _ref_linear(inp):
    b = inp.get("bias")
    return NumpyOps().linear(_ref_x(inp, inp["x"]), _deq64(inp), None if b is None else b.astype(np.float64))


def _ref_linear_per32(inp):
    """_ref_linear for the rows that launch a per-32 int8 kernel themselves (_cuda_gemv_q8)."""
    return _ref_linear({**inp, "act_block": 32})


def _cuda_weight(inp):
    """The weight uploaded as weight_cuda does; inp["raw"]: Q6_K kept in its 210-byte blocks."""
    return weight_cuda.prepare_weight(QTensor(inp["qtype"], inp["shape"], inp["w"]), inp["act"],
                                      relay=False if inp.get("raw") else None)


def _cuda_linear(tile_elems: int | None = None):
    def run(inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda

        w = _cuda_weight(inp)
        out = poison((inp["x"].shape[0], inp["shape"][0]), np.float32)
        bias = cp.asarray(inp["bias"]) if "bias" in inp else None
        saved = linear_cuda.DEQUANT_TILE_ELEMS
        if tile_elems is not None:
            linear_cuda.DEQUANT_TILE_ELEMS = tile_elems
        try:
            return linear_cuda.linear(cp.asarray(inp["x"]), w, bias, out=out)
        finally:
            linear_cuda.DEQUANT_TILE_ELEMS = saved
    return run


def _cuda_gemv_config(config: str):
    """The fp32-activation GEMV launched with an explicit shape (lanes:L:R, xs:R, xsw:R, block:R)."""
    def run(inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda

        kind, *nums = config.split(":")
        cfg = linear_cuda.F32Gemv(kind, int(nums[-1]), int(nums[0]) if kind == "lanes" else 0)
        w = _cuda_weight(inp)
        n = inp["x"].shape[0]
        out = poison((n, inp["shape"][0]), np.float32)
        bias = cp.asarray(inp["bias"]) if "bias" in inp else None
        linear_cuda.launch_gemv_f32(w, cp.asarray(inp["x"]), bias, out, n, cfg)
        return out
    return run


def _cuda_gemv_q8(cfg=None):
    """The DP4A int8 GEMV (gemv_gguf.cu) itself, whatever linear() would pick: launched as cfg
    (linear_cuda.Q8Gemv; None: q8_gemv_launch's choice)."""
    def run(inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda

        w = _cuda_weight(inp)
        x = cp.asarray(inp["x"])
        n = x.shape[0]
        out = poison((n, inp["shape"][0]), np.float32)
        xq, xds = linear_cuda.quantize_x(x)
        linear_cuda.launch_gemv_q8(w, xq, xds, cp.asarray(inp["bias"]) if "bias" in inp else None, out, n, cfg)
        return out
    return run


def _cuda_gemv_kquant_mma(inp, poison):
    """The per-256 int8 tensor-core GEMV (gemv_kquant_mma.cu) itself, its activations quantized by
    quantize_x_q8k (inp["up"]: of silu(x) * up)."""
    import cupy as cp

    w = _cuda_weight(inp)
    x = cp.asarray(inp["x"])
    n = x.shape[0]
    out = poison((n, inp["shape"][0]), np.float32)
    xk = kquant_mma_cuda.quantize_x_q8k(x, cp.asarray(inp["up"]) if "up" in inp else None)
    nt = -(-n // 8)
    kquant_mma_cuda.launch_gemv_kquant_mma(w, xk, cp.asarray(inp["bias"]) if "bias" in inp else None, out, n,
                                       1 << (nt - 1).bit_length(), inp.get("groups"))
    return out


def _cuda_gemm_kquant_tile(shape):
    """The shared-memory tile kernel (gemm_kquant_tile.cu) itself with launch shape (MT, RG, KW, ST)."""
    def run(inp, poison):
        import cupy as cp

        w = _cuda_weight(inp)
        x = cp.asarray(inp["x"])
        n = x.shape[0]
        out = poison((n, inp["shape"][0]), np.float32)
        xk = kquant_mma_cuda.quantize_x_q8k(x, cp.asarray(inp["up"]) if "up" in inp else None)
        kquant_tile_cuda.launch_gemm_kquant_tile(w, xk, cp.asarray(inp["bias"]) if "bias" in inp else None, out, n,
                                                shape)
        return out
    return run


def _ref_kquant_mma(inp):
    x = inp["x"] if "up" not in inp else NumpyOps().silu_mul(inp["x"], inp["up"])
    return _ref_linear({**inp, "x": x, "act_block": 256})


def _linear_tol(qtype: str, n: int) -> float:
    if qtype in QTYPES and n <= 32:
        return 2e-5                       # exact integer dots (int8 activations) or fp32 activations
    if n <= 8 and qtype in ("F16", "BF16"):
        return 1e-5                       # fp32 activations, fp32 accumulation
    if qtype == "BF16":
        return 1e-2                       # bf16 activations into cuBLAS
    if qtype == "F32":
        return 2e-3                       # weights rounded to fp16 on upload
    return 3e-3                           # fp16 activations (and fp16 dequantized weights)


def _linear_rows():
    rows = []
    for qtype in ["F16", "BF16"] + list(QTYPES):
        cols = _cols(qtype)
        for n in BATCHES:
            path = (f"gemv_{qtype.lower()}_bs{n}" if n <= 8 else f"gemm_{qtype.lower()}_n{n}")
            rows.append(KernelRow("linear", f"{path}-{ROWS_OUT}x{cols}", _make_linear(qtype, n, cols, n == 2),
                                  _ref_linear, _cuda_linear(), _linear_tol(qtype, n)))
    # fp16 / bf16 batch 1-8 on tensor cores (rows of whole 64-weight chunks; 17 of them: a warp's
    # last pair of chunks is half past the end), x rounded to the weight's type
    for qtype, tol in (("F16", 1e-3), ("BF16", 5e-3)):
        for n in (1, 2, 5, 8):
            rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_mma_bs{n}-{ROWS_OUT}x1088",
                                  _make_linear(qtype, n, 1088, n == 5), _ref_linear, _cuda_linear(), tol))
    # short rows at batch 1 over F32_BLOCK_MIN_ROWS rows (an LM head): the fp32 block kernel, 4 rows a
    # block (16387: the last block's rows end past the matrix)
    for qtype in ("Q8_0", "Q4_1"):
        rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_f32_block_r4_bs1-16387x576",
                              _make_linear(qtype, 1, 576, qtype == "Q8_0", rows=16387), _ref_linear, _cuda_linear(),
                              _linear_tol(qtype, 1)))
    # Q4_K / Q6_K past batch 1 on int8 tensor cores (sm_80+): 2 and 4 tiles of 8 batch columns (the
    # rows above cover one tile); and the DP4A GEMV, which older GPUs run instead
    for qtype in ("Q4_K", "Q6_K"):
        for n in (12, 29):
            rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_q8mma_bs{n}-{ROWS_OUT}x{_cols(qtype)}",
                                  _make_linear(qtype, n, _cols(qtype), n == 12), _ref_linear, _cuda_linear(), 2e-5))
        for n in (2, 8):
            rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_q8dp4a_bs{n}-{ROWS_OUT}x{_cols(qtype)}",
                                  _make_linear(qtype, n, _cols(qtype), n == 2), _ref_linear_per32, _cuda_gemv_q8(), 2e-5))
    # the tensor-core kernel launched directly (gemv_kquant_mma.cu, activations per 256): 1-8 tiles,
    # raw Q6_K blocks, silu(x) * up quantized by quantize_x_q8k, and tiles in passes of TG with W warps
    # a block, U super-blocks at a time per warp, RW row groups a block, ACC, MT 16-row tiles a warp
    # (groups: (TG, W[, U[, MINB, RW[, ACC[, MT]]]]); 67 rows: whole row groups or tiles of the last
    # block lie past the end); batches of
    # whole tiles at 8 tiles (64) or with ACC (32) take the FULL instances
    for qtype, n, extra in (("Q4_K", 3, {}), ("Q4_K", 8, {}), ("Q4_K", 12, {}), ("Q4_K", 29, {}),
                            ("Q6_K", 4, {}), ("Q6_K", 16, {}), ("Q6_K", 30, {}), ("Q6_K", 5, {"raw": True}),
                            ("Q4_K", 6, {"up": True}), ("Q6_K", 9, {"up": True}), ("Q4_K", 50, {}), ("Q6_K", 64, {}),
                            ("Q4_K", 64, {"groups": (2, 8)}), ("Q6_K", 29, {"groups": (2, 4)}),
                            ("Q4_K", 40, {"groups": (4, 4)}), ("Q4_K", 5, {"groups": (1, 4, 2)}),
                            ("Q6_K", 11, {"groups": (2, 2, 4)}), ("Q4_K", 64, {"groups": (8, 4, 2, 0, 4)}),
                            ("Q6_K", 29, {"groups": (4, 8, 1, 0, 4)}), ("Q5_K", 13, {"groups": (2, 4, 2, 0, 2)}),
                            ("Q4_K", 7, {"groups": (1, 8, 2, 0, 2), "up": True}),
                            ("Q4_K", 64, {"groups": (8, 4, 1, 0, 4)}), ("Q6_K", 40, {"groups": (8, 8, 1, 0, 2)}),
                            ("Q4_K", 5, {"groups": (1, 4, 2, 0, 1, 1)}), ("Q4_K", 61, {"groups": (8, 4, 1, 0, 4, 1)}),
                            ("Q5_K", 27, {"groups": (4, 4, 1, 0, 1, 1), "up": True}),
                            ("Q4_K", 32, {"groups": (4, 4, 1, 0, 1, 1)}),
                            ("Q4_K", 5, {"groups": (1, 4, 1, 0, 1, 0, 2)}), ("Q6_K", 4, {"groups": (1, 4, 1, 0, 1, 0, 2)}),
                            ("Q6_K", 6, {"groups": (1, 4, 2, 0, 2, 0, 2), "raw": True}),
                            ("Q5_K", 7, {"groups": (1, 8, 1, 0, 1, 0, 2), "up": True}),
                            ("Q6_K", 13, {"groups": (2, 4, 1, 0, 1, 0, 2)}), ("Q4_K", 64, {"groups": (8, 4, 1, 0, 2, 0, 2)}),
                            ("Q5_K", 3, {}), ("Q5_K", 20, {}), ("Q5_K", 64, {}),
                            ("Q5_K", 7, {"up": True})):
        make = _make_linear(qtype, n, _cols(qtype), n in (3, 12, 4))
        tag = "".join(f"-{k}" + ("".join(f"_{v}" for v in x) if isinstance(x, tuple) else "") for k, x in extra.items())

        def make_k(rng, make=make, extra=extra):
            inp = {**make(rng), **extra}
            if extra.get("up"):
                inp["up"] = rng.standard_normal(inp["x"].shape, dtype=np.float32)
            return inp
        rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_q8kmma_bs{n}{tag}-{ROWS_OUT}x{_cols(qtype)}",
                              make_k, _ref_kquant_mma, _cuda_gemv_kquant_mma, 2e-5))
    # the shared-memory tile kernel (gemm_kquant_tile.cu) at batches 33-64, shapes (MT, RG, KW, ST):
    # 67 rows end inside a block; KW 3 over 20 super-blocks ends inside a step. (silu(x) * up: NumPy's
    # and CUDA's float SiLU round an int8 activation differently now and then: a Q5_K row at batch 64
    # failed with 9.8e-5 for one such value of 327,680, the tile and gemv_kquant_mma kernels agreeing
    # to 2.2e-7 on that int8 input; the rows with up are ones where none differs.)
    for qtype, n, shape, up in (("Q4_K", 64, (1, 4, 1, 3), False), ("Q4_K", 37, (2, 2, 1, 2), True),
                                ("Q6_K", 50, (1, 2, 2, 2), False), ("Q5_K", 33, (1, 1, 3, 3), False),
                                ("Q6_K", 64, (2, 1, 3, 2), True), ("Q5_K", 64, (1, 4, 1, 2), False),
                                ("Q4_K", 41, (1, 2, 3, 2), False), ("Q6_K", 64, (1, 8, 1, 2), False),
                                ("Q4_K", 64, (2, 7, 1, 2), True)):
        make = _make_linear(qtype, n, _cols(qtype), n == 50)

        def make_t(rng, make=make, up=up):
            inp = make(rng)
            if up:
                inp["up"] = rng.standard_normal(inp["x"].shape, dtype=np.float32)
            return inp
        rows.append(KernelRow("linear", f"gemm_{qtype.lower()}_q8tile_bs{n}-{'_'.join(map(str, shape))}"
                              f"{'-up' if up else ''}-{ROWS_OUT}x{_cols(qtype)}",
                              make_t, _ref_kquant_mma, _cuda_gemm_kquant_tile(shape), 2e-5))
    # the K-quant kernel over 64-value groups: R rows per warp, U groups in flight per lane (rows of 80
    # groups end inside a lane's last U-group step); kqsplit: R rows per block, 128 threads over the groups
    for qtype in KQUANT_QTYPES:
        for kind, r, u, n in (("kquant", 1, 4, 1), ("kquant", 2, 2, 1), ("kquant", 1, 2, 2), ("kquant", 1, 1, 1),
                              ("kquant", 1, 1, 5), ("kquant", 2, 1, 8), ("kqsplit", 2, 1, 1), ("kqsplit", 4, 2, 2)):
            cfg = Q8Gemv(kind, r, unroll=u)
            rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_q8{cfg.name()}_bs{n}-{ROWS_OUT}x{_cols(qtype)}",
                                  _make_linear(qtype, n, _cols(qtype), r == 2), _ref_linear_per32, _cuda_gemv_q8(cfg), 2e-5))
    # the 8-rows-a-block launch of tall Q8_0 matrices at batch 1 (q8_gemv_launch: Q8_B1_TALL_ROWS), 67 rows
    rows.append(KernelRow("linear", f"gemv_q8_0_q8r8_t128_bs1-{ROWS_OUT}x4096", _make_linear("Q8_0", 1, 4096, True),
                          _ref_linear_per32, _cuda_gemv_q8(Q8Gemv("block", 8)), 2e-5))
    # Q6_K in its raw 210-byte blocks (uploads re-lay them as Q6_KR): the word-load paths
    for n, cfg in ((1, Q8Gemv("kquant", 2)), (2, None), (12, None)):
        make = _make_linear("Q6_K", n, _cols("Q6_K"), True)
        rows.append(KernelRow("linear", f"gemv_q6_k_raw_{'q8kq2u1' if cfg else 'q8'}_bs{n}-{ROWS_OUT}x{_cols('Q6_K')}",
                              lambda rng, make=make: {**make(rng), "raw": True},
                              _ref_linear_per32 if cfg else _ref_linear, _cuda_gemv_q8(cfg) if cfg else _cuda_linear(),
                              2e-5))
    # quantized GEMV with fp32 activations (quant_activations="f32"; "auto" on rows <= 2048)
    for qtype in QTYPES:
        cols = _cols(qtype)
        for n in (1, 3, 8, 19):
            rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_f32act_bs{n}-{ROWS_OUT}x{cols}",
                                  _make_linear(qtype, n, cols, n == 3, "f32"), _ref_linear, _cuda_linear(), 2e-5))
    # int8 activations on short rows (quant_activations="q8"), and the GEMM path's fp16 rounded activations
    for qtype, cols, n in (("Q4_1", 576, 1), ("Q8_0", 576, 3), ("Q6_K", 1792, 2), ("Q4_K", 256, 8), ("Q4_K", 4096, 4),
                           ("Q4_K", 4096, 1), ("Q4_K", 256, 1), ("Q5_K", 1280, 1), ("Q6_K", 1792, 1), ("Q2_K", 512, 1)):
        rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_q8act_bs{n}-{ROWS_OUT}x{cols}",
                              _make_linear(qtype, n, cols, n == 3, "q8"), _ref_linear, _cuda_linear(), 2e-5))
    # linear()'s batch-1 launch of long Q4_K / Q5_K rows on more than KQUANT_SMALL_ROWS rows: gemv_kquant_split
    for qtype, cols in (("Q4_K", 4096), ("Q5_K", 8192)):
        rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_q8act_bs1-2118x{cols}",
                              _make_linear(qtype, 1, cols, True, "q8", rows=2118), _ref_linear, _cuda_linear(), 2e-5))
    rows.append(KernelRow("linear", f"gemm_q4_1_q8act_n40-{ROWS_OUT}x576", _make_linear("Q4_1", 40, 576, True, "q8"),
                          _ref_linear, _cuda_linear(), 3e-3))
    # fp32 activations, every launch shape: lanes kernel (rows of <= 32 / <= 64 units: L = 16 / 32),
    # xs kernel (x staged in shared memory) with a partial last chunk and with rows of whole chunks
    for qtype, cols, ns in (("Q4_1", 576, (1, 2, 3, 8)), ("Q8_0", 576, (1, 5)), ("Q4_1", 1536, (1, 2, 4)),
                            ("Q4_K", 256, (1, 2)), ("Q6_K", 1792, (1, 8)), ("Q4_0", 2048, (1, 2)),
                            ("Q8_0", 8192, (1, 2, 7)), ("Q4_K", 12288, (1, 2, 3)), ("IQ2_XXS", 4352, (1, 6))):
        for n in ns:
            rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_f32act_bs{n}-{ROWS_OUT}x{cols}",
                                  _make_linear(qtype, n, cols, n == 2, "f32"), _ref_linear, _cuda_linear(), 2e-5))
    # launch shapes linear() does not pick by default (benchmark candidates), rows 16-byte aligned for xsw
    for qtype, cols in (("Q8_0", 4352), ("Q4_K", 5120), ("Q4_1", 4224)):
        for cfg, n in (("xsw:4", 1), ("xsw:2", 2), ("xsw:4", 3), ("xs:8", 1), ("lanes:8:2", 1), ("lanes:4:4", 2),
                       ("block:2", 1)):
            name = f"gemv_{qtype.lower()}_f32act_{cfg.replace(':', '_')}_bs{n}-{ROWS_OUT}x{cols}"
            rows.append(KernelRow("linear", name, _make_linear(qtype, n, cols, n == 2, "f32"), _ref_linear,
                                  _cuda_gemv_config(cfg), 2e-5))
    # quantized GEMV over column tiles (9..32), bias on
    for qtype in ("Q4_K", "Q8_0", "IQ2_XXS"):
        cols = _cols(qtype)
        rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_tiled_n19-{ROWS_OUT}x{cols}",
                              _make_linear(qtype, 19, cols, True), _ref_linear, _cuda_linear(), 2e-5))
    # short rows ("auto": fp32 activations)
    for qtype, cols, n in (("F16", 200, 1), ("BF16", 584, 5), ("Q8_0", 576, 1), ("Q4_1", 1536, 3),
                           ("Q4_K", 512, 1), ("Q6_K", 2048, 8)):
        rows.append(KernelRow("linear", f"gemv_{qtype.lower()}_bs{n}_short-{ROWS_OUT}x{cols}",
                              _make_linear(qtype, n, cols, True), _ref_linear, _cuda_linear(),
                              2e-5 if qtype in QTYPES else 1e-5))
    # quantized GEMM (past the tensor-core GEMV's 64) over dequantized tiles of 128, 128 and 44 rows
    rows.append(KernelRow("linear", "gemm_q6_k_n70_rowtiles-300x1280", _make_linear("Q6_K", 70, 1280, True, rows=300),
                          _ref_linear, _cuda_linear(tile_elems=128 * 1280), 3e-3))
    # dense K % 8 != 0 -> cuBLAS even at batch 1; F32 matrices upload as fp16
    rows.append(KernelRow("linear", f"gemm_f16_k1001_bs1-{ROWS_OUT}x1001", _make_linear("F16", 1, 1001, True),
                          _ref_linear, _cuda_linear(), 3e-3))
    rows.append(KernelRow("linear", f"gemv_f32asf16_bs3-{ROWS_OUT}x1048", _make_linear("F32", 3, 1048, False),
                          _ref_linear, _cuda_linear(), 2e-3))
    return rows


def _make_get_rows(qtype: str, idx_dtype):
    vocab, cols = 50, _cols(qtype)

    def make(rng):
        ids = rng.integers(0, vocab, size=13).astype(idx_dtype)
        ids[3] = ids[7]                                  # a repeated id
        return {"qtype": qtype, "shape": (vocab, cols), "w": _weight(rng, qtype, vocab, cols), "ids": ids}
    return make


def _ref_get_rows(inp):
    return NumpyOps().embedding(_deq64(inp), inp["ids"])


def _cuda_get_rows(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    w = weight_cuda.prepare_weight(QTensor(inp["qtype"], inp["shape"], inp["w"]), "q8")
    out = poison((len(inp["ids"]), inp["shape"][1]), np.float32)
    return linear_cuda.get_rows(w, cp.asarray(inp["ids"]), out=out)


def _get_rows_rows():
    rows = []
    for i, qtype in enumerate(["F16", "BF16"] + list(QTYPES)):
        idx = np.int64 if i % 2 == 0 else np.int32
        rows.append(KernelRow("get_rows", f"get_rows_{qtype.lower()}_{np.dtype(idx).name}-50x{_cols(qtype)}",
                              _make_get_rows(qtype, idx), _ref_get_rows, _cuda_get_rows, 1e-5))
    return rows


def _make_concat(parts, cols: int, n: int):
    def make(rng):
        other = "Q8_0" if parts[0][0] != "Q8_0" else "F16"          # a part of another format
        return {"parts": [(qtype, (rows, cols), _weight(rng, qtype, rows, cols)) for qtype, rows in parts],
                "other": (other, (5, cols), _weight(rng, other, 5, cols)),
                "x": rng.standard_normal((n, cols), dtype=np.float32)}
    return make


def _ref_concat(inp):
    w = np.concatenate([QTensor(q, sh, d).dequantize().astype(np.float64) for q, sh, d in inp["parts"]])
    qtype, (_, cols), _ = inp["parts"][0]
    return _ref_x({"qtype": qtype, "shape": (0, cols), "act": "auto"}, inp["x"]) @ w.T


def _cuda_concat(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    parts = [QTensor(q, sh, d) for q, sh, d in inp["parts"]]
    ws = [weight_cuda.prepare_weight(t) for t in parts]
    w = weight_cuda.concat_rows(ws)
    assert weight_cuda.concat_rows(ws + [weight_cuda.prepare_weight(QTensor(*inp["other"]))]) is None
    if not w.is_dense:   # parts whose activations differ (int8 / fp32) are not joined either
        assert weight_cuda.concat_rows(ws[:1] + [weight_cuda.prepare_weight(parts[1], "f32" if w.act_q8 else "q8")]) is None
    assert w.shape == (sum(p.rows for p in ws), ws[0].cols) and w.qtype == ws[0].qtype and w.act_q8 == ws[0].act_q8
    out = poison((inp["x"].shape[0], w.rows), np.float32)
    return linear_cuda.linear(cp.asarray(inp["x"]), w, out=out)


def _concat_rows():
    rows = []
    for name, parts, cols, n, tol in (("q4_1-qkv", [("Q4_1", 576), ("Q4_1", 192), ("Q4_1", 192)], 576, 1, 2e-5),
                                      ("q8_0-gate_up", [("Q8_0", 67), ("Q8_0", 67)], 1024, 3, 2e-5),
                                      ("q4_k-qkv", [("Q4_K", 40), ("Q4_K", 9), ("Q4_K", 9)], 4096, 2, 2e-5),
                                      # batch 2: the tensor-core GEMV, x rounded to fp16
                                      ("f16-qkv", [("F16", 50), ("F16", 13), ("F16", 13)], 1024, 2, 1e-3)):
        rows.append(KernelRow("concat_rows", f"{name}-{cols}", _make_concat(parts, cols, n), _ref_concat,
                              _cuda_concat, tol))
    return rows


def _make_silu_linear(qtype: str, n: int, inter: int, act: str):
    def make(rng):
        return {"qtype": qtype, "shape": (ROWS_OUT, inter), "w": _weight(rng, qtype, ROWS_OUT, inter),
                "gu": (rng.standard_normal((n, 2 * inter)) * 3).astype(np.float32), "act": act}
    return make


def _ref_silu_linear(inp):
    i = inp["shape"][1]
    act = NumpyOps().silu_mul(inp["gu"][:, :i], inp["gu"][:, i:])
    return NumpyOps().linear(_ref_x(inp, act), _deq64(inp))


def _cuda_silu_linear(views: bool, block_rows: int = 0):
    """block_rows: the staged silu(gate) * up GEMV as the block kernel of that many rows at any batch
    (0: the default choice)."""
    def run(inp, poison):
        import cupy as cp

        from pocketcupy.backend import linear_cuda

        i = inp["shape"][1]
        w = _cuda_weight(inp)
        gu = cp.asarray(inp["gu"])
        gate, up = gu[:, :i], gu[:, i:]
        if not views:
            gate, up = cp.ascontiguousarray(gate), cp.ascontiguousarray(up)
        out = poison((gu.shape[0], inp["shape"][0]), np.float32)
        old = linear_cuda.F32_SILU_BLOCK_MIN_BATCH, linear_cuda.F32_SILU_BLOCK_ROWS
        if block_rows:
            linear_cuda.F32_SILU_BLOCK_MIN_BATCH, linear_cuda.F32_SILU_BLOCK_ROWS = 1, block_rows
        try:
            got = linear_cuda.silu_mul_linear(gate, up, w, out=out)
        finally:
            linear_cuda.F32_SILU_BLOCK_MIN_BATCH, linear_cuda.F32_SILU_BLOCK_ROWS = old
        assert got is out
        return got
    return run


def _silu_linear_rows():
    # fused: fp32 lanes kernel (<= 64 units, batch <= 8) or the int8 quantizer (batch <= 32; past the
    # GEMVs into the GEMM's fp16 input, as silu_mul_h16 with fp32 activations); the rest fall back to
    # silu_mul + linear (F16 at batch 2: the tensor-core GEMV, x rounded to fp16)
    rows = []
    for qtype, n, inter, views, act, tol in (
            ("Q4_1", 1, 1536, True, "auto", 2e-5), ("Q4_1", 3, 1536, False, "auto", 2e-5),
            ("Q8_0", 8, 576, True, "auto", 2e-5), ("Q4_K", 2, 1024, True, "auto", 2e-5),
            ("Q4_1", 12, 1536, True, "auto", 2e-5), ("Q4_K", 1, 4096, True, "f32", 2e-5),
            ("Q4_K", 1, 4096, True, "auto", 2e-5), ("Q6_K", 19, 4096, True, "auto", 2e-5),
            ("Q4_1", 3, 1536, False, "q8", 2e-5), ("Q8_0", 40, 4096, True, "auto", 3e-3),
            ("F16", 2, 1536, True, "auto", 1e-3), ("BF16", 40, 1024, True, "auto", 1e-2),
            ("F16", 12, 1536, False, "auto", 3e-3), ("Q4_K", 70, 1024, True, "auto", 3e-3),
            ("Q6_K", 70, 512, False, "auto", 3e-3), ("Q4_1", 40, 576, True, "f32", 3e-3)):
        rows.append(KernelRow("silu_mul_linear", f"{qtype.lower()}-n{n}-i{inter}-{act}" + ("-views" if views else ""),
                              _make_silu_linear(qtype, n, inter, act), _ref_silu_linear, _cuda_silu_linear(views),
                              tol))
    for qtype, n, inter, r in (("Q4_1", 1, 1536, 2), ("Q4_1", 3, 1536, 1), ("Q8_0", 8, 576, 4)):
        rows.append(KernelRow("silu_mul_linear", f"{qtype.lower()}-n{n}-i{inter}-block{r}-views",
                              _make_silu_linear(qtype, n, inter, "auto"), _ref_silu_linear, _cuda_silu_linear(True, r),
                              2e-5))
    return rows


def _make_linears(parts, cols: int, n: int, q8rows: str = ""):
    """q8rows: "q8" / "q8k": x comes as Q8Rows with its int8 blocks of 32 / of 256 (as the fused
    norm writes them at batch 1 / past it)."""
    def make(rng):
        return {"parts": [(q, (r, cols), _weight(rng, q, r, cols)) for q, r in parts],
                "bias": rng.standard_normal(parts[0][1], dtype=np.float32),
                "x": rng.standard_normal((n, cols), dtype=np.float32), "q8rows": q8rows}
    return make


def _ref_linears(inp):
    outs = []
    for i, (q, sh, d) in enumerate(inp["parts"]):
        one = {"qtype": q, "shape": sh, "w": d, "act": "auto", "x": inp["x"]}
        if i == 0:
            one["bias"] = inp["bias"]
        outs.append(_ref_linear(one))
    return tuple(outs)


def _cuda_linears(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    ws = [weight_cuda.prepare_weight(QTensor(q, sh, d)) for q, sh, d in inp["parts"]]
    biases = [cp.asarray(inp["bias"])] + [None] * (len(ws) - 1)
    x = cp.asarray(inp["x"])
    if inp["q8rows"] == "q8":             # quantized by the kernel before (as the fused norm does)
        x = weight_cuda.Q8Rows(x, *linear_cuda.quantize_x(x))
    elif inp["q8rows"] == "q8k":
        x = weight_cuda.Q8Rows(x, None, None, kquant_mma_cuda.quantize_x_q8k(x))
    return tuple(linear_cuda.linears(x, ws, biases))


def _cuda_kquant_mma3(groups):
    """The joined tensor-core launch (gemv_kquant_mma3) itself with launch shape `groups`."""
    def run(inp, poison):
        import cupy as cp

        ws = [weight_cuda.prepare_weight(QTensor(q, sh, d)) for q, sh, d in inp["parts"]]
        x = cp.asarray(inp["x"])
        n = x.shape[0]
        outs = [poison((n, w.rows), np.float32) for w in ws]
        nt = 1 << (-(-n // 8) - 1).bit_length()
        kquant_mma_cuda.launch_gemv_kquant_mma3(ws, kquant_mma_cuda.quantize_x_q8k(x), [cp.asarray(inp["bias"])] +
                                            [None] * (len(ws) - 1), outs, n, nt, groups)
        return tuple(outs)
    return run


def _cuda_kquant_tile3(shape):
    """The joined shared-memory tile launch (gemm_kquant_tile3) itself with launch shape `shape`."""
    def run(inp, poison):
        import cupy as cp

        ws = [weight_cuda.prepare_weight(QTensor(q, sh, d)) for q, sh, d in inp["parts"]]
        x = cp.asarray(inp["x"])
        outs = [poison((x.shape[0], w.rows), np.float32) for w in ws]
        kquant_tile_cuda.launch_gemm_kquant_tile3(ws, kquant_mma_cuda.quantize_x_q8k(x), [cp.asarray(inp["bias"])] +
                                                 [None] * (len(ws) - 1), outs, x.shape[0], shape)
        return tuple(outs)
    return run


def _linears_rows():
    # unfused projections of one input: int8-activation weights share one quantization of x; K-quants
    # at batch 1 in one gemv_kquant3 launch, past it in one gemv_kquant_mma3 launch (sm_80+; else
    # gemv_kquant3 at batch 2 too) (rows ending inside a block; x from a fused norm, whose per-32
    # blocks the tensor-core path replaces with its own per 256)
    rows = []
    for name, parts, cols, n, tol in (("q4_k+q4_k+q6_k", [("Q4_K", 40), ("Q4_K", 9), ("Q6_K", 9)], 4096, 3, 2e-5),
                                      ("q4_k+q4_k+q6_k-kq3", [("Q4_K", 40), ("Q4_K", 9), ("Q6_K", 9)], 4096, 1, 2e-5),
                                      ("q4_k+q4_k+q6_k", [("Q4_K", 40), ("Q4_K", 9), ("Q6_K", 9)], 4096, 2, 2e-5),
                                      ("q4_k+q5_k-q8rows", [("Q4_K", 17), ("Q5_K", 33)], 4096, 2, 2e-5),
                                      # F16 at batch 1: the tensor-core GEMV, x rounded to fp16
                                      ("q8_0+f16", [("Q8_0", 33), ("F16", 20)], 4096, 1, (2e-5, 1e-3)),
                                      ("q4_1+q4_1-short", [("Q4_1", 20), ("Q4_1", 20)], 576, 2, 2e-5),
                                      ("q4_k+q6_k-n40", [("Q4_K", 20), ("Q6_K", 20)], 4096, 40, 3e-3),
                                      ("q4_k+q6_k+q8_0-gemm", [("Q4_K", 20), ("Q6_K", 9), ("Q8_0", 33)], 1024, 70,
                                       3e-3),
                                      ("q4_k+q4_k+q6_k-mma3-q8krows", [("Q4_K", 40), ("Q4_K", 9), ("Q6_K", 9)], 4096,
                                       4, 2e-5),
                                      ("q5_k+q6_k-mma3", [("Q5_K", 24), ("Q6_K", 17)], 512, 17, 2e-5)):
        q8rows = "q8k" if "q8krows" in name else "q8" if "q8rows" in name else ""
        rows.append(KernelRow("linears", f"{name}-{cols}-n{n}", _make_linears(parts, cols, n, q8rows),
                              _ref_linears, _cuda_linears, tol))
    # gemv_kquant_mma3 launched with RW groups of 16 rows a block (segments of 40 / 9 / 9 rows: a
    # block past a segment's last row, groups wholly past it), with ACC, on whole tiles (n = 8 nt),
    # with two 16-row tiles a warp (MT 2), and at 1-2 tiles with one super-block in flight (U 1: q, k, v joined)
    for n, groups in ((4, (1, 4, 2, 0, 2)), (29, (4, 8, 1, 0, 4)), (57, (8, 4, 1, 3, 1)), (50, (8, 4, 1, 3, 1, 1)),
                      (64, (8, 4, 1, 3, 1)), (64, (8, 4, 1, 3, 1, 1)), (4, (1, 4, 1, 0, 1, 0, 2)), (5, (1, 4, 1)),
                      (12, (2, 4, 1))):
        tag = (f"-rw{groups[4]}" if len(groups) > 4 else "-u1") + ("-acc" if groups[5:6] == (1,) else "") \
            + ("-mt2" if groups[6:] == (2,) else "")
        rows.append(KernelRow("linears", f"q4_k+q4_k+q6_k-mma3{tag}-4096-n{n}",
                              _make_linears([("Q4_K", 40), ("Q4_K", 9), ("Q6_K", 9)], 4096, n), _ref_linears,
                              _cuda_kquant_mma3(groups), 2e-5))
    # gemm_kquant_tile3 (shapes (MT, RG, KW, ST)): blocks of 32 or 16 rows over segments of 40 / 9 / 9
    for n, shape in ((64, (1, 2, 1, 2)), (45, (2, 1, 2, 2)), (33, (1, 1, 3, 3))):
        rows.append(KernelRow("linears", f"q4_k+q4_k+q6_k-tile3-{'_'.join(map(str, shape))}-4096-n{n}",
                              _make_linears([("Q4_K", 40), ("Q4_K", 9), ("Q6_K", 9)], 4096, n), _ref_linears,
                              _cuda_kquant_tile3(shape), 2e-5))
    # the one-wave Q4_K shape (TILE_ONE_WAVE_SHAPES) over two Q4_K segments of 300 / 200 rows: blocks of
    # 224 rows, both segments ending inside one
    rows.append(KernelRow("linears", "q4_k+q4_k-tile3-2_7_1_2-4096-n64",
                          _make_linears([("Q4_K", 300), ("Q4_K", 200)], 4096, 64), _ref_linears,
                          _cuda_kquant_tile3((2, 7, 1, 2)), 2e-5))
    return rows


def _make_norm_linear(qtype: str, n: int, cols: int, rows: int, bias: bool):
    def make(rng):
        inp = {"qtype": qtype, "shape": (rows, cols), "w": _weight(rng, qtype, rows, cols), "act": "auto",
               "x": rng.standard_normal((n, cols), dtype=np.float32),
               "res": rng.standard_normal((n, cols), dtype=np.float32),
               "w_norm": (1.0 + 0.1 * rng.standard_normal(cols)).astype(np.float32), "eps": 1e-5}
        if bias:
            inp["bias"] = rng.standard_normal(rows, dtype=np.float32)
        return inp
    return make


def _ref_norm_linear(inp):
    h, res = NumpyOps().add_rms_norm(inp["x"], inp["res"], inp["w_norm"], inp["eps"])
    return _ref_linear({**inp, "x": h}), res


def _cuda_norm_linear(inp, poison):
    """The one-launch form (it must apply to these rows), checked bit for bit against the norm and
    the linear launched apart (the GEMV reads the same values, from shared memory)."""
    import cupy as cp

    from pocketcupy.backend import elementwise_cuda, linear_cuda

    w = _cuda_weight(inp)
    x, res, wn = (cp.asarray(inp[k]) for k in ("x", "res", "w_norm"))
    bias = cp.asarray(inp["bias"]) if "bias" in inp else None
    got = linear_cuda.add_rms_norm_linear(x, res, wn, inp["eps"], w, bias)
    assert got is not None, "add_rms_norm_linear: no one-launch form for this row"
    h, res_apart = elementwise_cuda.add_rms_norm(x, res.copy(), wn, inp["eps"])
    cp.testing.assert_array_equal(got[0], linear_cuda.linear(h, w, bias))
    cp.testing.assert_array_equal(got[1], res_apart)
    return got


def _norm_linear_rows():
    # the lanes GEMV normalising its own input (batch 1 only): SmolLM2's rows (576: 18 units, 16
    # lanes; 1536 would be 32 lanes but is no norm's width), rows ending inside a block, a bias
    rows = []
    n = 1
    for qtype, cols, out_rows, bias in (("Q4_1", 576, 960, False), ("Q8_0", 576, 3072, True),
                                        ("Q4_0", 1024, 67, False), ("Q5_1", 256, 131, True),
                                        ("Q6_K", 768, 67, False)):
        rows.append(KernelRow("add_rms_norm_linear", f"{qtype.lower()}-n{n}-{out_rows}x{cols}",
                              _make_norm_linear(qtype, n, cols, out_rows, bias), _ref_norm_linear,
                              _cuda_norm_linear, 2e-5))
    return rows


def _ref_norm_silu_mul(inp):
    (gu, res), inter = _ref_norm_linear(inp), inp["shape"][0] // 2
    return NumpyOps().silu_mul(gu[:, :inter], gu[:, inter:]), res


def _cuda_norm_silu_mul(inp, poison):
    """The gated one-launch form, bit for bit the lanes GEMV normalising its input followed by
    silu_mul (a lane group sums a gate row and its up row with the same arithmetic)."""
    import cupy as cp

    from pocketcupy.backend import elementwise_cuda, linear_cuda

    w = _cuda_weight(inp)
    x, res, wn = (cp.asarray(inp[k]) for k in ("x", "res", "w_norm"))
    got = linear_cuda.add_rms_norm_silu_mul(x, res, wn, inp["eps"], w)
    assert got is not None, "add_rms_norm_silu_mul: no one-launch form for this row"
    gu, res_apart = linear_cuda.add_rms_norm_linear(x, res, wn, inp["eps"], w)
    inter = w.rows // 2
    cp.testing.assert_array_equal(got[0], elementwise_cuda.silu_mul(gu[:, :inter], gu[:, inter:]))
    cp.testing.assert_array_equal(got[1], res_apart)
    return got


def _norm_silu_mul_rows():
    # SmolLM2's joined gate / up (2 x 1536 rows of 576), and 2 x 67 rows: the last block's groups
    # past the end
    return [KernelRow("add_rms_norm_silu_mul", f"{qtype.lower()}-n1-2x{inter}x{cols}",
                      _make_norm_linear(qtype, 1, cols, 2 * inter, False), _ref_norm_silu_mul, _cuda_norm_silu_mul,
                      2e-5)
            for qtype, cols, inter in (("Q4_1", 576, 1536), ("Q8_0", 576, 67), ("Q5_0", 1024, 67))]


def _make_dense_mlp(qtype: str, n: int, dim: int, inter: int):
    def make(rng):
        return {"qtype": qtype, "x": rng.standard_normal((n, dim), dtype=np.float32),
                "gu": _weight(rng, qtype, 2 * inter, dim), "down": _weight(rng, qtype, ROWS_OUT, inter)}
    return make


def _ref_dense_mlp(inp):
    """The roundings dense_mlp makes: x, the gate / up product and SiLU·up to the weights' type."""
    from tests.kernel_rows_core import round16

    qtype, inter = inp["qtype"], inp["down"].shape[1]
    w_gu, w_down = (QTensor(qtype, w.shape, w).dequantize().astype(np.float64) for w in (inp["gu"], inp["down"]))
    gu = round16((round16(inp["x"], qtype) @ w_gu.T).astype(np.float32), qtype)
    act = round16(NumpyOps().silu_mul(gu[:, :inter], gu[:, inter:]), qtype)
    return act.astype(np.float64) @ w_down.T


def _cuda_dense_mlp(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    qtype = inp["qtype"]
    w_gu, w_down = (_cuda_weight({"qtype": qtype, "shape": w.shape, "w": w, "act": "auto"})
                    for w in (inp["gu"], inp["down"]))
    assert linear_cuda.dense_mlp_applies(inp["x"].shape[0], w_gu, w_down)
    return linear_cuda.dense_mlp(cp.asarray(inp["x"]), w_gu, w_down)


def _dense_mlp_rows():
    return [KernelRow("dense_mlp", f"{qtype.lower()}-n{n}-{dim}x{inter}", _make_dense_mlp(qtype, n, dim, inter),
                      _ref_dense_mlp, _cuda_dense_mlp, tol)
            for qtype, n, dim, inter, tol in (("BF16", 40, 1024, 1536, 1e-2), ("F16", 9, 576, 68, 3e-3))]


ROWS = _linear_rows() + _linears_rows() + _get_rows_rows() + _concat_rows() + _silu_linear_rows() + \
    _norm_linear_rows() + _norm_silu_mul_rows() + _dense_mlp_rows()

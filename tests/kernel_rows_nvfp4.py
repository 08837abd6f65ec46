"""Kernel-table rows for NVFP4 weights (E2M1 codes, an E4M3 scale per row and 16 columns, a float32
scale per tensor): linear at batches 1-16 (gemv_nvfp4.cu's tensor-core GEMV, activations rounded to
fp16) and past them (cuBLAS over fp16 tiles of the dequantized weight), silu_mul_linear, the joined
weight of concat_rows (parts of different tensor scales), and get_rows. Reference: float64 NumPy
over the exact code values times their scales. Codes are random bytes; scale codes random normal
ones, or subnormal ones; the scales differ per row and group, so a wrong row or group shows."""
from __future__ import annotations

import numpy as np

from pocketcupy.backend import weight_cuda
from pocketcupy.quant.minifloat_weights import e2m1_values, e4m3_values
from pocketcupy.quant.qtensor import NVFP4_GROUP, QTensor
from tests.kernel_table import KernelRow

ROWS_OUT = 83            # not a multiple of 16 rows a block
COLS = 4160              # 65 chunks of 64 codes


def _make(n: int, rows: int = ROWS_OUT, cols: int = COLS, subnormal: bool = False, bias: bool = False,
          up: bool = False):
    def make(rng):
        groups = cols // NVFP4_GROUP
        scales = rng.integers(0x01, 0x08, (rows, groups)) if subnormal else rng.integers(0x08, 0x7F, (rows, groups))
        scale_2 = float(rng.uniform(0.5, 2.0)) * (64.0 if subnormal else 0.01)
        inp = {"codes": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8), "shape": (rows, cols),
               "scales": scales.astype(np.uint8), "scale_2": scale_2,
               "x": rng.standard_normal((n, cols), dtype=np.float32)}
        if bias:
            inp["bias"] = rng.standard_normal(rows, dtype=np.float32)
        if up:
            inp["up"] = rng.standard_normal((n, cols), dtype=np.float32)
        return inp
    return make


def _w64(inp) -> np.ndarray:
    grid = np.repeat(e4m3_values(inp["scales"]).astype(np.float64), NVFP4_GROUP, axis=1)
    return e2m1_values(inp["codes"]).astype(np.float64) * grid * inp["scale_2"]


def _x64(inp) -> np.ndarray:
    x = inp["x"].astype(np.float64)
    if "up" in inp:
        x = x / (1.0 + np.exp(-x)) * inp["up"].astype(np.float64)
    return x


def _ref_linear(inp):
    y = _x64(inp) @ _w64(inp).T
    return y + inp["bias"] if "bias" in inp else y


def _weight(inp):
    return weight_cuda.prepare_weight(QTensor("NVFP4", inp["shape"], inp["codes"], inp["scales"], inp["scale_2"]))


def _cuda_linear(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    w = _weight(inp)
    assert w.qtype == "NVFP4"
    out = poison((inp["x"].shape[0], inp["shape"][0]), np.float32)
    bias = cp.asarray(inp["bias"]) if "bias" in inp else None
    return linear_cuda.linear(cp.asarray(inp["x"]), w, bias, out=out)


def _cuda_linear_unroll(u: int):
    """linear with gemv_nvfp4_mma's U (64-code chunks in flight a warp) set to u."""
    def run(inp, poison):
        from pocketcupy.backend import linear_cuda

        saved = linear_cuda.NVFP4_UNROLL
        linear_cuda.NVFP4_UNROLL = u
        try:
            return _cuda_linear(inp, poison)
        finally:
            linear_cuda.NVFP4_UNROLL = saved
    return run


def _cuda_silu_mul_linear(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    out = poison((inp["x"].shape[0], inp["shape"][0]), np.float32)
    return linear_cuda.silu_mul_linear(cp.asarray(inp["x"]), cp.asarray(inp["up"]), _weight(inp), out=out)


_PART_ROWS, _PART_SCALE_2 = (29, 38, 16), (1.0, 3.0, 0.25)


def _split(inp) -> list[dict]:
    """The weight as three parts of 29, 38 and 16 rows, each its own tensor scale (times the weight's)."""
    parts, r0 = [], 0
    for r, s2 in zip(_PART_ROWS, _PART_SCALE_2):
        parts.append({**inp, "codes": inp["codes"][r0:r0 + r], "scales": inp["scales"][r0:r0 + r],
                      "scale_2": inp["scale_2"] * s2, "shape": (r, inp["shape"][1])})
        r0 += r
    return parts


def _ref_concat(inp):
    return np.concatenate([_ref_linear(p) for p in _split(inp)], axis=1)


def _cuda_concat_rows(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    w = weight_cuda.concat_rows([_weight(p) for p in _split(inp)])
    assert w.qtype == "NVFP4" and w.shape == inp["shape"]
    out = poison((inp["x"].shape[0], inp["shape"][0]), np.float32)
    return linear_cuda.linear(cp.asarray(inp["x"]), w, None, out=out)


def _make_ids(rng):
    inp = _make(1, rows=50)(rng)
    inp["ids"] = rng.integers(0, 50, 37).astype(np.int64)
    return inp


def _ref_get_rows(inp):
    return _w64(inp)[inp["ids"]]


def _cuda_get_rows(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda

    out = poison((inp["ids"].size, inp["shape"][1]), np.float32)
    return linear_cuda.get_rows(_weight(inp), cp.asarray(inp["ids"]), out=out)


# fp16 activations (relative rounding 2^-11) into fp32 sums: ~3e-4; past batch 16 the weights are
# rounded to fp16 as well
_GEMV_TOL, _GEMM_TOL = 1e-3, 2e-3

ROWS = [KernelRow("linear", f"gemv_nvfp4_mma_bs{n}-{ROWS_OUT}x{COLS}", _make(n, bias=n == 3), _ref_linear,
                  _cuda_linear, _GEMV_TOL) for n in (1, 3, 8, 9, 16)]
ROWS += [KernelRow("linear", f"gemv_nvfp4_mma_u{u}_bs{n}-{ROWS_OUT}x{COLS}", _make(n), _ref_linear,
                   _cuda_linear_unroll(u), _GEMV_TOL) for u in (4, 8) for n in (2, 11)]
ROWS += [KernelRow("linear", f"gemv_nvfp4_mma_subnormal_scales_bs{n}-{ROWS_OUT}x{COLS}", _make(n, subnormal=True),
                   _ref_linear, _cuda_linear, _GEMV_TOL) for n in (1, 12)]
ROWS += [KernelRow("linear", f"gemm_nvfp4_n{n}-{ROWS_OUT}x{COLS}", _make(n, subnormal=n == 40, bias=n == 17),
                   _ref_linear, _cuda_linear, _GEMM_TOL) for n in (17, 40)]
ROWS += [KernelRow("silu_mul_linear", f"nvfp4_bs{n}-{ROWS_OUT}x{COLS}", _make(n, up=True), _ref_linear,
                   _cuda_silu_mul_linear, _GEMV_TOL if n <= 16 else _GEMM_TOL) for n in (2, 33)]
ROWS += [KernelRow("concat_rows", f"nvfp4_bs{n}-{ROWS_OUT}x{COLS}", _make(n), _ref_concat, _cuda_concat_rows,
                   _GEMV_TOL if n <= 16 else _GEMM_TOL) for n in (4, 20)]
ROWS.append(KernelRow("get_rows", f"get_rows_nvfp4-50x{COLS}", _make_ids, _ref_get_rows, _cuda_get_rows, 1e-6))

"""Kernel-table rows for FP8 weights (E4M3 codes with a float32 scale per row and 128 columns):
linear at batches 1-16 (gemv_fp8.cu's tensor-core GEMV, activations rounded to fp16) and past them
(gemm_codes_tile.cu; cuBLAS over fp16 tiles of the dequantized weight), silu_mul_linear, the joined weight of
concat_rows, and get_rows. Reference: float64 NumPy over the exact code values times their scales.
Codes are random bytes (NaN codes excluded), or small ones only (subnormals and the first binade);
scales differ per row and group, so a wrong row or group shows."""
from __future__ import annotations

import numpy as np

from pocketcupy.backend import weight_cuda
from pocketcupy.quant.minifloat_weights import e4m3_values
from pocketcupy.quant.qtensor import FP8_GROUP, QTensor
from tests.codes_rows import GEMM_TOL, GEMV_TOL, CodesFormat, gemm_rows, with_settings
from tests.kernel_table import KernelRow

ROWS_OUT = 83            # not a multiple of 16 rows a block
COLS = 4160              # 65 chunks of 64, 32.5 groups of 128: the last group half full


def _codes(rng, rows: int, cols: int, small: bool) -> np.ndarray:
    c = rng.integers(0, 0x7F, (rows, cols), dtype=np.uint8)         # 0x00..0x7E (0x7F is NaN)
    if small:
        c &= 0x0F                                                    # exponent field 0 or 1
    return c | (rng.integers(0, 2, (rows, cols), dtype=np.uint8) << 7)


def _make(n: int, rows: int = ROWS_OUT, cols: int = COLS, small: bool = False, bias: bool = False,
          up: bool = False):
    def make(rng):
        groups = -(-cols // FP8_GROUP)
        inp = {"codes": _codes(rng, rows, cols, small), "shape": (rows, cols),
               "scales": rng.uniform(0.5, 2.0, (rows, groups)).astype(np.float32) * (8.0 if small else 0.01),
               "x": rng.standard_normal((n, cols), dtype=np.float32)}
        if bias:
            inp["bias"] = rng.standard_normal(rows, dtype=np.float32)
        if up:
            inp["up"] = rng.standard_normal((n, cols), dtype=np.float32)
        return inp
    return make


def _w64(inp) -> np.ndarray:
    rows, cols = inp["shape"]
    grid = np.repeat(inp["scales"].astype(np.float64), FP8_GROUP, axis=1)[:, :cols]
    return e4m3_values(inp["codes"]).astype(np.float64) * grid


def _split(inp) -> list[dict]:
    """The weight as three parts of 29, 38 and 16 rows."""
    parts, r0 = [], 0
    for r in (29, 38, 16):
        parts.append({**inp, "codes": inp["codes"][r0:r0 + r], "scales": inp["scales"][r0:r0 + r],
                      "shape": (r, inp["shape"][1])})
        r0 += r
    return parts


def _weight(inp):
    return weight_cuda.prepare_weight(QTensor("FP8", inp["shape"], inp["codes"], inp["scales"]))


FP8 = CodesFormat("FP8", _weight, _w64, _split)


def _cuda_linear_variant(u: int, hw: bool = False):
    """linear with gemv_fp8_mma's U (64-code chunks in flight a warp) set to u and its HW (the
    hardware's conversion on sm_89+) to hw."""
    return with_settings(FP8.cuda_linear, FP8_UNROLL=u, FP8_HW_CVT=hw)


def _make_ids(rng):
    inp = _make(1, rows=50)(rng)
    inp["ids"] = rng.integers(0, 50, 37).astype(np.int32)
    return inp


ROWS = [KernelRow("linear", f"gemv_fp8_mma_bs{n}-{ROWS_OUT}x{COLS}", _make(n, bias=n == 3), FP8.ref_linear,
                  FP8.cuda_linear, GEMV_TOL) for n in (1, 3, 8, 9, 16)]
ROWS += [KernelRow("linear", f"gemv_fp8_mma_u{u}_bs{n}-{ROWS_OUT}x{COLS}", _make(n), FP8.ref_linear,
                   _cuda_linear_variant(u), GEMV_TOL) for u in (2, 4) for n in (2, 11)]
ROWS += [KernelRow("linear", f"gemv_fp8_mma_hw_cvt{'_small_codes' * small}_bs{n}-{ROWS_OUT}x{COLS}",
                   _make(n, small=small), FP8.ref_linear, _cuda_linear_variant(4, hw=True), GEMV_TOL)
         for n, small in ((1, False), (11, False), (3, True))]
ROWS += [KernelRow("linear", f"gemv_fp8_mma_small_codes_bs{n}-{ROWS_OUT}x{COLS}", _make(n, small=True),
                   FP8.ref_linear, FP8.cuda_linear, GEMV_TOL) for n in (1, 12)]
ROWS += gemm_rows(FP8, _make, ROWS_OUT, COLS)
ROWS += [KernelRow("linear", f"gemm_codes_tile_fp8_{cvt}_small_codes_n{n}-{ROWS_OUT}x{COLS}", _make(n, small=True),
                   FP8.ref_linear, _cuda_linear_variant(4, hw=cvt == "hw_cvt"), GEMM_TOL)
         for cvt in ("hw_cvt", "sw_cvt") for n in (24, 48)]
ROWS += [KernelRow("silu_mul_linear", f"fp8_bs{n}-{ROWS_OUT}x{COLS}", _make(n, up=True), FP8.ref_linear,
                   FP8.cuda_silu_mul_linear, GEMV_TOL if n <= 16 else GEMM_TOL) for n in (2, 33)]
ROWS += [KernelRow("concat_rows", f"fp8_bs{n}-{ROWS_OUT}x{COLS}", _make(n), FP8.ref_linear, FP8.cuda_concat_rows,
                   GEMV_TOL if n <= 16 else GEMM_TOL) for n in (4, 20)]
ROWS.append(KernelRow("get_rows", f"get_rows_fp8-50x{COLS}", _make_ids, FP8.ref_get_rows, FP8.cuda_get_rows, 1e-6))

"""Kernel-table rows for NVFP4 weights (E2M1 codes, an E4M3 scale per row and 16 columns, a float32
scale per tensor): linear at batches 1-16 (gemv_nvfp4.cu's tensor-core GEMV, activations rounded to
fp16) and past them (gemm_codes_tile.cu; cuBLAS over fp16 tiles of the dequantized weight), silu_mul_linear, the joined
weight of concat_rows (parts of different tensor scales), and get_rows. Reference: float64 NumPy
over the exact code values times their scales. Codes are random bytes; scale codes random normal
ones, or subnormal ones; the scales differ per row and group, so a wrong row or group shows."""
from __future__ import annotations

import numpy as np

from pocketcupy.backend import weight_cuda
from pocketcupy.quant.minifloat_weights import e2m1_values, e4m3_values
from pocketcupy.quant.qtensor import NVFP4_GROUP, QTensor
from tests.codes_rows import GEMM_TOL, GEMV_TOL, CodesFormat, gemm_rows, with_settings
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


def _weight(inp):
    return weight_cuda.prepare_weight(QTensor("NVFP4", inp["shape"], inp["codes"], inp["scales"], inp["scale_2"]))


_PART_ROWS, _PART_SCALE_2 = (29, 38, 16), (1.0, 3.0, 0.25)


def _split(inp) -> list[dict]:
    """The weight as three parts of 29, 38 and 16 rows, each its own tensor scale (times the weight's)."""
    parts, r0 = [], 0
    for r, s2 in zip(_PART_ROWS, _PART_SCALE_2):
        parts.append({**inp, "codes": inp["codes"][r0:r0 + r], "scales": inp["scales"][r0:r0 + r],
                      "scale_2": inp["scale_2"] * s2, "shape": (r, inp["shape"][1])})
        r0 += r
    return parts


NVFP4 = CodesFormat("NVFP4", _weight, _w64, _split)


def _cuda_linear_unroll(u: int):
    """linear with gemv_nvfp4_mma's U (64-code chunks in flight a warp) set to u."""
    return with_settings(NVFP4.cuda_linear, NVFP4_UNROLL=u)


def _make_ids(rng):
    inp = _make(1, rows=50)(rng)
    inp["ids"] = rng.integers(0, 50, 37).astype(np.int64)
    return inp


ROWS = [KernelRow("linear", f"gemv_nvfp4_mma_bs{n}-{ROWS_OUT}x{COLS}", _make(n, bias=n == 3), NVFP4.ref_linear,
                  NVFP4.cuda_linear, GEMV_TOL) for n in (1, 3, 8, 9, 16)]
ROWS += [KernelRow("linear", f"gemv_nvfp4_mma_u{u}_bs{n}-{ROWS_OUT}x{COLS}", _make(n), NVFP4.ref_linear,
                   _cuda_linear_unroll(u), GEMV_TOL) for u in (4, 8) for n in (2, 11)]
ROWS += [KernelRow("linear", f"gemv_nvfp4_mma_subnormal_scales_bs{n}-{ROWS_OUT}x{COLS}", _make(n, subnormal=True),
                   NVFP4.ref_linear, NVFP4.cuda_linear, GEMV_TOL) for n in (1, 12)]
ROWS += gemm_rows(NVFP4, _make, ROWS_OUT, COLS)
ROWS += [KernelRow("linear", f"gemm_codes_tile_nvfp4_subnormal_scales_n40-{ROWS_OUT}x{COLS}", _make(40, subnormal=True),
                   NVFP4.ref_linear, NVFP4.cuda_linear, GEMM_TOL)]
ROWS += [KernelRow("silu_mul_linear", f"nvfp4_bs{n}-{ROWS_OUT}x{COLS}", _make(n, up=True), NVFP4.ref_linear,
                   NVFP4.cuda_silu_mul_linear, GEMV_TOL if n <= 16 else GEMM_TOL) for n in (2, 33)]
ROWS += [KernelRow("concat_rows", f"nvfp4_bs{n}-{ROWS_OUT}x{COLS}", _make(n), NVFP4.ref_concat, NVFP4.cuda_concat_rows,
                   GEMV_TOL if n <= 16 else GEMM_TOL) for n in (4, 20)]
ROWS.append(KernelRow("get_rows", f"get_rows_nvfp4-50x{COLS}", _make_ids, NVFP4.ref_get_rows, NVFP4.cuda_get_rows,
                      1e-6))

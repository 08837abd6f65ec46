"""The batch-1 int8 GEMV with the residual-add RMSNorm of its output as epilogue (gemv_norm.cuh:
gemv_kquant_norm for K-quants, gemv_gguf_norm for Q8_0), for the linears whose output goes straight
into a norm (the o and down projections of a Llama layer): the norm then costs no launch of its
own. Its output is only the int8 blocks the next linears read (Q8Rows with x None) and the partial
sums of squares they take the norm's scale from (xnorm_scale in gemv_reduce.cuh)."""
from __future__ import annotations

import numpy as np

from .kernels import cuda_op, kernel, opt_arg
from .kquant_mma_cuda import gguf_mma_tiles
from .linear_cuda import KQUANT_QTYPES, _vec4, quantize_x, reads_q8_blocks
from .weight_cuda import CudaWeight, Q8Rows

# (R rows, SB threads) of each of the block's 32 / R row groups, by weight type: the batch-1
# launches of gemv_kquant_split (Q4_K: 4 rows on 128 threads) and gemv_kquant (Q6_K: 2 rows a
# warp); Q8_0: one row a warp, and on rows of at most NORM_SHORT_ROW_UNITS 32-value units 4 rows on
# 128 threads (NORM_GEMV_SHORT_ROW_LAUNCH). H200, 8B Q8_0 decode graph (2026-12-04): 2,572-2,578 us;
# both projections one row a warp 2,583-2,589, 2 rows on 64 threads 2,623-2,626 (2,660-2,663 with the
# norms apart); the down projection on 2 x 64 2,615-2,617; 4 on 64 2,823, 8 on 128 2,886, 2 on 32 2,854
NORM_GEMV_LAUNCH = {"Q4_K": (4, 128), "Q5_K": (2, 64), "Q6_K": (2, 32), "Q8_0": (1, 32)}
NORM_GEMV_SHORT_ROW_LAUNCH = {"Q8_0": (4, 128)}
NORM_SHORT_ROW_UNITS = 128


def norm_gemv_launch(w) -> tuple[int, int]:
    """(R, SB) of w's norm GEMV (see NORM_GEMV_LAUNCH)."""
    short = NORM_GEMV_SHORT_ROW_LAUNCH if w.cols // 32 <= NORM_SHORT_ROW_UNITS else {}
    return short.get(w.qtype, NORM_GEMV_LAUNCH[w.qtype])


def norm_epilogue_applies(w, n: int, feeds) -> bool:
    """Whether linear_add_rms_norm runs w at batch n for a norm read by `feeds`: one row, a K-quant
    weight of whole super-blocks or a Q8_0 weight, with rows in blocks of 32, and feeds that all
    read int8 blocks of 32 of w's output (the DP4A GEMVs, which take the norm's scale from the
    partial sums)."""
    return (n == 1 and isinstance(w, CudaWeight) and w.qtype in NORM_GEMV_LAUNCH and w.act_q8
            and w.cols % (256 if w.qtype in KQUANT_QTYPES else 32) == 0 and w.rows % 32 == 0
            and not gguf_mma_tiles(w, n)
            and bool(feeds) and all(reads_q8_blocks(f, n) and f.cols == w.rows for f in feeds))


@cuda_op("linear_add_rms_norm")
def linear_add_rms_norm(x, w, residual, w_norm, eps: float, feeds, up=None, bias=None):
    """add_rms_norm(linear(x, w, bias), residual, w_norm, eps) (with up: of silu(x) * up) in one
    launch where norm_epilogue_applies: (Q8Rows of the normalised rows as int8 blocks only, the
    residual updated in place); None elsewhere. x: float32 [1, K] or Q8Rows with its int8 blocks."""
    import cupy as cp

    n = x.shape[0]
    if not norm_epilogue_applies(w, n, feeds) or residual.shape != (1, w.rows) or residual.dtype != cp.float32 \
            or not residual.flags.c_contiguous:
        return None
    if isinstance(x, Q8Rows) and x.xq is not None and up is None:
        if x.xpart is not None:       # blocks of another norm epilogue: the GEMV would need their scale
            return None
        xq, xds = x.xq, x.xds
    else:
        x = x.x if isinstance(x, Q8Rows) else x
        if x is None or x.shape != (1, w.cols) or x.dtype != cp.float32 or not _vec4(x) \
                or (up is not None and (up.shape != x.shape or up.dtype != cp.float32 or not _vec4(up))):
            return None
        xq, xds = quantize_x(x, up)
    r, sb = norm_gemv_launch(w)
    yq = cp.empty((1, w.rows), dtype=cp.int8)
    yds = cp.empty((1, w.rows // 32, 4), dtype=cp.float32)
    ypart = cp.empty(w.rows // 32, dtype=cp.float32)
    w_norm = cp.ascontiguousarray(w_norm, dtype=cp.float32)
    bias = None if bias is None else cp.ascontiguousarray(bias, dtype=cp.float32)
    kquant = w.qtype in KQUANT_QTYPES
    source = "gemv_kquant.cu" if kquant else "gemv_gguf.cu"
    expr = f"{'gemv_kquant_norm' if kquant else 'gemv_gguf_norm'}<{w.type_id}, {r}, {sb}>"
    kernel(source, expr, name_expressions=(expr,))((w.rows // 32,), (32 // r * sb,), (
        w.data, np.int64(w.data.shape[1]), np.int32(w.cols), xq, xds, opt_arg(bias), residual, w_norm,
        np.float32(eps), yq, yds, ypart))
    return Q8Rows(None, yq, yds, xpart=ypart), residual

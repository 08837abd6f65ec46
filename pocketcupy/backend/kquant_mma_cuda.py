"""The Q4_K / Q5_K / Q6_K linears of decode batches 2-64 on int8 tensor cores (gemv_kquant_mma.cu):
where they apply, their launch shapes (measured choices), the per-256 activation quantizer they
read, and their launchers for one weight or 2-3 joined weights of one input (which hand tall weights
at batches 33-64 to kquant_tile_cuda's shared-memory tile kernel)."""
from __future__ import annotations

import numpy as np

from .kernels import grid_blocks, has_tensor_cores, kernel, null_arg, num_sms
from .kquant_tile_cuda import kquant_tile_shape, launch_gemm_kquant_tile, launch_gemm_kquant_tile3
from .weight_cuda import KERNEL_TYPE_IDS, RELAID_QTYPES, CudaWeight, joined_segments

GGUF_MMA_QTYPES = ("Q4_K", "Q5_K", "Q6_K")          # gemv_kquant_mma.cu
# 8 tiles; past it dequantization + cuBLAS (H200, Q4_K 28672x4096 at batch 64: 170 us against 234;
# a Q4_K_M decode step at batch 64 12.9 ms against 16.7)
GGUF_MMA_MAX_BATCH = 64
# the batches the DP4A K-quant GEMV (gemv_kquant.cu) is instantiated for (batch 2: where this kernel
# does not apply)
KQUANT_MAX_BATCH = {"Q4_K": 2, "Q5_K": 2, "Q6_K": 2}
# this kernel from batch 2: alone the DP4A GEMV is faster there (H200, Q4_K 28672x4096 2.25 against
# 1.92 TB/s; padded Q6_K 4096x14336 2.03 against 1.79), but inside the decode graph not (Q4_K_M 8B,
# ctx 512: 2,519 us against 2,765); at batch 1 it is slower in the graph too (2,480 against 2,175)
KQUANT_MMA_MIN_BATCH = 2
# (rows, cols, tiles) -> the launch shape kquant_mma_groups gives such a weight (joined weights:
# their rows summed), for sweeps of launch shapes inside the decode graph (profile_variants.py:
# 'kquant_mma_cuda.GROUPS_OVERRIDE={(4096, 4096, 1): (1, 8, 1, 0, 1)}'); empty in use
GROUPS_OVERRIDE: dict = {}


def kquant_mma_applies(qtype: str, cols: int, nb: int, act_q8: bool) -> bool:
    """Whether a linear of this weight at batch nb runs on the int8 tensor-core K-quant kernel
    (KQUANT_MMA_MIN_BATCH to GGUF_MMA_MAX_BATCH, sm_80+, rows of whole 256-value blocks), whose
    activations are rounded per 256 values (act_q8.q8k_roundtrip) instead of per 32."""
    return (act_q8 and qtype in GGUF_MMA_QTYPES and KQUANT_MMA_MIN_BATCH <= nb <= GGUF_MMA_MAX_BATCH
            and cols % 256 == 0 and has_tensor_cores())


def gguf_mma_tiles(w: CudaWeight, nb: int) -> int:
    """Tiles of 8 batch columns (a power of two) of the int8 tensor-core K-quant kernel at batch nb;
    0 where it does not apply (kquant_mma_applies)."""
    if not kquant_mma_applies(w.qtype, w.cols, nb, w.act_q8):
        return 0
    nt = 1
    while 8 * nt < nb:
        nt *= 2
    return nt


def kquant_mma_groups(nt: int, cols: int, rows: int = 0, qtype: str = "") -> tuple[int, ...]:
    """(tiles per pass over the super-blocks, warps per block, super-blocks in flight per warp,
    blocks per SM the registers must allow or 0 for the kernel's default, row groups per block[,
    ACC[, MT]]) of gemv_kquant_mma for nt tiles of a `qtype` weight of `rows` x `cols` (rows 0:
    unknown, qtype "": any): one pass; 4 warps with 2 super-blocks in flight each, except 8 warps one
    at a time for the long rows of a down projection at 1-2 tiles.
    H200, chunk-major activations, 4 warps x 2 against 8 warps x 1: Q4_K 28672x4096 batch 4 25.8 us
    against 28.2, batch 16 37.5 against 40.4; Q4_K 6144x4096 batch 16 10.6 against 13.4; Q6_K
    49152x4096 batch 4 62.9 against 75.0, batch 32 131 against 178; Q6_K 4096x14336 batch 32 37.1
    against 43.4, but batch 4 24.8 against 23.0 (hence the exception).
    From 4 tiles the kernel's registers allow 2 blocks an SM; a weight whose 16-row blocks need a
    second wave at 2 but fit one at 3 (q, k, v joined: 6144 rows, 384 blocks on 132 SMs) takes 3:
    Q4_K 6144x4096 batch 32 / 64 14.95 / 27.9 us against 17.9 / 31.2. Elsewhere 3 was slower
    (Q4_K 28672x4096 batch 32 58.0 against 54.0; Q6_K 4096x14336, 256 blocks, 42.6 against 36.9).
    One super-block at a time at 8 tiles and wherever MINB 3 caps the registers: two spill there
    (sm_90: 148 bytes a thread for Q4_K, 600 for padded Q6_K at 8 tiles). Batch 64, two against
    one: Q4_K 28672x4096 105.4 against 94.3 us, 6144x4096 at MINB 3 27.9 against 22.7, 4096x4096
    16.9 against 16.2; batch 32, 6144x4096 at MINB 3 15.0 against 14.3.
    Several 16-row groups a block (RW) share the activations through L1 (batch 64: 256 KB a
    super-block row, 7x the weights' bytes) where the blocks still fill the SMs: 4 groups of a warp
    each on tall weights (Q6_K 49152x4096 batch 64 171 against 214 us with RW 1; Q4_K 28672x4096
    93.2 against 94.3), 2 groups of 4 warps on a down projection (Q6_K 4096x14336 56.8 against
    60.4 for one group at U 1); at 4 tiles on vocabulary-sized weights only (Q6_K 49152x4096 batch 32 111
    against 123; Q4_K 28672x4096 58.8 against 54.7).
    ACC (Q4_K / Q5_K scales and mins inside the mma accumulators) from 2 tiles on tall weights, one
    super-block at a time: Q4_K 28672x4096 batch 16 / 32 / 64 33.7 / 48.6 / 88.0 us against 37.4 /
    54.3 / 92.4; on 6144 or 4096 rows it gained or lost under 7% by batch (4096x4096 batch 16 8.8
    against 8.4, batch 64 15.0 against 15.7), so those keep the launches above.
    Two 16-row tiles a warp (MT 2: each B fragment and activation scale serves two mma) at 1-2 tiles
    on weights with 4 blocks an SM of 32-row groups, one super-block at a time: Q4_K 28672x4096
    batch 4 / 8 23.2 / 24.3 us against 26.2 / 28.8, Q6_K 49152x4096 batch 4 / 8 / 16 60.6 / 61.9 /
    76.3 against 62.7 / 64.9 / 80.1; shorter weights lose their grid (4096x4096 batch 4 7.0-7.7
    against 6.7, Q6_K 4096x14336 25.1-31.7 against 23.1).
    At 1-2 tiles a weight of more than 2 blocks an SM (q, k, v joined: 6144 rows, 384 blocks) keeps
    one super-block in flight: the Llama-3-8B-shape Q4_K_M decode graph at batch 4 / 8 / 16 took
    2,552 / 2,764 / 3,453 us against 2,608 / 2,810 / 3,530 (the attention after it gained most at
    batch 4: 11.3 us against 11.9); o (4096 rows, 256 blocks) at U 1 as well lost (3,480 at batch 16)."""
    if (rows, cols, nt) in GROUPS_OVERRIDE:
        return GROUPS_OVERRIDE[rows, cols, nt]
    if qtype in ("Q4_K", "Q5_K") and nt >= 2 and rows >= max(16384, 4 * cols):
        return (nt, 4, 1, 0, 1, 1)
    sms = num_sms() if rows else 0
    if rows and nt <= 2 and cols <= 4096 and -(-rows // 32) >= 4 * sms:
        return (nt, 4, 1, 0, 1, 0, 2)
    if rows and nt >= 4 and rows >= 64 * (2 if nt >= 8 else 4) * sms:
        return (nt, 4, 1, 0, 4)
    if rows and cols > 4096 and nt >= 8 and -(-rows // 32) >= 0.9 * sms:   # one 1-block-an-SM wave, ~full
        return (nt, 8, 1, 0, 2)
    if cols > 4096 and nt <= 2:
        return (nt, 8, 1, 0, 1)
    blocks = -(-rows // 16)
    minb = 3 if nt >= 4 and rows and 2 * sms < blocks <= 3 * sms else 0
    crowded = nt <= 2 and blocks > 2 * sms
    return (nt, 4, 1 if nt >= 8 or minb or crowded else 2, minb, 1)


def kquant_mma_shape(groups: tuple[int, ...]) -> tuple[int, int, int, int, int, int, int]:
    """groups: (tiles per pass, warps per block[, super-blocks in flight per warp[, blocks per SM
    the registers must allow, 0: the kernel's default[, row groups per block[, 1: Q4_K / Q5_K
    scales and mins in the tensor cores' accumulators (ACC)[, 16-row tiles a warp holds at once
    (MT; a row group is 16 MT rows)]]]]]), completed."""
    return tuple(groups) + (1, 0, 1, 0, 1)[len(groups) - 2:]


def _kquant_mma_full(n: int, nt: int, groups: tuple[int, ...]) -> bool:
    """Whether a launch of n columns takes the FULL instance (whole tiles: no bounds test per B load,
    a compile-time chunk stride): at 8 tiles and with ACC, where it was measured faster. H200, main's
    launches at batch 64, FULL against not: Q4_K 28672x4096 91.0 / 92.4 us, Q6_K 4096x14336 50.5 /
    56.2, 49152x4096 162 / 171; at batch 16 it was slower (Q4_K 28672x4096 40.4 / 37.4, Q6_K
    4096x14336 29.0 / 26.2), at 32 even."""
    return n == 8 * nt and (nt >= 8 or groups[5] == 1)


def _kquant_mma_targs(nt: int, groups: tuple[int, ...], full: bool = False) -> str:
    """The template arguments past the weight type(s): NT, TG, WARPS, U, MINB[, RW[, ACC[, FULL[,
    MT]]]] (groups as kquant_mma_shape completes them; full: _kquant_mma_full)."""
    tg, warps, u, minb, rw, acc, mt = groups
    tail = [rw, acc, int(full), mt]
    while tail and tail[-1] == (1, 0, 0, 1)[len(tail) - 1]:   # the kernel's defaults
        tail.pop()
    return ", ".join(str(v) for v in [nt, min(tg, nt), warps, u, minb] + tail)


def _kquant_mma_expr(kernel_qtype: str, nt: int, groups: tuple[int, ...], full: bool = False) -> str:
    return f"gemv_kquant_mma<{KERNEL_TYPE_IDS[kernel_qtype]}, {_kquant_mma_targs(nt, groups, full)}>"


_Q8K_EXPRS = ("quantize_q8k_x<false>", "quantize_q8k_x<true>")
_KQUANT_MMA_EXPRS = tuple(dict.fromkeys(   # kquant_mma_groups' launches, compiled as one module
    _kquant_mma_expr(kq, nt, kquant_mma_shape(groups))
    for q in GGUF_MMA_QTYPES for kq in (q,) + ((RELAID_QTYPES[q][0],) if q in RELAID_QTYPES else ())
    for nt in (1, 2, 4, 8) for cols in (4096, 4352)
    for groups in [kquant_mma_groups(nt, cols)] + ([(nt, 4, 1, 3), (nt, 4, 1, 0, 4)] if nt >= 4 else [])
    + ([(nt, 8, 1, 0, 2)] if nt >= 8 and cols > 4096 else [])))


def quantize_x_q8k(x, up=None):
    """Activations [N, K] float32 (K a multiple of 256, row stride allowed) -> int8 [K/32, N, 32]
    (chunk-major, see gemv_kquant_mma.cu), float32 scales [N, K/256], int16 sums [N, K/32]: int8 per
    256 values (llama.cpp's Q8_K), the input of gemv_kquant_mma; with up, the activations are
    silu(x) * up."""
    import cupy as cp

    n, k = x.shape
    xq = cp.empty((k // 32, n, 32), dtype=cp.int8)
    xd = cp.empty((n, k // 256), dtype=cp.float32)
    xb = cp.empty((n, k // 32), dtype=cp.int16)
    src = x if up is None else up
    nsb = n * k // 256
    kernel("gemv_kquant_mma.cu", _Q8K_EXPRS[up is not None], name_expressions=_Q8K_EXPRS)(
        (grid_blocks(nsb * 32, 256, 1 << 30),), (256,),
        (x, np.int64(x.strides[0] // 4), src, np.int64(src.strides[0] // 4), np.int32(k), np.int64(nsb), xq, xd, xb))
    return xq, xd, xb


def launch_gemv_kquant_mma(w: CudaWeight, xk, bias, out, n: int, nt: int, groups: tuple | None = None) -> None:
    """out [n, rows] = activations (quantize_x_q8k's xk) @ w.T (+ bias) on int8 tensor cores,
    nt tiles of 8 batch columns (gemv_kquant_mma.cu); groups: the launch shape (kquant_mma_shape),
    default kquant_mma_groups, or gemm_kquant_tile where kquant_tile_shape picks it."""
    if groups is None and (shape := kquant_tile_shape([w], n)):
        launch_gemm_kquant_tile(w, xk, bias, out, n, shape)
        return
    groups = kquant_mma_shape(groups or kquant_mma_groups(nt, w.cols, w.rows, w.qtype))
    expr = _kquant_mma_expr(w.kernel_qtype, nt, groups, _kquant_mma_full(n, nt, groups))
    fn = kernel("gemv_kquant_mma.cu", expr, name_expressions=_KQUANT_MMA_EXPRS if expr in _KQUANT_MMA_EXPRS else (expr,))
    fn((-(-w.rows // (16 * groups[4] * groups[6])),), (32 * groups[1],),
        (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), np.int32(w.cols), *xk, np.int32(n),
         null_arg() if bias is None else bias, out))


def kquant_mma_joinable(ws, n: int) -> int:
    """Tiles of the gemv_kquant_mma3 launch that computes these 2-3 weights of one input at batch n
    (all on the K-quant tensor-core kernel with the same tiles and columns), else 0."""
    if not 2 <= len(ws) <= 3 or not all(isinstance(w, CudaWeight) and w.cols == ws[0].cols for w in ws):
        return 0
    nts = {gguf_mma_tiles(w, n) for w in ws}
    return nts.pop() if len(nts) == 1 else 0


def launch_gemv_kquant_mma3(ws, xk, biases, outs, n: int, nt: int, groups: tuple | None = None) -> None:
    """linear_cuda.launch_gemv_kquant3's join on int8 tensor cores: 2-3 weights (kquant_mma_joinable) over
    the same activations (quantize_x_q8k's xk), one gemv_kquant_mma3 launch; groups as
    launch_gemv_kquant_mma takes them."""
    if groups is None and (shape := kquant_tile_shape(ws, n)):
        launch_gemm_kquant_tile3(ws, xk, biases, outs, n, shape)
        return
    groups = kquant_mma_shape(groups or kquant_mma_groups(nt, ws[0].cols, sum(w.rows for w in ws)))
    ends, tids, seg_args = joined_segments(ws, biases, outs, 16 * groups[4] * groups[6])
    expr = f"gemv_kquant_mma3<{tids}, {_kquant_mma_targs(nt, groups, _kquant_mma_full(n, nt, groups))}>"
    kernel("gemv_kquant_mma.cu", expr, name_expressions=(expr,))((ends[-1],), (32 * groups[1],), (
        np.int32(ws[0].cols), *xk, np.int32(n), np.int32(ends[0]), np.int32(ends[1]), *seg_args))

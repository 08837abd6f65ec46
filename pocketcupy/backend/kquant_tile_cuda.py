"""The Q4_K / Q5_K / Q6_K linears of decode batches 33-64 on tall weights (gemm_kquant_tile.cu: a
block's activations staged once in shared memory for all its warps): where the launchers of
kquant_mma_cuda take it, its launch shapes (measured choices) and launchers."""
from __future__ import annotations

import numpy as np

from .kernels import max_block_smem, null_arg, num_sms, smem_kernel
from .weight_cuda import KERNEL_TYPE_IDS, CudaWeight, joined_block_ends, joined_segments

# the weight types gemm_kquant_tile.cu reads (16-byte aligned super-blocks) -> their rows' bytes in
# its shared memory a super-block (KtLayout::SROW, and Q6_KR's 4 bytes of d), and its stages' bytes
# a super-block past the weights (activations, scales and 32-sums of 64 columns)
TILE_KERNEL_QTYPES = {"Q4_K": 160, "Q5_K": 224, "Q6_KR": 208 + 4}
_TILE_X_BYTES = 8 * 64 * 32 + 64 * 4 + 64 * 16

TILE_MIN_BATCH = 33
TILE_MIN_ROWS = 16384
# (MT, RG, KW, ST) by kernel type. H200, batch 64 / 40, the shapes swept against gemv_kquant_mma's
# default (bench_decode_kernels.py --configs q8mma,q8tile:...): Q4_K 28672x4096 (2, 4, 1, 2) 69.1 /
# 68.3 us against 88.9 / 94.9 ((2, 8, 1, 2) 67.5 has only 112 blocks, one an SM: it would not fill
# the SMs on half those rows; one tile a warp (1, 4, 1, 2) 75.9; 3 stages no better, 68.7);
# Q6_K 49152x4096 (1, 8, 1, 2) 123.0 / 123.4 against 162.0 / 163.5 ((1, 4, 1, 2) 135.4; two tiles a
# warp 146.7). Weights of 4096-6144 rows lose (their few blocks leave SMs idle or hold one block of
# 4 warps each: Q4_K 4096x4096 19.7 us at best against 15.8, 6144x4096 23.8 against 21.6, Q6_K
# 4096x14336 86.7 against 50.4), hence TILE_MIN_ROWS. Q5_K runs (and is tested) but was not timed, so
# it stays on gemv_kquant_mma.
TILE_SHAPES = {"Q4_K": (2, 4, 1, 2), "Q6_KR": (1, 8, 1, 2)}
# Q4_K in blocks of 224 rows, one an SM (255 registers), where those blocks fit in one wave and the
# device lets a block have their 107 KB of shared memory (not sm_86 / sm_89): the 8B gate / up (28672
# rows, 128 blocks) at batch 64 / 40 took 58.7 / 57.9 us alone against 60.6 / 59.7 with the default, the
# batch-64 / 40 decode graphs 6,789-6,800 / 6,804-6,843 us against 6,838-6,910 / 6,853-6,920, and
# bench_throughput.py at 64 concurrent 5,828 / 5,807 out tok/s against 5,778 / 5,752 (H100, session 58).
# On taller weights a second wave of these blocks would leave most SMs idle.
TILE_ONE_WAVE_SHAPES = {"Q4_K": (2, 7, 1, 2)}


def kquant_tile_shape(ws, n: int) -> tuple[int, int, int, int] | None:
    """gemm_kquant_tile's launch shape (MT, RG, KW, ST) for these weights of one input at batch n (on
    the tensor-core path, gguf_mma_tiles) where kquant_mma_cuda's launchers take it: batches
    TILE_MIN_BATCH-64 (8 tiles of 8 columns), TILE_MIN_ROWS rows or more in all, types of TILE_SHAPES
    (TILE_ONE_WAVE_SHAPES where it applies); else None."""
    rows = sum(w.rows for w in ws)
    if not TILE_MIN_BATCH <= n <= 64 or rows < TILE_MIN_ROWS or any(w.kernel_qtype not in TILE_SHAPES for w in ws):
        return None
    qtype = ws[0].kernel_qtype
    one_wave = TILE_ONE_WAVE_SHAPES.get(qtype)
    if one_wave and all(w.kernel_qtype == qtype for w in ws):
        blocks = joined_block_ends(ws, 16 * one_wave[0] * one_wave[1])[-1]   # as the launch counts them
        if blocks <= num_sms() and kquant_tile_smem(ws, one_wave) <= max_block_smem():
            return one_wave
    return TILE_SHAPES[qtype]


def kquant_tile_smem(ws, shape: tuple[int, int, int, int]) -> int:
    """Dynamic shared memory of a gemm_kquant_tile(3) launch of shape (MT, RG, KW, ST) over ws."""
    mt, rg, kw, st = shape
    return st * kw * (16 * mt * rg * max(TILE_KERNEL_QTYPES[w.kernel_qtype] for w in ws) + _TILE_X_BYTES)


def launch_gemm_kquant_tile(w: CudaWeight, xk, bias, out, n: int, shape: tuple[int, int, int, int]) -> None:
    """out [n, rows] = activations (quantize_x_q8k's xk, n <= 64) @ w.T (+ bias) by gemm_kquant_tile
    (gemm_kquant_tile.cu) of shape (MT 16-row tiles a warp, RG row groups, KW warps over K, ST stages)."""
    mt, rg, kw, st = shape
    smem = kquant_tile_smem([w], shape)
    expr = f"gemm_kquant_tile<{KERNEL_TYPE_IDS[w.kernel_qtype]}, {mt}, {rg}, {kw}, {st}>"
    smem_kernel("gemm_kquant_tile.cu", expr, smem)(
        (-(-w.rows // (16 * mt * rg)),), (32 * rg * kw,),
        (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), np.int32(w.cols), *xk, np.int32(n),
         null_arg() if bias is None else bias, out), shared_mem=smem)


def launch_gemm_kquant_tile3(ws, xk, biases, outs, n: int, shape: tuple[int, int, int, int]) -> None:
    """launch_gemv_kquant_mma3's join by gemm_kquant_tile3: 2-3 weights of one input in one launch."""
    mt, rg, kw, st = shape
    ends, tids, seg_args = joined_segments(ws, biases, outs, 16 * mt * rg)
    smem = kquant_tile_smem(ws, shape)
    expr = f"gemm_kquant_tile3<{tids}, {mt}, {rg}, {kw}, {st}>"
    smem_kernel("gemm_kquant_tile.cu", expr, smem)((ends[-1],), (32 * rg * kw,), (
        np.int32(ws[0].cols), *xk, np.int32(n), np.int32(ends[0]), np.int32(ends[1]), *seg_args), shared_mem=smem)

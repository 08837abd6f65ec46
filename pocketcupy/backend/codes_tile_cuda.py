"""The FP8 / NVFP4 linears of decode batches past the codes GEMVs' 16 (gemm_codes_tile.cu: the codes
decoded on tensor cores, a block's fp16 activations staged once in shared memory), in place of
dequantizing the whole weight to fp16 tiles for cuBLAS every step: where linear_cuda takes it, its
launch shapes and launcher."""
from __future__ import annotations

import numpy as np

from .kernels import has_tensor_cores, null_arg, num_sms, opt_arg, smem_kernel
from .weight_cuda import CudaWeight

CODES_TILE_FORMATS = {"FP8": 0, "NVFP4": 1}     # template argument F (CODES_FP8, CODES_NVFP4)
# batches up to this many rows take the tile kernel, in launches of at most 64 (each reads the codes
# again); larger ones (prefills) dequantize to fp16 tiles for cuBLAS. 0: never
CODES_TILE_MAX_BATCH = 128
# launch shapes (MT, RG, KW, ST), most rows a block first (codes_tile_plan picks one)
CODES_TILE_SHAPES = ((2, 4, 1, 3), (1, 4, 2, 3), (1, 2, 4, 2))
SHAPE_OVERRIDE: tuple[int, int, int, int] | None = None     # for sweeps (bench_kernels.py)
SPLITS_OVERRIDE: int | None = None     # alone: the shape that fills the SMs (or the last) in this many runs
# split K where a launch's blocks leave SMs without one and each warp would otherwise run more than this
# many 64-column chunks (a long K)
SPLIT_MIN_WARP_CHUNKS = 32
MAX_SPLITS = 8
SPLIT_WARP_CHUNKS = 8     # chunks a warp runs at least in each split
COUNTERS = 1 << 16        # split K's arrival counters: row blocks a launch may have
_counters: dict[int, object] = {}


def codes_tile_takes(w: CudaWeight, n: int) -> bool:
    """Whether the tile kernel runs w's linear at batch n (past the GEMVs, checked by the caller)."""
    return w.qtype in CODES_TILE_FORMATS and n <= CODES_TILE_MAX_BATCH and w.cols % 64 == 0 and has_tensor_cores()


def codes_tile_plan(rows: int, cols: int) -> tuple[tuple[int, int, int, int], int]:
    """A weight's launch shape and runs of K (grid.y; 1: not split). The shape: the first whose blocks fill the
    SMs, else the last; where that one's blocks still leave SMs idle over a long K, the first shape (most rows
    a block) split K into as many runs as fill 2 blocks a SM in one wave (session 67: FP8 4096 x 14336 at
    batch 32 57.1 µs so, 77.3 split 3 ways at (1,2,4,2), 97.1 unsplit)."""
    if SHAPE_OVERRIDE is not None:
        return SHAPE_OVERRIDE, SPLITS_OVERRIDE or codes_tile_splits(SHAPE_OVERRIDE, rows, cols)
    shape = next((sh for sh in CODES_TILE_SHAPES if _row_blocks(sh, rows) >= num_sms()), CODES_TILE_SHAPES[-1])
    if SPLITS_OVERRIDE is None and codes_tile_splits(shape, rows, cols) > 1:
        shape = CODES_TILE_SHAPES[0]
    return shape, SPLITS_OVERRIDE or codes_tile_splits(shape, rows, cols)


def codes_tile_splits(shape: tuple[int, int, int, int], rows: int, cols: int) -> int:
    """How many runs of K a launch at shape splits into: where the blocks are fewer than the SMs and K is long,
    as many as fill 2 blocks a SM in one wave, at most MAX_SPLITS, each SPLIT_WARP_CHUNKS a warp at least."""
    blocks, warp_chunks = _row_blocks(shape, rows), cols // 64 // shape[2]
    if blocks >= num_sms() or warp_chunks <= SPLIT_MIN_WARP_CHUNKS:
        return 1
    return min(MAX_SPLITS, 2 * num_sms() // blocks, warp_chunks // SPLIT_WARP_CHUNKS)


def _row_blocks(shape: tuple[int, int, int, int], rows: int) -> int:
    """A launch's blocks: 16 * MT * RG rows each."""
    return -(-rows // (16 * shape[0] * shape[1]))


def codes_tile_smem(qtype: str, nt: int, shape: tuple[int, int, int, int]) -> int:
    """gemm_codes_tile's dynamic shared memory: its stages (CtLayout), or the end's reduction if larger."""
    mt, rg, kw, st = shape
    rows = 16 * mt * rg
    slot = rows * (64 if qtype == "FP8" else 32 + 4) + 8 * nt * 144
    return max(st * kw * slot, (kw - 1) * rg * nt * mt * 4 * 32 * 4)


def _split_counters():
    import cupy as cp

    dev = cp.cuda.Device().id
    if dev not in _counters:
        _counters[dev] = cp.zeros(COUNTERS, np.int32)    # each launch leaves them at 0
    return _counters[dev]


def launch_gemm_codes_tile(w: CudaWeight, x16, bias, out, n: int, hw_cvt: bool) -> None:
    """out [n, rows] = x16 (fp16 [n, K]) @ w.T (+ bias) for FP8 / NVFP4 w, in launches of 64 rows at most
    (hw_cvt: FP8 codes by sm_89+'s cvt)."""
    import cupy as cp

    shape, sk = codes_tile_plan(w.rows, w.cols)
    mt, rg, kw, st = shape
    blocks = _row_blocks(shape, w.rows)
    if blocks > COUNTERS:
        raise ValueError(f"gemm_codes_tile: {w.rows} rows need {blocks} row blocks, more than {COUNTERS}")
    # split K's sums [SK][nb][rows], one buffer for every launch (they run in stream order)
    ws = cp.empty(sk * min(64, n) * w.rows, np.float32) if sk > 1 else None
    for i in range(0, n, 64):
        nb = min(64, n - i)
        nt = 4 if nb <= 32 else 8
        expr = (f"gemm_codes_tile<{CODES_TILE_FORMATS[w.qtype]}, {nt}, {mt}, {rg}, {kw}, {st}, "
                f"{'true' if hw_cvt and w.qtype == 'FP8' else 'false'}, {'true' if sk > 1 else 'false'}>")
        smem = codes_tile_smem(w.qtype, nt, shape)
        smem_kernel("gemm_codes_tile.cu", expr, smem)((blocks, sk), (32 * rg * kw,),
           (w.data, w.scales, opt_arg(w.row_scales), np.int32(w.rows), np.int32(w.cols), x16[i:i + nb], np.int32(nb),
            opt_arg(bias), out[i:i + nb], opt_arg(ws), _split_counters() if sk > 1 else null_arg()), shared_mem=smem)

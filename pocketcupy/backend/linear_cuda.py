"""The matrix products over the weights weight_cuda uploads.

`linear(x [N, K] float32, w)` -> [N, rows] float32:
  - N <= 8: GEMV kernels reading the stored weights (dense: gemv_dense_mma.cu on tensor cores, else
    gemv.cu; quantized: gemv_gguf.cu with int8 activations, gemv_gguf_f32.cu with fp32 activations);
  - quantized weights, N <= 32: the same GEMV over column tiles of 8 (a weight read per tile
    still beats dequantizing the whole matrix); Q4_K / Q5_K / Q6_K at N 2-64 on int8 tensor cores
    (kquant_mma_cuda.py);
  - FP8 / NVFP4 weights, N <= 16: the tensor-core GEMVs over the E4M3 / E2M1 codes (gemv_fp8.cu,
    gemv_nvfp4.cu);
  - otherwise cuBLAS (fp16/bf16 inputs, fp32 output): activations cast to the weight dtype;
    quantized, FP8 and NVFP4 weights dequantized to fp16 in row tiles first (dequant.cu, gemv_fp8.cu,
    gemv_nvfp4.cu).
`get_rows(w, ids)` -> [N, cols] float32: the embedding lookup.
CuPy is imported lazily: importing this module needs only NumPy."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..quant.kv_quant import E4M3_VALUES
from ..quant.qtensor import FP8_GROUP
from .codes_tile_cuda import codes_tile_takes, launch_gemm_codes_tile
from .cublas_graph import COMPUTE_32F, GEMM_DEFAULT, OP_N, OP_T, R_16BF, R_16F, R_32F, gemm_ex
from .kernels import cuda_op, grid_blocks, has_tensor_cores, kernel, null_arg, opt_arg
from .kquant_mma_cuda import (KQUANT_MAX_BATCH, gguf_mma_tiles, kquant_mma_joinable, launch_gemv_kquant_mma,
                              launch_gemv_kquant_mma3, quantize_x_q8k)
from .weight_cuda import (DENSE_QTYPES, FP8_SCALE_FACTOR, KERNEL_TYPE_IDS, CudaWeight, Half16Rows, Q8Rows,
                          joined_segments)

GEMV_MAX_BATCH = 8
QUANT_GEMV_MAX_BATCH = 32
FP8_GEMV_MAX_BATCH = 16         # gemv_fp8_mma<NT> instances: NT 1, 2 tiles of 8 rows
NVFP4_GEMV_MAX_BATCH = 16       # gemv_nvfp4_mma<NT> likewise
CODES_GEMV_MAX_BATCH = {"FP8": FP8_GEMV_MAX_BATCH, "NVFP4": NVFP4_GEMV_MAX_BATCH}
DENSE_MMA_MIN_BATCH = 1         # fp16 / bf16 weights from this batch on take the tensor-core GEMV
GEMV_THREADS = 128
DEQUANT_TILE_ELEMS = 32 << 20                  # fp16 scratch of the quantized GEMM path: 64 MiB
KQUANT_QTYPES = ("Q4_K", "Q5_K", "Q6_K")       # gemv_kquant.cu (the DP4A K-quant GEMV)
KQUANT_SMALL_ROWS = 2048    # at most this many rows: one row per warp (more warps for short matrices)
# batch 1, more than KQUANT_SMALL_ROWS rows of at least this many values: gemv_kquant_split,
# KQUANT_SPLIT_ROWS rows a block (q8_gemv_launch says what it measured); Q6_K stays on gemv_kquant
KQUANT_SPLIT_MIN_COLS = {"Q4_K": 4096, "Q5_K": 8192}
KQUANT_SPLIT_ROWS = 4
# batch-1 int8 GEMV (gemv_gguf.cu) of these types on rows of more than Q8_B1_LONG_ROW_UNITS units:
# Q8_B1_LONG_ROW_ROWS rows a block (q8_gemv_launch)
Q8_B1_LONG_ROW_QTYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
Q8_B1_LONG_ROW_UNITS = 128
Q8_B1_LONG_ROW_ROWS = 4
# batch-1 Q8_0 of Q8_B1_LONG_ROW_UNITS units a row (K = 4096, where it was measured) from this many rows
# (an 8B model's joined q/k/v, gate / up, its LM head): 8 rows a block
Q8_B1_TALL_ROWS = 6144

# fp16 / bf16 weights past the GEMVs (on cuBLAS): the joined gate / up GEMM writes 16-bit values for
# SiLU·up (dense_mlp; False: the float32 product, for A/B runs)
DENSE_MLP_H16 = True

_F16, _F32, _BF16 = R_16F, R_32F, R_16BF


# --- kernel variants -------------------------------------------------------------------------
def rows_per_block(nb: int) -> int:
    return 2 if nb == 1 else 4


def gemv_threads(work_items: int) -> int:
    """Threads per GEMV block: 32..128, no more than the row's work items (short rows)."""
    t = 32
    while t < GEMV_THREADS and t < work_items:
        t *= 2
    return t


def dense_gemv_kind(w: CudaWeight, nb: int) -> str:
    """"mma": tensor cores for fp16 / bf16 weights at batches DENSE_MMA_MIN_BATCH-8 (sm_80+, rows of
    a multiple of 64 weights; x rounded to the weight's type); "plain": the fp32-activation GEMV."""
    return ("mma" if DENSE_MMA_MIN_BATCH <= nb <= GEMV_MAX_BATCH and w.cols % 64 == 0 and has_tensor_cores()
            else "plain")


def gemv_variant(w: CudaWeight, nb: int, dense_kind: str | None = None) -> str:
    """Readable name of the GEMV kernel linear() uses for batch nb (<= 8), e.g. gemv_q4_k_q8_r2_t128_bs1,
    gemv_q4_1_f32_lanes16_r2_bs1, gemv_q8_0_f32_xs_r4_bs2, gemv_bf16_bs1, gemv_bf16_mma_bs4;
    dense_kind: as gemv_dense's kind."""
    if w.qtype in CODES_GEMV_MAX_BATCH:
        return f"gemv_{w.qtype.lower()}_mma_nt{-(-nb // 8)}_bs{nb}"
    if nt := gguf_mma_tiles(w, nb):
        return f"gemv_{w.qtype.lower()}_q8mma_nt{nt}_bs{nb}"
    if w.act_q8:
        return f"gemv_{w.qtype.lower()}_q8_{q8_gemv_launch(w.qtype, w.rows, w.cols, nb).name()}_bs{nb}"
    if w.is_dense:
        kind = "_mma" if (dense_kind or dense_gemv_kind(w, nb)) == "mma" else ""
        return f"gemv_{w.qtype.lower()}{kind}_bs{nb}"
    cfg = weight_f32_gemv_config(w, nb)
    shape = f"lanes{cfg.lanes}" if cfg.kind == "lanes" else cfg.kind
    return f"gemv_{w.qtype.lower()}_f32_{shape}_r{cfg.rows_per_group}_bs{nb}"


@functools.lru_cache(maxsize=None)
def _dense_gemv(qtype: str, nb: int):
    wt = DENSE_QTYPES[qtype]
    exprs = tuple(f"gemv_dense<{wt}, {b}, {rows_per_block(b)}>" for b in range(1, GEMV_MAX_BATCH + 1))
    return kernel("gemv.cu", exprs[nb - 1], name_expressions=exprs)


@dataclass(frozen=True)
class Q8Gemv:
    """A launch of the int8-activation GEMV. kind "block" (gemv_gguf.cu): R rows per block of
    `threads` threads striding over the rows' 32-value units; "kquant" (gemv_kquant.cu, Q4_K / Q5_K /
    Q6_K): R rows per warp, 4 warps a block, each lane `unroll` 64-value groups in flight at once;
    "kqsplit" (gemv_kquant_split): R rows per block, its threads striding over their groups."""
    kind: str
    rows: int
    threads: int = GEMV_THREADS
    unroll: int = 1

    @property
    def kquant(self) -> bool:
        """A gemv_kquant.cu launch (Q4_K / Q5_K / Q6_K rows of whole super-blocks only)."""
        return self.kind in ("kquant", "kqsplit")

    def expr(self, tid: int, nb: int, xn: bool = False) -> str:
        """xn: the instance whose sums take the norm scale of linear_add_rms_norm's blocks."""
        tail = ", true" if xn else ""
        if self.kquant:
            fn = "gemv_kquant" if self.kind == "kquant" else "gemv_kquant_split"
            return f"{fn}<{tid}, {nb}, {self.rows}, {self.unroll}{tail}>"
        return f"gemv_gguf<{tid}, {nb}, {self.rows}{tail}>"

    @property
    def source(self) -> str:
        return "gemv_kquant.cu" if self.kquant else "gemv_gguf.cu"

    @property
    def block_threads(self) -> int:
        return self.threads if self.kind == "block" else GEMV_THREADS

    def rows_per_block(self) -> int:
        return self.rows * (GEMV_THREADS // 32 if self.kind == "kquant" else 1)

    def name(self) -> str:
        if self.kind == "block":
            return f"r{self.rows}_t{self.threads}"
        return f"{'kq' if self.kind == 'kquant' else 'kqs'}{self.rows}u{self.unroll}"


def q8_gemv_launch(qtype: str, rows: int, cols: int, nb: int) -> Q8Gemv:
    """The int8-activation GEMV for a [rows, cols] weight at batch nb (H200 sweeps,
    bench_decode_kernels.py). K-quants of whole super-blocks at batches 1-2 (KQUANT_MAX_BATCH): the
    64-value-group kernel with 2 rows per warp (Q4_K 28672x4096 at batch 1: 3.05 TB/s against 2.32
    for 2 rows per 128-thread block; padded Q6_K 4096x14336 2.69, raw 2.11 against 1.91; file bytes
    per second). At batch 1, Q4_K from 4096 values a row and Q5_K from 8192 take 4 rows a block
    instead, its 128 threads over their groups (gemv_kquant_split; H200 2026-12-03: Q4_K 4096x14336
    12.0 against 13.8 us, Q5_K 14.5 against 16.6, Q4_K 28672x4096 21.3 against 21.9; decode graphs
    alternated in one process: llama.cpp's Q4_K_M mix, whose down projection is Q4_K in 16 layers,
    2,055 against 2,078 us, ours, with the Q4_K gate / up and o, 2,161 against 2,173; padded Q6_K
    4096x14336 lost with 2 / 4 rows, 19.2 / 19.3 against 18.0, and tied with 4 rows 2 groups in flight,
    17.8); on short matrices at batch 1
    Q4_K / Q5_K a row per warp and Q6_K the block kernel (1024x4096: 0.76 / 0.90 TB/s,
    latency-bound). Other batch-1 types: 2 rows on up to 128 threads, 4 for the 32-value-block types'
    rows of more than 128 units (H200, Q8_0 4096x14336 19.8 us against 22.1, Q4_0 14.1 against 14.9,
    Q5_1 16.8 against 17.6; Q8_0 8B decode graph 2,751 against 2,808 us; Q3_K lost, 25.6 against 22.7,
    IQ4_XS 20.3 against 20.1; one row a block on 4096x4096 / 6144x4096 won alone for Q8_0, 7.0 / 9.5
    against 8.0 / 10.6, but lost in the graph, 2,816, and alone for the others); Q8_0 rows of 128 units
    from Q8_B1_TALL_ROWS rows on take 8 rows a block (28672x4096 34.2 against 34.6 us, 49152x4096 54.6
    against 56.5; decode graph 2,734 against 2,750 us, alternated in one process; from 6144 rows, the
    joined q/k/v too, since 2026-12-03: 6144x4096 10.1 against 10.7 us, graph 2,656 against 2,705).
    Larger batches: fewer threads per row (the activations of nb columns are reused from registers),
    2 rows per warp on rows of <= 128 units, 4 rows per 2 warps beyond (1.3-1.9x over 4 rows on 128
    threads at batch 4)."""
    units = cols // 32
    if qtype in KQUANT_QTYPES and cols % 256 == 0 and nb <= KQUANT_MAX_BATCH[qtype]:
        if nb == 1 and rows > KQUANT_SMALL_ROWS and cols >= KQUANT_SPLIT_MIN_COLS.get(qtype, 1 << 62):
            return Q8Gemv("kqsplit", KQUANT_SPLIT_ROWS)
        if rows > KQUANT_SMALL_ROWS or nb > 1:
            return Q8Gemv("kquant", 2, unroll=1)
        if qtype != "Q6_K":
            return Q8Gemv("kquant", 1, unroll=1)
    if nb == 1:
        long_rows = units > Q8_B1_LONG_ROW_UNITS and qtype in Q8_B1_LONG_ROW_QTYPES
        tall = qtype == "Q8_0" and units == Q8_B1_LONG_ROW_UNITS and rows >= Q8_B1_TALL_ROWS
        return Q8Gemv("block", 8 if tall else Q8_B1_LONG_ROW_ROWS if long_rows else 2, gemv_threads(units))
    return Q8Gemv("block", 2, 32) if units <= 128 else Q8Gemv("block", 4, 64)


@functools.lru_cache(maxsize=None)
def _gguf_gemv(qtype: str, kqtype: str, cfg: Q8Gemv, nb: int, xn: bool = False):
    """The int8-activation GEMV for qtype weights in layout kqtype: one module per (type, source)
    holds the default launches of every batch; other launches (benchmark sweeps) compile on their own."""
    tid = KERNEL_TYPE_IDS[kqtype]
    defaults = [(q8_gemv_launch(qtype, r, c, b), b) for b in range(1, GEMV_MAX_BATCH + 1) for r in (1024, 4096)
                for c in (4096, 4128)]
    exprs = tuple(sorted({c.expr(tid, b) for c, b in defaults if c.source == cfg.source}))
    expr = cfg.expr(tid, nb, xn)
    return kernel(cfg.source, expr, name_expressions=exprs if expr in exprs else (expr,))


# fp32-activation quantized GEMV (gemv_gguf_f32.cu): a launch shape per row length, by units of
# 32 weights per row.  Short rows (the projections of small models: K = 576 is 18 units) give
# each row group L lanes ("lanes"); long rows stage the activations in shared memory ("xs").
F32_SHORT_ROW_UNITS = 64          # rows of at most this many units: the lanes kernel
F32_LANES_SHORT = 16              # lanes per row group for rows of <= 32 units; 32 beyond
F32_XS_ROWS = 4                   # rows per block of the xs kernel
F32_XS_ROWS_HEAVY = {"Q3_K": 2}   # from batch 7 on: decoders whose R = 4 kernels spill registers
F32_BLOCK_MIN_ROWS = 16384         # short rows at batch 1: from this many rows (an LM head) the block kernel, R = 4
# the staged silu(gate) * up GEMV from this batch on as the block kernel of F32_SILU_BLOCK_ROWS rows, below
# as the lanes kernel (H200, SmolLM2 decode graphs: batch 4 1,805 -> 1,679 us with 4 rows, 1,726 with 1;
# batch 1 743 against 780-815)
F32_SILU_BLOCK_MIN_BATCH = 4
F32_SILU_BLOCK_ROWS = 4
F32_SILU_STAGE_BYTES = 32 << 10  # shared memory of the staged silu(gate) * up (gemv_gguf_f32_*_silu)


@dataclass(frozen=True)
class F32Gemv:
    kind: str                     # "lanes" | "xs" | "xsw" (xs with the weights staged too) | "block"
                                  # (gemv_gguf_f32: 32-128 threads on R rows)
    rows_per_group: int           # R: rows sharing each activation load
    lanes: int = 0                # L of the lanes kernel

    def expr(self, tid: int, nb: int, silu: bool = False) -> str:
        if self.kind == "lanes":
            return f"gemv_gguf_f32_lanes<{tid}, {nb}, {self.rows_per_group}, {self.lanes}, {str(silu).lower()}>"
        if self.kind in ("xs", "xsw"):
            return f"gemv_gguf_f32_xs<{tid}, {nb}, {self.rows_per_group}, {str(self.kind == 'xsw').lower()}>"
        return f"gemv_gguf_f32<{tid}, {nb}, {self.rows_per_group}>"

    def rows_per_block(self) -> int:
        return self.rows_per_group * (GEMV_THREADS // self.lanes if self.kind == "lanes" else 1)


def f32_gemv_config(units: int, nb: int, qtype: str = "", rows: int = 0) -> F32Gemv:
    """The fp32-activation GEMV launch for `rows` rows of `units` 32-value units at batch nb (1..8).
    Long rows at batch 1 (H200 sweep, bench_decode_kernels.py): Q4_K / Q5_K a warp per 4 rows
    (1.9 vs 0.8 TB/s for xs:4 at 28672x4096), the rest xs with 8 rows (1.2-1.4x over 4)."""
    if units <= F32_SHORT_ROW_UNITS:
        if nb == 1 and rows >= F32_BLOCK_MIN_ROWS:
            return F32Gemv("block", 4)
        return F32Gemv("lanes", 2 if nb <= 2 else 1, F32_LANES_SHORT if units <= 32 else 32)
    if nb == 1:
        return F32Gemv("lanes", 4, 32) if qtype in ("Q4_K", "Q5_K") else F32Gemv("xs", 2 * F32_XS_ROWS)
    return F32Gemv("xs", F32_XS_ROWS_HEAVY.get(qtype, F32_XS_ROWS) if nb >= 7 else F32_XS_ROWS)


def _default_f32_exprs(qtype: str, kqtype: str, kind: str) -> tuple[str, ...]:
    tid = KERNEL_TYPE_IDS[kqtype]
    cfgs = {c.expr(tid, nb, silu) for u in (32, 64, 128) for nb in range(1, GEMV_MAX_BATCH + 1)
            for c in [f32_gemv_config(u, nb, qtype)] if c.kind == kind for silu in (False, True)[:1 + (kind == "lanes")]}
    return tuple(sorted(cfgs))


def weight_f32_gemv_config(w: "CudaWeight", nb: int) -> F32Gemv:
    """f32_gemv_config for this weight's rows at batch nb."""
    return f32_gemv_config(w.cols // 32, nb, w.qtype, w.rows)


@functools.lru_cache(maxsize=None)
def _gguf_gemv_f32(qtype: str, kqtype: str, kind: str, expr: str):
    """One compiled module per (qtype, layout, kind) holds every default launch shape of that kind;
    other shapes (benchmark sweeps) compile on their own."""
    exprs = _default_f32_exprs(qtype, kqtype, kind)
    return kernel("gemv_gguf_f32.cu", expr, name_expressions=exprs if expr in exprs else (expr,))


def launch_gemv_f32(w: "CudaWeight", x, bias, out, nb: int, cfg: F32Gemv, up=None) -> None:
    """out [nb, rows] = x [nb, K] @ w.T (+ bias) by the fp32-activation GEMV of shape cfg; x rows
    contiguous (x may have a row stride for the lanes kernel). up (lanes kernel only): the
    activations are silu(x) * up instead, staged in shared memory by each block where they fit
    (silu_stage_units), by the lanes kernel or, from batch F32_SILU_BLOCK_MIN_BATCH, the block kernel."""
    k = w.cols
    tid = w.type_id
    rpb = cfg.rows_per_block()
    threads = GEMV_THREADS if cfg.kind != "block" else gemv_threads(k // 32)
    if cfg.kind == "xsw" and w.data.shape[1] % 16:
        raise ValueError(f"gemv xsw: {w.data.shape[1]} bytes per row is not a multiple of 16")
    if up is not None and cfg.kind != "lanes":
        raise ValueError("gemv: silu(gate) * up activations need the lanes kernel")
    head = (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), np.int32(k), x)
    if cfg.kind == "lanes":
        ldx = np.int64(x.strides[0] // 4 if x.ndim == 2 else k)
        head += (ldx, x, ldx) if up is None else (ldx, up, np.int64(up.strides[0] // 4))
    grid, tail = ((w.rows + rpb - 1) // rpb,), (opt_arg(bias), out)
    e = silu_stage_units(k, nb) if up is not None else None
    if e is not None:
        if nb >= F32_SILU_BLOCK_MIN_BATCH:
            r = F32_SILU_BLOCK_ROWS
            expr = f"gemv_gguf_f32_staged_silu<{tid}, {nb}, {r}, 0, {e}>"
            grid, threads = ((w.rows + r - 1) // r,), gemv_threads(k // 32)
        else:
            expr = f"gemv_gguf_f32_staged_silu<{tid}, {nb}, {cfg.rows_per_group}, {cfg.lanes}, {e}>"
        kernel("gemv_gguf_f32.cu", expr, name_expressions=(expr,))(grid, (threads,), head + tail)
        return
    _gguf_gemv_f32(w.qtype, w.kernel_qtype, cfg.kind, cfg.expr(tid, nb, up is not None))(grid, (threads,), head + tail)


def silu_stage_units(k: int, nb: int) -> int | None:
    """E of gemv_gguf_f32_*_silu (their shared silu(gate) * up rows fit 32 * E values, E a multiple
    of 16) for nb rows of k values, or None where they would pass F32_SILU_STAGE_BYTES: then every
    lane computes its own units' silu(gate) * up (the lanes kernel's SILU loader)."""
    e = -(-k // 512) * 16
    return e if nb * e * 32 * 4 <= F32_SILU_STAGE_BYTES else None


def norm_linear_lanes(w, n: int) -> F32Gemv | None:
    """The lanes GEMV that normalises its own input (add_rms_norm_linear) for w at batch n: fp32-
    activation GGUF weights whose rows fit one warp's norm (<= 1024 values, the warp-per-row norm's
    rows) and take the lanes kernel, at batch 1 only (H200, SmolLM2-shaped Q8_0 decode graph: batch 1
    768 -> 694 us, batch 4 1,862 -> 2,328); None elsewhere."""
    from .elementwise_cuda import norm_warp_dim

    if not (isinstance(w, CudaWeight) and w.is_gguf and not w.act_q8 and n == 1
            and w.cols % 32 == 0 and norm_warp_dim(w.cols) is not None):
        return None
    cfg = weight_f32_gemv_config(w, n)
    return cfg if cfg.kind == "lanes" else None


@cuda_op("add_rms_norm_linear")
def add_rms_norm_linear(x, residual, w_norm, eps: float, w, bias=None):
    """(linear(rms_norm(x + residual) * w_norm, w), x + residual) in one launch
    (gemv_gguf_f32_lanes_norm: each block normalises the input itself, with the warp-per-row norm's
    arithmetic); the new residual is a new array. None where norm_linear_lanes does not apply."""
    return _norm_lanes_launch(x, residual, w_norm, eps, w, bias, gated=False)


@cuda_op("add_rms_norm_silu_mul")
def add_rms_norm_silu_mul(x, residual, w_norm, eps: float, w_gate_up):
    """(silu(gate) * up, x + residual) for [gate; up] = linear(rms_norm(x + residual) * w_norm,
    w_gate_up) in one launch (gemv_gguf_f32_lanes_norm_gated: a lane group sums gate row i and up
    row i, so the down projection after it reads finished activations); the same bits as
    add_rms_norm_linear followed by silu_mul. None where norm_linear_lanes does not apply."""
    if not isinstance(w_gate_up, CudaWeight) or w_gate_up.rows % 2:
        return None
    return _norm_lanes_launch(x, residual, w_norm, eps, w_gate_up, None, gated=True)


def _norm_lanes_launch(x, residual, w_norm, eps: float, w, bias, gated: bool):
    import cupy as cp

    from .elementwise_cuda import norm_warp_dim

    n = x.shape[0] if x.ndim == 2 else 0
    cfg = norm_linear_lanes(w, n)
    if cfg is None or x.shape != residual.shape or x.shape[1] != w.cols:
        return None
    x, residual = cp.ascontiguousarray(x, dtype=cp.float32), cp.ascontiguousarray(residual, dtype=cp.float32)
    w_norm = cp.ascontiguousarray(w_norm, dtype=cp.float32)
    res_out = cp.empty_like(residual)
    e = norm_warp_dim(w.cols) // 32
    head = (w.data, np.int64(w.data.shape[1]))
    norm_args = (np.int32(w.cols), x, residual, w_norm, np.float32(eps), res_out)
    if gated:
        inter = w.rows // 2
        out = cp.empty((n, inter), cp.float32)
        expr = f"gemv_gguf_f32_lanes_norm_gated<{w.type_id}, {n}, {cfg.lanes}, {e}>"
        grid = -(-inter // (GEMV_THREADS // cfg.lanes))
        args = head + (np.int32(inter),) + norm_args + (out,)
    else:
        bias = None if bias is None else cp.ascontiguousarray(bias, dtype=cp.float32)
        out = cp.empty((n, w.rows), cp.float32)
        expr = f"gemv_gguf_f32_lanes_norm<{w.type_id}, {n}, {cfg.rows_per_group}, {cfg.lanes}, {e}>"
        grid = -(-w.rows // cfg.rows_per_block())
        args = head + (np.int32(w.rows),) + norm_args + (opt_arg(bias), out)
    kernel("gemv_gguf_f32.cu", expr, name_expressions=(expr,))((grid,), (GEMV_THREADS,), args)
    return out, res_out


@functools.lru_cache(maxsize=None)
def _dequant(kqtype: str, kind: str):
    """dequant.cu's kernel of one block type (one module each type): kind "tile" (dequant_tile_f16),
    or "int" / "long long" (dequant_rows with ids of that type)."""
    tid = KERNEL_TYPE_IDS[kqtype]
    exprs = (f"dequant_rows<{tid}, int>", f"dequant_rows<{tid}, long long>", f"dequant_tile_f16<{tid}>")
    return kernel("dequant.cu", exprs[("int", "long long", "tile").index(kind)], name_expressions=exprs)


@functools.lru_cache(maxsize=None)
def _get_rows_dense(qtype: str, idx64: bool):
    wt = DENSE_QTYPES[qtype]
    exprs = tuple(f"get_rows_dense<{w}, {i}>" for w in (0, 1) for i in ("int", "long long"))
    return kernel("dequant.cu", f"get_rows_dense<{wt}, {'long long' if idx64 else 'int'}>", name_expressions=exprs)


def _aligned16(a) -> bool:
    return a.data.ptr % 16 == 0


# --- launchers -------------------------------------------------------------------------------
def gemv_dense(x, w: CudaWeight, bias, out, kind: str | None = None) -> None:
    """out [n, rows] = x [n, K] @ w.T (+ bias) for fp16 / bf16 w, n <= 8; kind: "mma" or "plain"
    (None: dense_gemv_kind's choice)."""
    n, k = x.shape
    if (kind or dense_gemv_kind(w, n)) == "mma":
        kernel("gemv_dense_mma.cu", f"gemv_dense_mma<{DENSE_QTYPES[w.qtype]}>", name_expressions=_DENSE_MMA_EXPRS)(
            (-(-w.rows // 16),), (DENSE_MMA_THREADS,),
            (w.data, np.int32(w.rows), np.int32(k), x, np.int32(n), opt_arg(bias), out))
        return
    r = rows_per_block(n)
    fn = _dense_gemv(w.qtype, n)
    unroll = 2 if r >= 4 else 4                            # U in gemv_dense
    fn(((w.rows + r - 1) // r,), (gemv_threads(-(-(k // 8) // unroll)),),
       (w.data, np.int32(w.rows), np.int32(k), x, opt_arg(bias), out))


FP8_UNROLL = 4         # U of gemv_fp8_mma: 64-code chunks a warp loads at once (2 or 4)
FP8_HW_CVT = True      # HW of gemv_fp8_mma: codes to fp16 by sm_89+'s cvt (elsewhere moved bit by bit)
_FP8_MMA_EXPRS = tuple(f"gemv_fp8_mma<{nt}, {u}, {hw}>" for nt in (1, 2) for u in (2, 4) for hw in ("false", "true"))


def gemv_fp8(x, w: CudaWeight, bias, out) -> None:
    """out [n, rows] = x [n, K] @ w.T (+ bias) for FP8 w, n <= FP8_GEMV_MAX_BATCH (tensor cores)."""
    n, k = x.shape
    expr = f"gemv_fp8_mma<{-(-n // 8)}, {FP8_UNROLL}, {'true' if FP8_HW_CVT else 'false'}>"
    kernel("gemv_fp8.cu", expr, name_expressions=_FP8_MMA_EXPRS)(
        (-(-w.rows // 16),), (DENSE_MMA_THREADS,),
        (w.data, w.scales, np.int32(w.rows), np.int32(k), x, np.int32(n), opt_arg(bias), out))


NVFP4_UNROLL = 4       # U of gemv_nvfp4_mma: 64-code chunks a warp loads at once (4 or 8)
_NVFP4_MMA_EXPRS = tuple(f"gemv_nvfp4_mma<{nt}, {u}>" for nt in (1, 2) for u in (4, 8))


def gemv_nvfp4(x, w: CudaWeight, bias, out) -> None:
    """out [n, rows] = x [n, K] @ w.T (+ bias) for NVFP4 w, n <= NVFP4_GEMV_MAX_BATCH (tensor cores)."""
    n, k = x.shape
    kernel("gemv_nvfp4.cu", f"gemv_nvfp4_mma<{-(-n // 8)}, {NVFP4_UNROLL}>", name_expressions=_NVFP4_MMA_EXPRS)(
        (-(-w.rows // 16),), (DENSE_MMA_THREADS,),
        (w.data, w.scales, w.row_scales, np.int32(w.rows), np.int32(k), x, np.int32(n), opt_arg(bias), out))


def dequant_nvfp4(w: CudaWeight, r0: int, nr: int, out, ids=None) -> None:
    """out [nr, cols] (fp16 or float32) = rows r0 .. r0 + nr - 1 of NVFP4 w, or its rows ids (int32 [nr])."""
    expr = f"dequant_nvfp4<{'float' if out.dtype == np.float32 else '__half'}>"
    kernel("gemv_nvfp4.cu", expr, name_expressions=("dequant_nvfp4<__half>", "dequant_nvfp4<float>"))(
        (-(-w.cols // 16 // 128), max(1, min(nr, 65535))), (128,),
        (w.data, w.scales, w.row_scales, np.int32(w.cols), np.int64(r0), opt_arg(ids), np.int32(nr), out))


_CODES_GEMV = {"FP8": gemv_fp8, "NVFP4": gemv_nvfp4}     # the GEMVs of CODES_GEMV_MAX_BATCH's formats
_DENSE_MMA_EXPRS = ("gemv_dense_mma<0>", "gemv_dense_mma<1>")
DENSE_MMA_THREADS = 256                                   # GM_WARPS (F8_WARPS) * 32 in gemv_dense_mma.cu (gemv_fp8.cu)
_QUANTIZE_EXPRS = ("quantize_q8_x<false, false>", "quantize_q8_x<true, false>", "quantize_q8_x<false, true>",
                   "quantize_q8_x<true, true>")


def quantize_x(x, up=None, half: bool = False):
    """Activations [N, K] float32 (row stride allowed) -> (int8 [N, K], float32 [N, K/32, 4])
    blocks for the int8 GEMV; with up, the activations are silu(x) * up. half: instead the
    rounded values as float16 [N, K] (the GEMM path's input)."""
    import cupy as cp

    n, k = x.shape
    n4 = n * k // 4
    if half:
        xq = xds = null_arg()
        xh = cp.empty((n, k), dtype=cp.float16)
    else:
        xq = cp.empty((n, k), dtype=cp.int8)
        xds = cp.empty((n, k // 32, 4), dtype=cp.float32)
        xh = null_arg()
    src = x if up is None else up
    fn = kernel("gemv_gguf.cu", f"quantize_q8_x<{str(up is not None).lower()}, {str(half).lower()}>",
                name_expressions=_QUANTIZE_EXPRS)
    fn((grid_blocks(n4, 256, 1 << 30),), (256,), (x, np.int64(x.strides[0] // 4), src, np.int64(src.strides[0] // 4),
                                            np.int32(k), np.int64(n4), xq, xds, xh))
    return xh if half else (xq, xds)


def launch_gemv_q8(w: "CudaWeight", xq, xds, bias, out, nb: int, cfg: Q8Gemv | None = None, xpart=None) -> None:
    """out [nb, rows] = activations (quantized by quantize_x) @ w.T (+ bias): the int8 DP4A GEMV
    launched as cfg (default: q8_gemv_launch). xpart: the norm partials of batch-1 blocks written by
    linear_add_rms_norm (their sums take its scale)."""
    k = w.cols
    cfg = cfg or q8_gemv_launch(w.qtype, w.rows, k, nb)
    rpb = cfg.rows_per_block()
    if cfg.kquant and (w.qtype not in KQUANT_QTYPES or k % 256):
        raise ValueError(f"gemv_kquant: no kernel for {w.qtype} rows of {k} (Q4_K / Q5_K / Q6_K, whole super-blocks)")
    _gguf_gemv(w.qtype, w.kernel_qtype, cfg, nb, xpart is not None)(
        ((w.rows + rpb - 1) // rpb,), (cfg.block_threads,),
        (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), np.int32(k), xq, xds, opt_arg(xpart), opt_arg(bias), out))


KQUANT3_ROWS = 2                  # rows per warp of the joined launch


def kquant_joinable(ws, nb: int) -> bool:
    """Whether gemv_kquant3 computes these 2-3 weights of one input in one launch at batch nb:
    int8-activation K-quants of whole super-blocks, each within its gemv_kquant batch bound and not
    on tensor cores at this batch."""
    return 2 <= len(ws) <= 3 and all(
        isinstance(w, CudaWeight) and w.act_q8 and w.qtype in KQUANT_QTYPES and w.cols % 256 == 0
        and w.cols == ws[0].cols and 1 <= nb <= KQUANT_MAX_BATCH[w.qtype] and not gguf_mma_tiles(w, nb)
        for w in ws)


def launch_gemv_kquant3(ws, xq, xds, biases, outs, nb: int, xpart=None) -> None:
    """outs[i] [nb, ws[i].rows] = activations @ ws[i].T (+ biases[i]) for 2-3 K-quant weights
    (kquant_joinable) in one gemv_kquant3 launch; xpart as launch_gemv_q8's."""
    ends, tids, seg_args = joined_segments(ws, biases, outs, KQUANT3_ROWS * GEMV_THREADS // 32)
    expr = f"gemv_kquant3<{tids}, {nb}, {KQUANT3_ROWS}{'' if xpart is None else ', true'}>"
    kernel("gemv_kquant.cu", expr, name_expressions=(expr,))((ends[-1],), (GEMV_THREADS,), (
        np.int32(ws[0].cols), xq, xds, opt_arg(xpart), np.int32(ends[0]), np.int32(ends[1]), *seg_args))


def _gemv_gguf_takes(w: CudaWeight, n: int) -> bool:
    """Whether _gemv_gguf runs a batch of n rows of w: column tiles up to QUANT_GEMV_MAX_BATCH, or
    the K-quant tensor-core kernel (gguf_mma_tiles); else dequantization + cuBLAS."""
    return n <= QUANT_GEMV_MAX_BATCH or gguf_mma_tiles(w, n) > 0


def _gemv_gguf(x, w: CudaWeight, bias, out, up=None, xqd=None, xk=None) -> None:
    """Quantized GEMV: Q4_K / Q5_K / Q6_K on int8 tensor cores where gguf_mma_tiles says so,
    else over column tiles of GEMV_MAX_BATCH; up: the activations are silu(x) * up
    (int8 activations only; the fp32 lanes kernel fuses it itself, see silu_mul_linear); xqd / xk:
    x already quantized (quantize_x / quantize_x_q8k)."""
    n = x.shape[0]
    nt = gguf_mma_tiles(w, n)
    if nt:
        launch_gemv_kquant_mma(w, xk or quantize_x_q8k(x, up), bias, out, n, nt)
        return
    if w.act_q8:
        xq, xds = xqd or quantize_x(x, up)
    for n0 in range(0, n, GEMV_MAX_BATCH):
        nb = min(GEMV_MAX_BATCH, n - n0)
        if w.act_q8:
            launch_gemv_q8(w, xq[n0:], xds[n0:], bias, out[n0:], nb)
        else:
            launch_gemv_f32(w, x[n0:], bias, out[n0:], nb, weight_f32_gemv_config(w, nb))


def _cast(x, qtype: str):
    """float32 -> fp16 / bf16 bits (uint16), same shape."""
    import cupy as cp

    y = cp.empty(x.shape, dtype=cp.float16 if qtype == "F16" else cp.uint16)
    name = "cast_f32_f16" if qtype == "F16" else "cast_f32_bf16"
    kernel("gemv.cu", name)((grid_blocks(x.size, 256, 8192),), (256,), (x, y, np.int64(x.size)))
    return y


def _gemm_into(a16, w16, rows: int, dtype: int, out, col0: int = 0, out_type: int = _F32) -> None:
    """out[:, col0:col0+rows] = a16 [N, K] @ w16[:rows].T, fp16/bf16 inputs (dtype), fp32 accumulate;
    out float32 (out_type _F32) or of the inputs' type (out_type dtype) (cuBLAS, column-major view:
    out^T = w16 @ a16^T); capturable in a CUDA graph."""
    n, k = a16.shape
    gemm_ex(OP_T, OP_N, rows, n, k, w16.data.ptr, dtype, k, a16.data.ptr, dtype, k,
            out.data.ptr + col0 * out.itemsize, out_type, out.shape[1], COMPUTE_32F, GEMM_DEFAULT)


def half16_type(w) -> str | None:
    """The 16-bit type of w's GEMM input: fp16 / bf16 weights' own, "F16" for FP8 / NVFP4 codes (their
    tile kernel and fp16 tiles); None for the rest (GGUF types round their input themselves)."""
    if not isinstance(w, CudaWeight):
        return None
    return w.qtype if w.is_dense else ("F16" if w.qtype in _CODES_GEMV else None)


def gemm_batch(w, n: int) -> bool:
    """Whether fp16 / bf16 or FP8 / NVFP4 w runs batch n past its GEMVs (the input rounded to half16_type)."""
    return n > CODES_GEMV_MAX_BATCH.get(w.qtype, GEMV_MAX_BATCH)


def _half16_input(h, w):
    """(x, x16) of an activation for w: a Half16Rows' float32 rows and its 16-bit copy where that
    copy is of w's GEMM input type (else None: the GEMM casts x); a plain array with no copy."""
    if not isinstance(h, Half16Rows):
        return h, None
    return h.x, (h.x16 if half16_type(w) == h.qtype else None)


def _dense_type(w: CudaWeight) -> int:
    return _F16 if w.qtype == "F16" else _BF16


def _gemm_dense(x16, w: CudaWeight, out) -> None:
    """out = x16 @ w.T for fp16 / bf16 weights, x16 already rounded to the weight's type (cuBLAS)."""
    _gemm_into(x16, w.data, w.rows, _dense_type(w), out)


def dense_mlp_applies(n: int, w_gate_up, w_down) -> bool:
    """Whether dense_mlp takes this batch: fp16 / bf16 weights of one type past the GEMVs (cuBLAS),
    [gate; up] over w_down's columns, a multiple of 4 of them (silu_mul_h16in's loads)."""
    return (DENSE_MLP_H16 and isinstance(w_gate_up, CudaWeight) and isinstance(w_down, CudaWeight)
            and n > GEMV_MAX_BATCH and w_gate_up.is_dense and w_down.qtype == w_gate_up.qtype
            and w_gate_up.rows == 2 * w_down.cols and w_down.cols % 4 == 0)


@cuda_op("dense_mlp")
def dense_mlp(h, w_gate_up: CudaWeight, w_down: CudaWeight):
    """linear(silu_mul(gate, up), w_down) for [gate; up] = linear(h, w_gate_up) where
    dense_mlp_applies: the gate / up GEMM writes its product rounded to the weights' type and
    SiLU·up reads that (silu_mul_h16in), half the bytes of a float32 product both ways (H200, BF16
    8B: batch-64 decode graph 6,041 -> 5,965 us, 2048-token prefill 61.6 -> 60.1 ms). h: float32
    [N, K] or Half16Rows."""
    import cupy as cp

    from .elementwise_cuda import silu_mul_h16in

    x, x16 = _half16_input(h, w_gate_up)
    n, inter, dt = x.shape[0], w_down.cols, _dense_type(w_gate_up)
    gu = cp.empty((n, 2 * inter), dtype=cp.float16 if dt == _F16 else cp.uint16)
    _gemm_into(_cast(x, w_gate_up.qtype) if x16 is None else x16, w_gate_up.data, w_gate_up.rows, dt, gu,
               out_type=dt)
    out = cp.empty((n, w_down.rows), dtype=cp.float32)
    _gemm_dense(silu_mul_h16in(gu[:, :inter], gu[:, inter:], w_gate_up.qtype), w_down, out)
    return out


def dequant_tile_rows(rows: int, k: int) -> int:
    """Rows of the quantized GEMM's fp16 scratch tile: the weight in equal tiles of at most
    DEQUANT_TILE_ELEMS values, rounded up to 128 rows. (The down projection's 2340-row tiles made
    cuBLAS take an sm_80 kernel: H200, 2048 tokens, 240 TFLOP/s against ~740 for 2048-row tiles.)"""
    per = -(-rows // -(-rows * k // DEQUANT_TILE_ELEMS))
    return min(rows, -(-per // 128) * 128)


def dequant_tile(w: CudaWeight, r0: int, nr: int, scratch) -> None:
    """scratch[:nr] = rows r0 .. r0 + nr - 1 of quantized, FP8 or NVFP4 w as fp16 (nr * cols < 2^31)."""
    if w.qtype == "NVFP4":
        dequant_nvfp4(w, r0, nr, scratch)
        return
    if w.qtype == "FP8":
        kernel("gemv_fp8.cu", "dequant_fp8_f16")((grid_blocks(nr * w.cols // 8, 256, 8192),), (256,),
                                                 (w.data, w.scales, np.int32(w.cols), np.int64(r0), np.int32(nr), scratch))
        return
    _dequant(w.kernel_qtype, "tile")((-(-nr * (w.cols // 32) // 256),), (256,),
                                     (w.data[r0:], np.int64(w.data.shape[1]), np.int32(nr), np.int32(w.cols), scratch))


def _gemm(x, w: CudaWeight, bias, out, x16=None) -> None:
    """x16: x rounded to the 16-bit input the GEMM takes, by the kernel that made x (dense weights:
    rounded to w's type; quantized: quantize_x(x, half=True), or x cast to fp16 where w takes fp32
    activations)."""
    import cupy as cp

    n, k = x.shape
    if w.is_dense:
        _gemm_dense(_cast(x, w.qtype) if x16 is None else x16, w, out)
    else:
        if x16 is None:
            x16 = quantize_x(x, half=True) if w.act_q8 else _cast(x, "F16")
        if codes_tile_takes(w, n):
            launch_gemm_codes_tile(w, x16, bias, out, n, FP8_HW_CVT)
            return
        tile = dequant_tile_rows(w.rows, k)
        scratch = cp.empty((tile, k), dtype=cp.float16)
        for r0 in range(0, w.rows, tile):
            nr = min(tile, w.rows - r0)
            dequant_tile(w, r0, nr, scratch)
            _gemm_into(x16, scratch, nr, _F16, out, r0)
    if bias is not None:
        out += bias


@cuda_op("linear")
def linear(x, w, bias=None, out=None):
    """x [..., K] float32 (or Q8Rows / Half16Rows) @ w.T (+ bias) -> [..., rows] float32."""
    import cupy as cp

    xqd = xk = x16 = None
    if isinstance(x, Q8Rows) and x.x is None:
        return _linear_blocks_only(x, w, bias, out)
    if isinstance(x, Q8Rows):
        x, xqd, xk = x.x, (x.xq, x.xds) if x.xq is not None else None, x.xk
    elif isinstance(x, Half16Rows):
        x, x16 = _half16_input(x, w)

    if not isinstance(w, CudaWeight):                      # a plain float32 matrix
        y = cp.matmul(cp.asarray(x, dtype=cp.float32), w.T.astype(cp.float32))
        if bias is not None:
            y += bias
        if out is None:
            return y
        out[...] = y
        return out
    lead = x.shape[:-1]
    x = cp.ascontiguousarray(x, dtype=cp.float32).reshape(-1, x.shape[-1])
    if not _aligned16(x):                                  # the kernels load x 16 bytes at a time
        x = x.copy()
    n, k = x.shape
    if k != w.cols:
        raise ValueError(f"linear: x has {k} columns, weight {w.shape} expects {w.cols}")
    if out is None:
        out = cp.empty((n, w.rows), dtype=cp.float32)
    y = out.reshape(n, w.rows)
    if not (y.flags.c_contiguous and y.dtype == cp.float32):
        raise ValueError("linear: out must be a contiguous float32 array")
    if bias is not None:
        bias = cp.ascontiguousarray(bias, dtype=cp.float32)
    if n == 0:
        return out
    x16 = x16 if x16 is not None and x16.shape == x.shape else None
    if w.is_dense:
        if n <= GEMV_MAX_BATCH and k % 8 == 0:
            gemv_dense(x, w, bias, y)
        else:
            _gemm(x, w, bias, y, x16=x16)
    elif n <= CODES_GEMV_MAX_BATCH.get(w.qtype, 0):
        _CODES_GEMV[w.qtype](x, w, bias, y)
    elif w.is_gguf and _gemv_gguf_takes(w, n):
        _gemv_gguf(x, w, bias, y, xqd=xqd, xk=xk)
    else:
        _gemm(x, w, bias, y, x16=x16)
    return out if out.shape == lead + (w.rows,) else out.reshape(lead + (w.rows,))


def reads_q8_blocks(w, n: int) -> bool:
    """Whether the linear of w at batch n reads its input as int8 blocks of 32 (the DP4A GEMVs)."""
    return isinstance(w, CudaWeight) and not w.is_dense and w.act_q8 and n <= GEMV_MAX_BATCH \
        and not gguf_mma_tiles(w, n)


def _linear_blocks_only(x: Q8Rows, w, bias, out):
    """linear of activations that exist only as int8 blocks (linear_add_rms_norm's output)."""
    import cupy as cp

    n, k = x.xq.shape
    if not reads_q8_blocks(w, n) or k != w.cols:
        raise ValueError(f"linear: activations given only as int8 blocks of {k} values need a weight read by "
                         f"the int8 GEMV with {k} columns, not {getattr(w, 'qtype', type(w).__name__)} {w.shape}")
    out = cp.empty((n, w.rows), dtype=cp.float32) if out is None else out
    launch_gemv_q8(w, x.xq, x.xds, None if bias is None else cp.ascontiguousarray(bias, dtype=cp.float32),
                   out.reshape(n, w.rows), n, xpart=x.xpart)
    return out


@cuda_op("linears")
def linears(x, ws, biases=None):
    """[linear(x, w, b) for each weight]: the projections of one input (unfused QKV or gate/up of
    mixed formats); weights with int8 activations share one quantization of x."""
    import cupy as cp

    biases = [None] * len(ws) if biases is None else biases
    if isinstance(x, Q8Rows) and len(x.shape) == 2 and all(isinstance(w, CudaWeight) and w.cols == x.shape[1]
                                                           for w in ws):
        n = x.shape[0]
        if x.xq is not None and kquant_joinable(ws, n):
            return _linears_joined(n, ws, biases, launch_gemv_kquant3, x.xq, x.xds, xpart=x.xpart)
        if x.xk is not None and (nt := kquant_mma_joinable(ws, n)):
            return _linears_joined(n, ws, biases, launch_gemv_kquant_mma3, x.xk, nt=nt)
    if isinstance(x, (Q8Rows, Half16Rows)):    # already quantized / rounded
        return [linear(x, w, b) for w, b in zip(ws, biases)]
    shared = [w for w in ws if isinstance(w, CudaWeight) and w.act_q8]
    lead = x.shape[:-1]
    x2 = cp.ascontiguousarray(x, dtype=cp.float32).reshape(-1, x.shape[-1])
    n = x2.shape[0]
    gemm = all(not _gemv_gguf_takes(w, n) for w in shared)     # prefill: dequantization + cuBLAS
    if len(shared) < 2 or not (0 < n <= QUANT_GEMV_MAX_BATCH or gemm) or not _aligned16(x2) \
            or any(w.cols != x2.shape[1] for w in shared):
        return [linear(x, w, b) for w, b in zip(ws, biases)]
    if gemm:
        x16 = quantize_x(x2, half=True)

        def launch(w, b, out):
            _gemm(x2, w, b, out, x16=x16)
    else:
        if kquant_joinable(ws, n):
            return _linears_joined(n, ws, biases, launch_gemv_kquant3, *quantize_x(x2), lead=lead)
        if nt := kquant_mma_joinable(ws, n):
            return _linears_joined(n, ws, biases, launch_gemv_kquant_mma3, quantize_x_q8k(x2), lead=lead, nt=nt)
        on_mma = [gguf_mma_tiles(w, n) > 0 for w in shared]
        xqd = quantize_x(x2) if not all(on_mma) else None
        xk = quantize_x_q8k(x2) if any(on_mma) else None

        def launch(w, b, out):
            _gemv_gguf(x2, w, b, out, xqd=xqd, xk=xk)
    outs = []
    for w, b in zip(ws, biases):
        if isinstance(w, CudaWeight) and w.act_q8:
            out = cp.empty((n, w.rows), dtype=cp.float32)
            launch(w, None if b is None else cp.ascontiguousarray(b, dtype=cp.float32), out)
            outs.append(out.reshape(lead + (w.rows,)))
        else:
            outs.append(linear(x, w, b))
    return outs


def _linears_joined(n: int, ws, biases, launch, *xquant, lead=None, **kw):
    """linears of n rows over joinable weights in one launch (launch_gemv_kquant3 with the rows' int8
    blocks of 32, or launch_gemv_kquant_mma3 with their blocks of 256); lead: the outputs' leading
    shape where x had more than two dimensions."""
    import cupy as cp

    outs = [cp.empty((n, w.rows), dtype=cp.float32) for w in ws]
    biases = [None if b is None else cp.ascontiguousarray(b, dtype=cp.float32) for b in biases]
    launch(ws, *xquant, biases, outs, n, **kw)
    return outs if lead is None else [o.reshape(lead + (w.rows,)) for o, w in zip(outs, ws)]


def _vec4(a) -> bool:
    """A float32 [N, K] array (row stride allowed) the kernels may load 16 bytes at a time."""
    return a.strides[1] == 4 and a.strides[0] % 16 == 0 and _aligned16(a)


def _silu_mul16(gate, up, w: CudaWeight, vec4: bool):
    """silu(gate) * up as the 16-bit input of w's GEMM, as _gemm would round silu_mul's output:
    to w's type (fp16 / bf16 weights), by the activation quantizer (int8 activations), else to fp16;
    vec4: gate and up may be loaded 16 bytes at a time (_vec4)."""
    from .elementwise_cuda import silu_mul, silu_mul_h16

    if w.is_dense or not w.act_q8:
        return silu_mul_h16(gate, up, w.qtype if w.is_dense else "F16")
    if vec4:
        return quantize_x(gate, up=up, half=True)
    return quantize_x(silu_mul(gate, up), half=True)


@cuda_op("silu_mul_linear")
def silu_mul_linear(gate, up, w, out=None):
    """linear(silu_mul(gate, up), w): gate, up [N, I] float32 (column views of one gate_up output
    allowed). Quantized weights: with int8 activations (batch <= 32) silu(gate) * up is computed
    by the activation quantizer; with fp32 activations on short rows (batch <= 8) by the GEMV as it
    loads them (the same float32 expression as silu_mul, so the same result). Past the GEMVs (the
    GEMM of a prefill) silu_mul is written straight as the GEMM's 16-bit input (_silu_mul16),
    without the float32 copy. Otherwise silu_mul, then linear."""
    import cupy as cp

    from .elementwise_cuda import silu_mul

    n, k = gate.shape
    fits = isinstance(w, CudaWeight) and k == w.cols and 0 < n and gate.shape == up.shape \
        and gate.dtype == up.dtype == cp.float32 \
        and (out is None or (out.shape == (n, w.rows) and out.dtype == cp.float32 and out.flags.c_contiguous))
    if not fits:
        return linear(silu_mul(gate, up), w, out=out)
    out = cp.empty((n, w.rows), dtype=cp.float32) if out is None else out
    gemm = not _gemv_gguf_takes(w, n) if w.is_gguf else gemm_batch(w, n)
    vec4 = _vec4(gate) and _vec4(up)
    if gemm:
        _gemm(gate, w, None, out, x16=_silu_mul16(gate, up, w, vec4))
    elif w.is_gguf and w.act_q8 and vec4:
        _gemv_gguf(gate, w, None, out, up=up)
    elif w.is_gguf and not w.act_q8 and n <= GEMV_MAX_BATCH and vec4 \
            and (cfg := weight_f32_gemv_config(w, n)).kind == "lanes":
        launch_gemv_f32(w, gate, None, out, n, cfg, up=up)
    else:
        linear(silu_mul(gate, up), w, out=out)
    return out


@cuda_op("get_rows")
def get_rows(w, ids, out=None):
    """Rows ids of w as float32 [N, cols] (embedding lookup; ids int32/int64, clamped to range)."""
    import cupy as cp

    ids = cp.asarray(ids)
    if ids.dtype not in (cp.int32, cp.int64):
        ids = ids.astype(cp.int64)
    ids = cp.ascontiguousarray(ids).reshape(-1)
    if not isinstance(w, CudaWeight):
        y = cp.asarray(w, dtype=cp.float32)[ids]
        if out is None:
            return y
        out[...] = y
        return out
    n = ids.size
    if out is None:
        out = cp.empty((n, w.cols), dtype=cp.float32)
    if n == 0:
        return out
    idx64 = ids.dtype == cp.int64
    if w.qtype == "FP8":      # (FP8 embeddings are rare: checkpoints keep them BF16)
        codes = w.data[ids]
        scales = cp.repeat(w.scales[ids], FP8_GROUP, axis=1)[:, :w.cols] / FP8_SCALE_FACTOR
        out[...] = cp.asarray(E4M3_VALUES)[codes] * scales
    elif w.qtype == "NVFP4":
        dequant_nvfp4(w, 0, n, out, ids=cp.clip(ids, 0, w.rows - 1).astype(cp.int32))
    elif w.is_dense:
        fn = _get_rows_dense(w.qtype, idx64)
        fn((grid_blocks(n * w.cols, 256, 8192),), (256,),
           (w.data, np.int32(w.rows), np.int32(w.cols), ids, np.int32(n), out))
    else:
        fn = _dequant(w.kernel_qtype, "long long" if idx64 else "int")
        fn((grid_blocks(n * (w.cols // 32), 256, 8192),), (256,),
           (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), ids, np.int32(n), np.int32(w.cols), out))
    return out

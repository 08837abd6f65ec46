"""Weights on the GPU in their stored format, and the matrix products that read them.

`prepare_weight` uploads a QTensor: 2-D F16/BF16 stay dense (bf16 as uint16 bits), GGUF
block types stay raw uint8 blocks [rows, bytes_per_row] (and note whether their activations are
quantized to int8, quant/act_q8.py), 1-D tensors become float32.
`linear(x [N, K] float32, w)` -> [N, rows] float32:
  - N <= 8: GEMV kernels reading the stored weights (gemv.cu; quantized: gemv_gguf.cu with int8
    activations, gemv_gguf_f32.cu with fp32 activations);
  - quantized weights, N <= 32: the same GEMV over column tiles of 8 (a weight read per tile
    still beats dequantizing the whole matrix); Q4_K / Q5_K / Q6_K at N 3-64 on int8 tensor cores
    (gemv_kquant_mma.cu);
  - otherwise cuBLAS (fp16/bf16 inputs, fp32 output): activations cast to the weight dtype;
    quantized weights dequantized to fp16 in row tiles first (dequant.cu).
`get_rows(w, ids)` -> [N, cols] float32: the embedding lookup.
CuPy is imported lazily: importing this module needs only NumPy."""
from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..quant.act_q8 import uses_q8
from ..quant.qtensor import QTensor
from .cublas_graph import gemm_ex
from .kernels import cuda_op, has_tensor_cores, kernel, num_sms

# GGUF block types the kernels read: ggml type id, values per block, bytes per block
GGUF_QTYPES = {
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ2_XXS": (16, 256, 66),
    "IQ3_XXS": (18, 256, 98), "IQ4_XS": (23, 256, 136),
}
# Q6_K is uploaded with each 210-byte block padded to 224 bytes, kernel type "Q6_KP" (pq::Q6_KP):
# every block then starts 16-byte aligned and the GEMVs read it with 16-byte loads instead of
# 2-byte aligned words and funnel shifts, for 6.7% more bytes (H200 figures: README).
PADDED_QTYPES = {"Q6_K": ("Q6_KP", 114, 224)}
KERNEL_TYPE_IDS = {**{q: v[0] for q, v in GGUF_QTYPES.items()}, **{p[0]: p[1] for p in PADDED_QTYPES.values()}}
PAD_Q6K = os.environ.get("POCKETCUPY_PAD_Q6K", "1") != "0"   # default of prepare_weight's pad ("0": raw, for comparisons)
DENSE_QTYPES = {"F16": 0, "BF16": 1}          # template argument WT of the dense kernels
GEMV_MAX_BATCH = 8
QUANT_GEMV_MAX_BATCH = 32
GEMV_THREADS = 128
DEQUANT_TILE_ELEMS = 32 << 20                  # fp16 scratch of the quantized GEMM path: 64 MiB
_PAD = 16     # bytes after the last block: the 2-byte-aligned loads may read 2 bytes past it

_F16, _F32, _BF16 = 2, 0, 14                   # cudaDataType
_CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT, _OP_N, _OP_T = 68, -1, 0, 1


@dataclass
class Q8Rows:
    """Activations [N, K] float32 whose int8 blocks were computed by the kernel that produced them
    (a fused norm): per 32 (quantize_x's layout) in xq / xds, which linears with int8 activations
    read, or per 256 (quantize_x_q8k's) in xk, which the K-quant tensor-core linears read."""
    x: Any
    xq: Any
    xds: Any
    xk: Any = None


@dataclass
class Half16Rows:
    """Activations [N, K] float32 with their fp16 / bf16 rounding (`qtype` "F16" / "BF16"),
    written by the kernel that produced them (a fused norm): the GEMM over such weights reads x16
    instead of casting x."""
    x: Any
    x16: Any
    qtype: str


@dataclass
class CudaWeight:
    qtype: str            # "F16", "BF16" or a GGUF block type name
    shape: tuple          # (rows, cols), torch order
    data: Any             # cupy: [rows, cols] float16 / uint16 (bf16 bits), or uint8 [rows, bytes_per_row]
    act_q8: bool = False  # GGUF blocks: the GEMV quantizes the activations to int8 (gemv_gguf.cu)
    padded: bool = False  # blocks padded as PADDED_QTYPES says (kernel_qtype names that layout)

    @property
    def rows(self) -> int:
        return int(self.shape[0])

    @property
    def cols(self) -> int:
        return int(self.shape[1])

    @property
    def is_dense(self) -> bool:
        return self.qtype in DENSE_QTYPES

    @property
    def kernel_qtype(self) -> str:
        """The block layout the kernels are instantiated for (KERNEL_TYPE_IDS)."""
        return PADDED_QTYPES[self.qtype][0] if self.padded else self.qtype

    @property
    def type_id(self) -> int:
        return KERNEL_TYPE_IDS[self.kernel_qtype]


def prepare_weight(t: QTensor, quant_activations: str = "auto", pad: bool | None = None):
    """QTensor -> CudaWeight (2-D) or float32 cupy array (1-D: norm weights, biases). pad: blocks
    of PADDED_QTYPES padded on upload (None: PAD_Q6K)."""
    import cupy as cp

    if len(t.shape) == 1:
        return cp.asarray(t.dequantize(), dtype=cp.float32)
    if len(t.shape) != 2:
        raise ValueError(f"prepare_weight: expected a 1-D or 2-D tensor, got shape {t.shape}")
    rows, cols = (int(s) for s in t.shape)
    if t.qtype == "F16":
        return CudaWeight("F16", (rows, cols), cp.asarray(np.ascontiguousarray(t.data, dtype=np.float16)))
    if t.qtype == "BF16":
        return CudaWeight("BF16", (rows, cols), cp.asarray(np.ascontiguousarray(t.data).view(np.uint16)))
    if t.qtype in GGUF_QTYPES:
        raw = np.ascontiguousarray(t.data, dtype=np.uint8).reshape(rows, -1)
        padded = (PAD_Q6K if pad is None else pad) and t.qtype in PADDED_QTYPES
        if padded:
            ts, pts = GGUF_QTYPES[t.qtype][2], PADDED_QTYPES[t.qtype][2]
            blocks = raw.reshape(rows, -1, ts)
            raw = np.zeros((rows, blocks.shape[1], pts), np.uint8)
            raw[:, :, :ts] = blocks
            raw = raw.reshape(rows, -1)
        n = raw.size
        buf = cp.zeros(n + _PAD, dtype=cp.uint8)
        buf[:n].set(raw.reshape(-1))
        return CudaWeight(t.qtype, (rows, cols), buf[:n].reshape(rows, raw.shape[1]),
                          uses_q8(t.qtype, cols, quant_activations), padded)
    # F32 and block types without kernels: fp16 (bf16 where fp16 would overflow)
    w = t.dequantize().astype(np.float32)
    if np.abs(w).max(initial=0.0) < 65000.0:
        return CudaWeight("F16", (rows, cols), cp.asarray(w.astype(np.float16)))
    from ..quant.dequant import f32_to_bf16

    return CudaWeight("BF16", (rows, cols), cp.asarray(f32_to_bf16(w)))


@cuda_op("concat_rows")
def concat_rows(ws):
    """One weight whose rows are the rows of ws in order (fused QKV / gate+up projections), or
    None when the parts differ in format or column count. Raw GGUF blocks are copied into one
    buffer with the same 16-byte tail padding prepare_weight leaves."""
    import cupy as cp

    if not ws or not all(isinstance(w, CudaWeight) for w in ws):
        return None
    qtype, cols, act_q8, padded = ws[0].qtype, ws[0].cols, ws[0].act_q8, ws[0].padded
    if any(w.qtype != qtype or w.cols != cols or w.act_q8 != act_q8 or w.padded != padded for w in ws):
        return None
    rows = sum(w.rows for w in ws)
    if ws[0].is_dense:
        return CudaWeight(qtype, (rows, cols), cp.concatenate([w.data for w in ws], axis=0))
    bpr = int(ws[0].data.shape[1])
    buf = cp.zeros(rows * bpr + _PAD, dtype=cp.uint8)
    r0 = 0
    for w in ws:
        buf[r0 * bpr:(r0 + w.rows) * bpr] = w.data.reshape(-1)
        r0 += w.rows
    return CudaWeight(qtype, (rows, cols), buf[:rows * bpr].reshape(rows, bpr), act_q8, padded)


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
    """"mma": tensor cores for fp16 / bf16 weights at batch 2-8 (sm_80+, rows of a multiple of 64
    weights; x rounded to the weight's type), so the batch costs no more than batch 1; "plain": the
    fp32-activation GEMV (batch 1, and elsewhere)."""
    return "mma" if 2 <= nb <= GEMV_MAX_BATCH and w.cols % 64 == 0 and has_tensor_cores() else "plain"


GGUF_MMA_QTYPES = ("Q4_K", "Q5_K", "Q6_K")          # gemv_kquant_mma.cu
# 8 tiles; past it dequantization + cuBLAS (H200, Q4_K 28672x4096 at batch 64: 170 us against 234;
# a Q4_K_M decode step at batch 64 12.9 ms against 16.7)
GGUF_MMA_MAX_BATCH = 64
KQUANT_QTYPES = ("Q4_K", "Q5_K", "Q6_K")            # gemv_kquant.cu
# past it the tensor-core kernel (H200, batch 2: Q4_K 28672x4096 2.25 against 1.92 TB/s; padded Q6_K
# 4096x14336 2.03 against 1.79, 49152x4096 2.53 against 1.93)
KQUANT_MAX_BATCH = {"Q4_K": 2, "Q5_K": 2, "Q6_K": 2}
KQUANT_SMALL_ROWS = 2048    # at most this many rows: one row per warp (more warps for short matrices)


def kquant_mma_applies(qtype: str, cols: int, nb: int, act_q8: bool) -> bool:
    """Whether a linear of this weight at batch nb runs on the int8 tensor-core K-quant kernel
    (past KQUANT_MAX_BATCH up to GGUF_MMA_MAX_BATCH, sm_80+, rows of whole 256-value blocks), whose activations
    are rounded per 256 values (act_q8.q8k_roundtrip) instead of per 32."""
    return (act_q8 and qtype in GGUF_MMA_QTYPES and KQUANT_MAX_BATCH[qtype] < nb <= GGUF_MMA_MAX_BATCH
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


def gemv_variant(w: CudaWeight, nb: int, dense_kind: str | None = None) -> str:
    """Readable name of the GEMV kernel linear() uses for batch nb (<= 8), e.g. gemv_q4_k_q8_r2_t128_bs1,
    gemv_q4_1_f32_lanes16_r2_bs1, gemv_q8_0_f32_xs_r4_bs2, gemv_bf16_bs1, gemv_bf16_mma_bs4;
    dense_kind: as gemv_dense's kind."""
    if nt := gguf_mma_tiles(w, nb):
        return f"gemv_{w.qtype.lower()}_q8mma_nt{nt}_bs{nb}"
    if w.act_q8:
        return f"gemv_{w.qtype.lower()}_q8_{q8_gemv_launch(w.qtype, w.rows, w.cols, nb).name()}_bs{nb}"
    if w.is_dense:
        kind = "_mma" if (dense_kind or dense_gemv_kind(w, nb)) == "mma" else ""
        return f"gemv_{w.qtype.lower()}{kind}_bs{nb}"
    cfg = f32_gemv_config(w.cols // 32, nb, w.qtype)
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
    Q6_K): R rows per warp, 4 warps a block, each lane `unroll` 64-value groups in flight at once."""
    kind: str
    rows: int
    threads: int = GEMV_THREADS
    unroll: int = 1

    def expr(self, tid: int, nb: int) -> str:
        if self.kind == "kquant":
            return f"gemv_kquant<{tid}, {nb}, {self.rows}, {self.unroll}>"
        return f"gemv_gguf<{tid}, {nb}, {self.rows}>"

    @property
    def source(self) -> str:
        return "gemv_kquant.cu" if self.kind == "kquant" else "gemv_gguf.cu"

    @property
    def block_threads(self) -> int:
        return self.threads if self.kind == "block" else GEMV_THREADS

    def rows_per_block(self) -> int:
        return self.rows * (1 if self.kind == "block" else GEMV_THREADS // 32)

    def name(self) -> str:
        if self.kind == "block":
            return f"r{self.rows}_t{self.threads}"
        return f"kq{self.rows}u{self.unroll}"


def q8_gemv_launch(qtype: str, rows: int, cols: int, nb: int) -> Q8Gemv:
    """The int8-activation GEMV for a [rows, cols] weight at batch nb (H200 sweeps,
    bench_decode_kernels.py). K-quants of whole super-blocks at batches 1-2 (KQUANT_MAX_BATCH): the
    64-value-group kernel with 2 rows per warp (Q4_K 28672x4096 at batch 1: 3.05 TB/s against 2.32
    for 2 rows per 128-thread block; padded Q6_K 4096x14336 2.69, raw 2.11 against 1.91; file bytes
    per second); on short matrices at batch 1
    Q4_K / Q5_K a row per warp and Q6_K the block kernel (1024x4096: 0.76 / 0.90 TB/s,
    latency-bound). Other batch-1 types: 2 rows on up to 128 threads. Larger batches: fewer threads
    per row (the activations of nb columns are reused from registers), 2 rows per warp on rows of
    <= 128 units, 4 rows per 2 warps beyond (1.3-1.9x over 4 rows on 128 threads at batch 4)."""
    units = cols // 32
    if qtype in KQUANT_QTYPES and cols % 256 == 0 and nb <= KQUANT_MAX_BATCH[qtype]:
        if rows > KQUANT_SMALL_ROWS or nb > 1:
            return Q8Gemv("kquant", 2, unroll=1)
        if qtype != "Q6_K":
            return Q8Gemv("kquant", 1, unroll=1)
    if nb == 1:
        return Q8Gemv("block", 2, gemv_threads(units))
    return Q8Gemv("block", 2, 32) if units <= 128 else Q8Gemv("block", 4, 64)


@functools.lru_cache(maxsize=None)
def _gguf_gemv(qtype: str, kqtype: str, cfg: Q8Gemv, nb: int):
    """The int8-activation GEMV for qtype weights in layout kqtype: one module per (type, source)
    holds the default launches of every batch; other launches (benchmark sweeps) compile on their own."""
    tid = KERNEL_TYPE_IDS[kqtype]
    defaults = [(q8_gemv_launch(qtype, r, c, b), b) for b in range(1, GEMV_MAX_BATCH + 1) for r in (1024, 4096)
                for c in (4096, 4128)]
    exprs = tuple(sorted({c.expr(tid, b) for c, b in defaults if c.source == cfg.source}))
    expr = cfg.expr(tid, nb)
    return kernel(cfg.source, expr, name_expressions=exprs if expr in exprs else (expr,))


# fp32-activation quantized GEMV (gemv_gguf_f32.cu): a launch shape per row length, by units of
# 32 weights per row.  Short rows (the projections of small models: K = 576 is 18 units) give
# each row group L lanes ("lanes"); long rows stage the activations in shared memory ("xs").
F32_SHORT_ROW_UNITS = 64          # rows of at most this many units: the lanes kernel
F32_LANES_SHORT = 16              # lanes per row group for rows of <= 32 units; 32 beyond
F32_XS_ROWS = 4                   # rows per block of the xs kernel
F32_XS_ROWS_HEAVY = {"Q3_K": 2}   # from batch 7 on: decoders whose R = 4 kernels spill registers


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


def f32_gemv_config(units: int, nb: int, qtype: str = "") -> F32Gemv:
    """The fp32-activation GEMV launch for rows of `units` 32-value units at batch nb (1..8).
    Long rows at batch 1 (H200 sweep, bench_decode_kernels.py): Q4_K / Q5_K a warp per 4 rows
    (1.9 vs 0.8 TB/s for xs:4 at 28672x4096), the rest xs with 8 rows (1.2-1.4x over 4)."""
    if units <= F32_SHORT_ROW_UNITS:
        return F32Gemv("lanes", 2 if nb <= 2 else 1, F32_LANES_SHORT if units <= 32 else 32)
    if nb == 1:
        return F32Gemv("lanes", 4, 32) if qtype in ("Q4_K", "Q5_K") else F32Gemv("xs", 2 * F32_XS_ROWS)
    return F32Gemv("xs", F32_XS_ROWS_HEAVY.get(qtype, F32_XS_ROWS) if nb >= 7 else F32_XS_ROWS)


def _default_f32_exprs(qtype: str, kqtype: str, kind: str) -> tuple[str, ...]:
    tid = KERNEL_TYPE_IDS[kqtype]
    cfgs = {c.expr(tid, nb, silu) for u in (32, 64, 128) for nb in range(1, GEMV_MAX_BATCH + 1)
            for c in [f32_gemv_config(u, nb, qtype)] if c.kind == kind for silu in (False, True)[:1 + (kind == "lanes")]}
    return tuple(sorted(cfgs))


@functools.lru_cache(maxsize=None)
def _gguf_gemv_f32(qtype: str, kqtype: str, kind: str, expr: str):
    """One compiled module per (qtype, layout, kind) holds every default launch shape of that kind;
    other shapes (benchmark sweeps) compile on their own."""
    exprs = _default_f32_exprs(qtype, kqtype, kind)
    return kernel("gemv_gguf_f32.cu", expr, name_expressions=exprs if expr in exprs else (expr,))


def launch_gemv_f32(w: "CudaWeight", x, bias, out, nb: int, cfg: F32Gemv, up=None) -> None:
    """out [nb, rows] = x [nb, K] @ w.T (+ bias) by the fp32-activation GEMV of shape cfg; x rows
    contiguous (x may have a row stride for the lanes kernel). up (lanes kernel only): the
    activations are silu(x) * up instead."""
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
    _gguf_gemv_f32(w.qtype, w.kernel_qtype, cfg.kind, cfg.expr(tid, nb, up is not None))(
        ((w.rows + rpb - 1) // rpb,), (threads,), head + (_null() if bias is None else bias, out))


def norm_linear_lanes(w, n: int) -> F32Gemv | None:
    """The lanes GEMV that normalises its own input (add_rms_norm_linear) for w at batch n: fp32-
    activation GGUF weights whose rows fit one warp's norm (<= 1024 values, the warp-per-row norm's
    rows) and take the lanes kernel, at batch 1 only (H200, SmolLM2-shaped Q8_0 decode graph: batch 1
    768 -> 694 us, batch 4 1,862 -> 2,328); None elsewhere."""
    from .elementwise_cuda import norm_warp_dim

    if not (isinstance(w, CudaWeight) and not w.is_dense and not w.act_q8 and n == 1
            and w.cols % 32 == 0 and norm_warp_dim(w.cols) is not None):
        return None
    cfg = f32_gemv_config(w.cols // 32, n, w.qtype)
    return cfg if cfg.kind == "lanes" else None


@cuda_op("add_rms_norm_linear")
def add_rms_norm_linear(x, residual, w_norm, eps: float, w, bias=None):
    """(linear(rms_norm(x + residual) * w_norm, w), x + residual) in one launch
    (gemv_gguf_f32_lanes_norm: each block normalises the input itself, with the warp-per-row norm's
    arithmetic); the new residual is a new array. None where norm_linear_lanes does not apply."""
    import cupy as cp

    from .elementwise_cuda import norm_warp_dim

    n = x.shape[0] if x.ndim == 2 else 0
    cfg = norm_linear_lanes(w, n)
    if cfg is None or x.shape != residual.shape or x.shape[1] != w.cols:
        return None
    x, residual = cp.ascontiguousarray(x, dtype=cp.float32), cp.ascontiguousarray(residual, dtype=cp.float32)
    w_norm = cp.ascontiguousarray(w_norm, dtype=cp.float32)
    bias = None if bias is None else cp.ascontiguousarray(bias, dtype=cp.float32)
    out, res_out = cp.empty((n, w.rows), cp.float32), cp.empty_like(residual)
    expr = (f"gemv_gguf_f32_lanes_norm<{w.type_id}, {n}, {cfg.rows_per_group}, {cfg.lanes}, "
            f"{norm_warp_dim(w.cols) // 32}>")
    rpb = cfg.rows_per_block()
    kernel("gemv_gguf_f32.cu", expr, name_expressions=(expr,))(
        ((w.rows + rpb - 1) // rpb,), (GEMV_THREADS,),
        (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), np.int32(w.cols), x, residual, w_norm,
         np.float32(eps), res_out, _null() if bias is None else bias, out))
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


def _null():
    return np.uint64(0)


def _grid(n: int, threads: int, cap: int = 1 << 16) -> int:
    return max(1, min((n + threads - 1) // threads, cap))


# --- launchers -------------------------------------------------------------------------------
def gemv_dense(x, w: CudaWeight, bias, out, kind: str | None = None) -> None:
    """out [n, rows] = x [n, K] @ w.T (+ bias) for fp16 / bf16 w, n <= 8; kind: "mma" or "plain"
    (None: dense_gemv_kind's choice)."""
    n, k = x.shape
    if (kind or dense_gemv_kind(w, n)) == "mma":
        kernel("gemv_dense_mma.cu", f"gemv_dense_mma<{DENSE_QTYPES[w.qtype]}>", name_expressions=_DENSE_MMA_EXPRS)(
            (-(-w.rows // 16),), (DENSE_MMA_THREADS,),
            (w.data, np.int32(w.rows), np.int32(k), x, np.int32(n), _null() if bias is None else bias, out))
        return
    r = rows_per_block(n)
    fn = _dense_gemv(w.qtype, n)
    unroll = 2 if r >= 4 else 4                            # U in gemv_dense
    fn(((w.rows + r - 1) // r,), (gemv_threads(-(-(k // 8) // unroll)),),
       (w.data, np.int32(w.rows), np.int32(k), x, _null() if bias is None else bias, out))


_DENSE_MMA_EXPRS = ("gemv_dense_mma<0>", "gemv_dense_mma<1>")
DENSE_MMA_THREADS = 256                                   # GM_WARPS * 32 in gemv_dense_mma.cu
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
        xq = xds = _null()
        xh = cp.empty((n, k), dtype=cp.float16)
    else:
        xq = cp.empty((n, k), dtype=cp.int8)
        xds = cp.empty((n, k // 32, 4), dtype=cp.float32)
        xh = _null()
    src = x if up is None else up
    fn = kernel("gemv_gguf.cu", f"quantize_q8_x<{str(up is not None).lower()}, {str(half).lower()}>",
                name_expressions=_QUANTIZE_EXPRS)
    fn((_grid(n4, 256, 1 << 30),), (256,), (x, np.int64(x.strides[0] // 4), src, np.int64(src.strides[0] // 4),
                                            np.int32(k), np.int64(n4), xq, xds, xh))
    return xh if half else (xq, xds)


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
    against 6.7, Q6_K 4096x14336 25.1-31.7 against 23.1)."""
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
    minb = 0
    if nt >= 4 and rows:
        blocks = -(-rows // 16)
        minb = 3 if 2 * sms < blocks <= 3 * sms else 0
    return (nt, 4, 1 if nt >= 8 or minb else 2, minb, 1)


def _kquant_mma_shape(groups: tuple[int, ...]) -> tuple[int, int, int, int, int, int, int]:
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
    MT]]]] (groups as _kquant_mma_shape completes them; full: _kquant_mma_full)."""
    tg, warps, u, minb, rw, acc, mt = groups
    tail = [rw, acc, int(full), mt]
    while tail and tail[-1] == (1, 0, 0, 1)[len(tail) - 1]:   # the kernel's defaults
        tail.pop()
    return ", ".join(str(v) for v in [nt, min(tg, nt), warps, u, minb] + tail)


def _kquant_mma_expr(kernel_qtype: str, nt: int, groups: tuple[int, ...], full: bool = False) -> str:
    return f"gemv_kquant_mma<{KERNEL_TYPE_IDS[kernel_qtype]}, {_kquant_mma_targs(nt, groups, full)}>"


_Q8K_EXPRS = ("quantize_q8k_x<false>", "quantize_q8k_x<true>")
_KQUANT_MMA_EXPRS = tuple(dict.fromkeys(   # kquant_mma_groups' launches, compiled as one module
    _kquant_mma_expr(kq, nt, _kquant_mma_shape(groups))
    for q in GGUF_MMA_QTYPES for kq in (q,) + ((PADDED_QTYPES[q][0],) if q in PADDED_QTYPES else ())
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
        (_grid(nsb * 32, 256, 1 << 30),), (256,),
        (x, np.int64(x.strides[0] // 4), src, np.int64(src.strides[0] // 4), np.int32(k), np.int64(nsb), xq, xd, xb))
    return xq, xd, xb


def launch_gemv_kquant_mma(w: "CudaWeight", xk, bias, out, n: int, nt: int, groups: tuple | None = None) -> None:
    """out [n, rows] = activations (quantize_x_q8k's xk) @ w.T (+ bias) on int8 tensor cores,
    nt tiles of 8 batch columns (gemv_kquant_mma.cu); groups: the launch shape (_kquant_mma_shape),
    default kquant_mma_groups."""
    groups = _kquant_mma_shape(groups or kquant_mma_groups(nt, w.cols, w.rows, w.qtype))
    expr = _kquant_mma_expr(w.kernel_qtype, nt, groups, _kquant_mma_full(n, nt, groups))
    fn = kernel("gemv_kquant_mma.cu", expr, name_expressions=_KQUANT_MMA_EXPRS if expr in _KQUANT_MMA_EXPRS else (expr,))
    fn((-(-w.rows // (16 * groups[4] * groups[6])),), (32 * groups[1],),
        (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), np.int32(w.cols), *xk, np.int32(n),
         _null() if bias is None else bias, out))


def launch_gemv_q8(w: "CudaWeight", xq, xds, bias, out, nb: int, cfg: Q8Gemv | None = None) -> None:
    """out [nb, rows] = activations (quantized by quantize_x) @ w.T (+ bias): the int8 DP4A GEMV
    launched as cfg (default: q8_gemv_launch)."""
    k = w.cols
    cfg = cfg or q8_gemv_launch(w.qtype, w.rows, k, nb)
    rpb = cfg.rows_per_block()
    if cfg.kind == "kquant" and (w.qtype not in KQUANT_QTYPES or k % 256):
        raise ValueError(f"gemv_kquant: no kernel for {w.qtype} rows of {k} (Q4_K / Q5_K / Q6_K, whole super-blocks)")
    _gguf_gemv(w.qtype, w.kernel_qtype, cfg, nb)(
        ((w.rows + rpb - 1) // rpb,), (cfg.block_threads,),
        (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), np.int32(k), xq, xds,
         _null() if bias is None else bias, out))


KQUANT3_ROWS = 2                  # rows per warp of the joined launch


def kquant_joinable(ws, nb: int) -> bool:
    """Whether gemv_kquant3 computes these 2-3 weights of one input in one launch at batch nb:
    int8-activation K-quants of whole super-blocks, each within its gemv_kquant batch bound."""
    return 2 <= len(ws) <= 3 and all(
        isinstance(w, CudaWeight) and w.act_q8 and w.qtype in KQUANT_QTYPES and w.cols % 256 == 0
        and w.cols == ws[0].cols and 1 <= nb <= KQUANT_MAX_BATCH[w.qtype] for w in ws)


def _joined_segments(ws, biases, outs, rows_per_block: int):
    """Block ends and (weight, bias, out) of each segment of a joined launch of 2-3 weights
    (gemv_kquant3, gemv_kquant_mma3): a missing third weight repeats the second with no blocks."""
    ends = list(itertools.accumulate(-(-w.rows // rows_per_block) for w in ws))
    segs = list(zip(ws, biases, outs))
    if len(segs) == 2:
        segs.append(segs[1])
        ends.append(ends[1])
    args = []
    for w, b, o in segs:
        args += [w.data, np.int64(w.data.shape[1]), np.int32(w.rows), _null() if b is None else b, o]
    return ends, ", ".join(str(w.type_id) for w, _, _ in segs), args


def launch_gemv_kquant3(ws, xq, xds, biases, outs, nb: int) -> None:
    """outs[i] [nb, ws[i].rows] = activations @ ws[i].T (+ biases[i]) for 2-3 K-quant weights
    (kquant_joinable) in one gemv_kquant3 launch."""
    ends, tids, seg_args = _joined_segments(ws, biases, outs, KQUANT3_ROWS * GEMV_THREADS // 32)
    expr = f"gemv_kquant3<{tids}, {nb}, {KQUANT3_ROWS}>"
    kernel("gemv_kquant.cu", expr, name_expressions=(expr,))((ends[-1],), (GEMV_THREADS,), (
        np.int32(ws[0].cols), xq, xds, np.int32(ends[0]), np.int32(ends[1]), *seg_args))


def kquant_mma_joinable(ws, n: int) -> int:
    """Tiles of the gemv_kquant_mma3 launch that computes these 2-3 weights of one input at batch n
    (all on the K-quant tensor-core kernel with the same tiles and columns), else 0."""
    if not 2 <= len(ws) <= 3 or not all(isinstance(w, CudaWeight) and w.cols == ws[0].cols for w in ws):
        return 0
    nts = {gguf_mma_tiles(w, n) for w in ws}
    return nts.pop() if len(nts) == 1 else 0


def launch_gemv_kquant_mma3(ws, xk, biases, outs, n: int, nt: int, groups: tuple | None = None) -> None:
    """launch_gemv_kquant3's join on the int8 tensor cores: 2-3 weights (kquant_mma_joinable) over
    the same activations (quantize_x_q8k's xk), one gemv_kquant_mma3 launch; groups as
    launch_gemv_kquant_mma takes them."""
    groups = _kquant_mma_shape(groups or kquant_mma_groups(nt, ws[0].cols, sum(w.rows for w in ws)))
    ends, tids, seg_args = _joined_segments(ws, biases, outs, 16 * groups[4] * groups[6])
    expr = f"gemv_kquant_mma3<{tids}, {_kquant_mma_targs(nt, groups, _kquant_mma_full(n, nt, groups))}>"
    kernel("gemv_kquant_mma.cu", expr, name_expressions=(expr,))((ends[-1],), (32 * groups[1],), (
        np.int32(ws[0].cols), *xk, np.int32(n), np.int32(ends[0]), np.int32(ends[1]), *seg_args))


def _gemv_gguf_takes(w: CudaWeight, n: int) -> bool:
    """Whether _gemv_gguf runs a batch of n rows of w: column tiles up to QUANT_GEMV_MAX_BATCH, or
    the K-quant tensor-core kernel (gguf_mma_tiles); else dequantization + cuBLAS."""
    return n <= QUANT_GEMV_MAX_BATCH or gguf_mma_tiles(w, n) > 0


def _gemv_gguf(x, w: CudaWeight, bias, out, up=None, xqd=None, xk=None) -> None:
    """Quantized GEMV: Q4_K / Q5_K / Q6_K past KQUANT_MAX_BATCH on int8 tensor cores (gguf_mma_tiles),
    else over column tiles of GEMV_MAX_BATCH; up: the activations are silu(x) * up
    (int8 activations only; the fp32 lanes kernel fuses it itself, see silu_mul_linear); xqd / xk:
    x already quantized (quantize_x / quantize_x_q8k)."""
    n, k = x.shape
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
            launch_gemv_f32(w, x[n0:], bias, out[n0:], nb, f32_gemv_config(k // 32, nb, w.qtype))


def _cast(x, qtype: str):
    """float32 -> fp16 / bf16 bits (uint16), same shape."""
    import cupy as cp

    y = cp.empty(x.shape, dtype=cp.float16 if qtype == "F16" else cp.uint16)
    name = "cast_f32_f16" if qtype == "F16" else "cast_f32_bf16"
    kernel("gemv.cu", name)((_grid(x.size, 256, 8192),), (256,), (x, y, np.int64(x.size)))
    return y


def _gemm_f32out(a16, w16, rows: int, dtype: int, out, col0: int = 0) -> None:
    """out[:, col0:col0+rows] = a16 [N, K] @ w16[:rows].T, fp16/bf16 inputs, fp32 accumulate and
    output (cuBLAS, column-major view: out^T = w16 @ a16^T); capturable in a CUDA graph."""
    n, k = a16.shape
    gemm_ex(_OP_T, _OP_N, rows, n, k, w16.data.ptr, dtype, k, a16.data.ptr, dtype, k,
            out.data.ptr + col0 * 4, _F32, out.shape[1], _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)


def _gemm_dense(x16, w: CudaWeight, out) -> None:
    """out = x16 @ w.T for fp16 / bf16 weights, x16 already rounded to the weight's type."""
    _gemm_f32out(x16, w.data, w.rows, _F16 if w.qtype == "F16" else _BF16, out)


def dequant_tile_rows(rows: int, k: int) -> int:
    """Rows of the quantized GEMM's fp16 scratch tile: the weight in equal tiles of at most
    DEQUANT_TILE_ELEMS values, rounded up to 128 rows. (The down projection's 2340-row tiles made
    cuBLAS take an sm_80 kernel: H200, 2048 tokens, 240 TFLOP/s against ~740 for 2048-row tiles.)"""
    per = -(-rows // -(-rows * k // DEQUANT_TILE_ELEMS))
    return min(rows, -(-per // 128) * 128)


def dequant_tile(w: CudaWeight, r0: int, nr: int, scratch) -> None:
    """scratch[:nr] = rows r0 .. r0 + nr - 1 of quantized w as fp16 (nr * cols < 2^31; the rows of
    w.data follow each other, as prepare_weight lays them out)."""
    _dequant(w.kernel_qtype, "tile")((-(-nr * (w.cols // 32) // 256),), (256,),
                                     (w.data[r0:], np.int32(nr), np.int32(w.cols), scratch))


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
        tile = dequant_tile_rows(w.rows, k)
        scratch = cp.empty((tile, k), dtype=cp.float16)
        for r0 in range(0, w.rows, tile):
            nr = min(tile, w.rows - r0)
            dequant_tile(w, r0, nr, scratch)
            _gemm_f32out(x16, scratch, nr, _F16, out, r0)
    if bias is not None:
        out += bias


@cuda_op("linear")
def linear(x, w, bias=None, out=None):
    """x [..., K] float32 (or Q8Rows / Half16Rows) @ w.T (+ bias) -> [..., rows] float32."""
    import cupy as cp

    xqd = xk = x16 = None
    if isinstance(x, Q8Rows):
        x, xqd, xk = x.x, (x.xq, x.xds) if x.xq is not None else None, x.xk
    elif isinstance(x, Half16Rows):
        x, x16 = x.x, (x.x16 if isinstance(w, CudaWeight) and w.qtype == x.qtype else None)

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
    if w.is_dense:
        if n <= GEMV_MAX_BATCH and k % 8 == 0:
            gemv_dense(x, w, bias, y)
        else:
            _gemm(x, w, bias, y, x16=x16 if x16 is not None and x16.shape == x.shape else None)
    elif _gemv_gguf_takes(w, n):
        _gemv_gguf(x, w, bias, y, xqd=xqd, xk=xk)
    else:
        _gemm(x, w, bias, y)
    return out if out.shape == lead + (w.rows,) else out.reshape(lead + (w.rows,))


@cuda_op("linears")
def linears(x, ws, biases=None):
    """[linear(x, w, b) for each weight]: the projections of one input (unfused QKV or gate/up of
    mixed formats); weights with int8 activations share one quantization of x."""
    import cupy as cp

    biases = [None] * len(ws) if biases is None else biases
    if isinstance(x, Q8Rows) and x.x.ndim == 2 and all(isinstance(w, CudaWeight) and w.cols == x.x.shape[1]
                                                       for w in ws):
        if x.xq is not None and kquant_joinable(ws, x.x.shape[0]):
            return _linears_joined(x.x, ws, biases, launch_gemv_kquant3, x.xq, x.xds)
        if x.xk is not None and (nt := kquant_mma_joinable(ws, x.x.shape[0])):
            return _linears_joined(x.x, ws, biases, launch_gemv_kquant_mma3, x.xk, nt=nt)
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
            return _linears_joined(x2, ws, biases, launch_gemv_kquant3, *quantize_x(x2), lead=lead)
        if nt := kquant_mma_joinable(ws, n):
            return _linears_joined(x2, ws, biases, launch_gemv_kquant_mma3, quantize_x_q8k(x2), lead=lead, nt=nt)
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


def _linears_joined(x2, ws, biases, launch, *xquant, lead=None, **kw):
    """linears of 2-D x over joinable weights in one launch (launch_gemv_kquant3 with x's int8
    blocks of 32, or launch_gemv_kquant_mma3 with its blocks of 256); lead: the outputs' leading
    shape where x had more than two dimensions."""
    import cupy as cp

    n = x2.shape[0]
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
    gemm = n > GEMV_MAX_BATCH if w.is_dense else not _gemv_gguf_takes(w, n)
    vec4 = _vec4(gate) and _vec4(up)
    if gemm:
        _gemm(gate, w, None, out, x16=_silu_mul16(gate, up, w, vec4))
    elif not w.is_dense and w.act_q8 and vec4:
        _gemv_gguf(gate, w, None, out, up=up)
    elif not w.is_dense and not w.act_q8 and n <= GEMV_MAX_BATCH and vec4 \
            and (cfg := f32_gemv_config(k // 32, n, w.qtype)).kind == "lanes":
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
    if w.is_dense:
        fn = _get_rows_dense(w.qtype, idx64)
        fn((_grid(n * w.cols, 256, 8192),), (256,),
           (w.data, np.int32(w.rows), np.int32(w.cols), ids, np.int32(n), out))
    else:
        fn = _dequant(w.kernel_qtype, "long long" if idx64 else "int")
        fn((_grid(n * (w.cols // 32), 256, 8192),), (256,),
           (w.data, np.int64(w.data.shape[1]), np.int32(w.rows), ids, np.int32(n), np.int32(w.cols), out))
    return out

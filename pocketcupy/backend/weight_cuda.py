"""Weights on the GPU in their stored format: `prepare_weight` uploads a QTensor -- 2-D F16/BF16
stay dense (bf16 as uint16 bits), GGUF block types stay raw uint8 blocks [rows, bytes_per_row] (and
note whether their activations are quantized to int8, quant/act_q8.py), FP8 stays E4M3 codes with
their scales (gemv_fp8.cu) and NVFP4 E2M1 codes with theirs (gemv_nvfp4.cu; both BF16 where their
kernels cannot run), 1-D tensors become
float32 -- and `concat_rows` joins projections of one input. Also the activation wrappers a fused
kernel hands the linears (Q8Rows, Half16Rows). CuPy is imported lazily."""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..loader.gguf import GGML_TYPES
from ..quant.act_q8 import INT8_QTYPES, uses_q8
from ..quant.qtensor import QTensor
from .kernels import cuda_op, grid_blocks, has_tensor_cores, kernel, null_arg

# GGUF block types the kernels read (act_q8.INT8_QTYPES): ggml type id, values per block, bytes per block
GGUF_QTYPES = {name: (tid, qk, ts) for tid, (name, qk, ts) in GGML_TYPES.items() if name in INT8_QTYPES}
# Q6_K is uploaded re-laid, kernel type "Q6_KR" (pq::Q6_KR, gguf_units.cuh's block_at): a row's
# blocks in runs of 8, each run the blocks without their fp16 d (208 bytes: ql, qh, scales) and then
# their d's, the row rounded up to 16 bytes (rows of 8k blocks gain nothing). Every block then starts
# 16-byte aligned and the kernels read it with 16-byte loads instead of 2-byte aligned words and
# funnel shifts (H200 figures: README).
RELAID_QTYPES = {"Q6_K": ("Q6_KR", 115)}
KERNEL_TYPE_IDS = {**{q: v[0] for q, v in GGUF_QTYPES.items()}, **dict(RELAID_QTYPES.values())}
RELAY_Q6K = os.environ.get("POCKETCUPY_RELAY_Q6K", "1") != "0"   # default of prepare_weight's relay ("0": raw, for comparisons)
DENSE_QTYPES = {"F16": 0, "BF16": 1}          # template argument WT of the dense kernels
# "0": FP8 weights uploaded as BF16 (for comparisons; also where the FP8 kernels cannot run)
FP8_CODES = os.environ.get("POCKETCUPY_FP8_CODES", "1") != "0"
FP8_SCALE_FACTOR = 256.0    # gemv_fp8.cu reads a code as the fp16 of its value times 2^-8
# "0": NVFP4 weights uploaded as BF16 (for comparisons; also where the NVFP4 kernels cannot run)
NVFP4_CODES = os.environ.get("POCKETCUPY_NVFP4_CODES", "1") != "0"
_PAD = 16     # bytes after the last block: the 2-byte-aligned loads may read 2 bytes past it


@dataclass
class Q8Rows:
    """Activations [N, K] float32 whose int8 blocks were computed by the kernel that produced them
    (a fused norm): per 32 (quantize_x's layout) in xq / xds, which linears with int8 activations
    read, or per 256 (quantize_x_q8k's) in xk, which the K-quant tensor-core linears read.
    From a GEMV with a norm epilogue (linear_norm_cuda.linear_add_rms_norm) there are only the blocks
    (x is None) and xpart, the partial sums that give the blocks' norm scale."""
    x: Any
    xq: Any
    xds: Any
    xk: Any = None
    xpart: Any = None

    @property
    def shape(self) -> tuple:
        return self.x.shape if self.x is not None else self.xq.shape


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
    qtype: str            # "F16", "BF16", a GGUF block type name, "FP8" or "NVFP4"
    shape: tuple          # (rows, cols), torch order
    data: Any             # cupy: [rows, cols] float16 / uint16 (bf16 bits) / uint8 (E4M3), uint8 [rows, bytes_per_row],
                          # or NVFP4: uint8 [rows, cols / 2] as nvfp4_relaid_codes lays them
    act_q8: bool = False  # GGUF blocks: the GEMV quantizes the activations to int8 (gemv_gguf.cu)
    relaid: bool = False  # blocks re-laid as RELAID_QTYPES says (kernel_qtype names that layout)
    scales: Any = None    # FP8: float32 [rows, ceil(cols / 128)], times FP8_SCALE_FACTOR; NVFP4: uint8 E4M3
                          # codes [rows, cols / 16]
    row_scales: Any = None  # NVFP4: float32 [rows], the tensor's scale_2 times FP8_SCALE_FACTOR (per row, so
                            # that weights of different scale_2 join, concat_rows)

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
    def is_gguf(self) -> bool:
        return self.qtype in GGUF_QTYPES

    @property
    def kernel_qtype(self) -> str:
        """The block layout the kernels are instantiated for (KERNEL_TYPE_IDS)."""
        return RELAID_QTYPES[self.qtype][0] if self.relaid else self.qtype

    @property
    def type_id(self) -> int:
        return KERNEL_TYPE_IDS[self.kernel_qtype]


def q6k_relaid_rows(raw: np.ndarray) -> np.ndarray:
    """Q6_K rows [rows, nblk * 210] -> Q6_KR rows: runs of 8 blocks (the last may be shorter), each
    the blocks' first 208 bytes and then their d's; zeros to a multiple of 16 bytes."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 210)
    nblk = blocks.shape[1]
    out = np.zeros((rows, -(-nblk * 210 // 16) * 16), np.uint8)
    for r0 in range(0, nblk, 8):
        run = blocks[:, r0:r0 + 8]
        body = r0 * 210 + run.shape[1] * 208
        out[:, r0 * 210:body] = run[:, :, :208].reshape(rows, -1)
        out[:, body:(r0 + run.shape[1]) * 210] = run[:, :, 208:].reshape(rows, -1)
    return out


def nvfp4_relaid_codes(packed: np.ndarray) -> np.ndarray:
    """NVFP4 codes [rows, bytes] (value 2i in the low nibble of byte i; bytes a multiple of 4) -> the
    layout gemv_nvfp4.cu reads: each 4-byte word's codes c0..c7 as the nibbles c0 c2 c4 c6 c1 c3 c5 c7
    (nibble 0 first), so that one table lookup gives the even codes' fp16 and one the odd ones'. The
    NumPy reference of relay_nvfp4_codes, which prepare_weight runs on the device."""
    words = np.ascontiguousarray(packed, np.uint8).view("<u4")
    nib = [(words >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)]
    out = np.zeros_like(words)
    for p, j in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):
        out |= nib[j] << np.uint32(4 * p)
    return out.view(np.uint8)


def relay_nvfp4_codes(codes):
    """nvfp4_relaid_codes of a cupy uint8 array, in place on the device (gemv_nvfp4.cu)."""
    words = codes.reshape(-1).view(np.uint32)
    if words.size:
        kernel("gemv_nvfp4.cu", "relay_nvfp4_codes")((grid_blocks(words.size, 256, 8192),), (256,),
                                                      (words, np.int64(words.size)))
    return codes


def prepare_weight(t: QTensor, quant_activations: str = "auto", relay: bool | None = None):
    """QTensor -> CudaWeight (2-D) or float32 cupy array (1-D: norm weights, biases). relay: blocks
    of RELAID_QTYPES re-laid on upload (None: RELAY_Q6K)."""
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
        relaid = (RELAY_Q6K if relay is None else relay) and t.qtype in RELAID_QTYPES
        if relaid:
            raw = q6k_relaid_rows(raw)
        n = raw.size
        buf = cp.zeros(n + _PAD, dtype=cp.uint8)
        buf[:n].set(raw.reshape(-1))
        return CudaWeight(t.qtype, (rows, cols), buf[:n].reshape(rows, raw.shape[1]),
                          uses_q8(t.qtype, cols, quant_activations), relaid)
    if t.qtype == "FP8":
        if FP8_CODES and cols % 64 == 0 and has_tensor_cores():
            return CudaWeight("FP8", (rows, cols), cp.asarray(np.ascontiguousarray(t.data, dtype=np.uint8)),
                              scales=cp.asarray(np.asarray(t.scales, np.float32) * np.float32(FP8_SCALE_FACTOR)))
        from ..quant.minifloat_weights import fp8_to_bf16

        return CudaWeight("BF16", (rows, cols), cp.asarray(fp8_to_bf16(t)))
    if t.qtype == "NVFP4":
        if NVFP4_CODES and cols % 64 == 0 and has_tensor_cores():
            codes = relay_nvfp4_codes(cp.asarray(np.ascontiguousarray(t.data, np.uint8)))
            return CudaWeight("NVFP4", (rows, cols), codes,
                              scales=cp.asarray(np.ascontiguousarray(t.scales, np.uint8)),
                              row_scales=cp.full(rows, t.scale_2 * FP8_SCALE_FACTOR, dtype=cp.float32))
        from ..quant.minifloat_weights import nvfp4_to_bf16

        return CudaWeight("BF16", (rows, cols), cp.asarray(nvfp4_to_bf16(t)))
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
    qtype, cols, act_q8, relaid = ws[0].qtype, ws[0].cols, ws[0].act_q8, ws[0].relaid
    if any(w.qtype != qtype or w.cols != cols or w.act_q8 != act_q8 or w.relaid != relaid for w in ws):
        return None
    rows = sum(w.rows for w in ws)
    if ws[0].is_dense:
        return CudaWeight(qtype, (rows, cols), cp.concatenate([w.data for w in ws], axis=0))
    if qtype in ("FP8", "NVFP4"):
        def joined(field):
            parts = [getattr(w, field) for w in ws]
            return None if parts[0] is None else cp.concatenate(parts, axis=0)

        return CudaWeight(qtype, (rows, cols), joined("data"), scales=joined("scales"), row_scales=joined("row_scales"))
    bpr = int(ws[0].data.shape[1])
    buf = cp.zeros(rows * bpr + _PAD, dtype=cp.uint8)
    r0 = 0
    for w in ws:
        buf[r0 * bpr:(r0 + w.rows) * bpr] = w.data.reshape(-1)
        r0 += w.rows
    return CudaWeight(qtype, (rows, cols), buf[:rows * bpr].reshape(rows, bpr), act_q8, relaid)


def joined_block_ends(ws, rows_per_block: int) -> list[int]:
    """The cumulative block counts of a joined launch over weights `ws`: each weight's rows rounded up
    to whole blocks of their own."""
    return list(itertools.accumulate(-(-w.rows // rows_per_block) for w in ws))


def joined_segments(ws, biases, outs, rows_per_block: int):
    """Block ends and (weight, bias, out) of each segment of a joined launch of 2-3 weights
    (gemv_kquant3, gemv_kquant_mma3): a missing third weight repeats the second with no blocks."""
    ends = joined_block_ends(ws, rows_per_block)
    segs = list(zip(ws, biases, outs))
    if len(segs) == 2:
        segs.append(segs[1])
        ends.append(ends[1])
    args = []
    for w, b, o in segs:
        args += [w.data, np.int64(w.data.shape[1]), np.int32(w.rows), null_arg() if b is None else b, o]
    return ends, ", ".join(str(w.type_id) for w, _, _ in segs), args

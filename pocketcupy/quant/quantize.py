"""Float weights -> raw GGUF blocks, in ggml's exact byte layouts (vectorised NumPy).

    quantize(x, "Q4_K")          -> uint8 (rows, bytes per row), what a GGUF file stores
    quantize_tensor(x, "Q8_0")   -> QTensor (the loader's type), dequantize() gives it back

Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (llama.cpp's quantize_row_*_ref,
byte-identical), Q4_K, Q5_K, Q6_K (quantize_row_q*_K_ref, see k_quants.py). No importance
matrix: the same path llama-quantize takes without --imatrix.

Matrices are processed in row chunks (bounded temporaries) on a thread pool. NumPy releases
the GIL inside its loops, which is enough for Q8_0 and the dense types; the K-quants' many small
array operations keep the GIL most of the time (2 threads: ~1.2x), so for many cores quantize
separate pieces in separate processes (scripts/make_synthetic_model.py does, with threads=1).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .dequant import f32_to_bf16
from .k_quants import f16_bytes, quantize_q4_k, quantize_q5_k, quantize_q6_k
from .qtensor import QTensor

_F32 = np.float32


def _roundf(v: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero), exactly: floor(|v|) + (frac >= 0.5), with the sign."""
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(f + (a - f >= _F32(0.5)), v)


def _absmax_signed(x: np.ndarray) -> np.ndarray:
    """The value with the largest magnitude in each row (first one on ties, as the C loops)."""
    idx = np.abs(x).argmax(axis=1)
    return x[np.arange(x.shape[0]), idx]


def _inv(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f`"""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, _F32(1) / np.where(d != 0, d, _F32(1)), _F32(0)).astype(np.float32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes: element j in the low nibble, j+16 in the high."""
    q = q.astype(np.uint8)
    return (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)


def _qh_bits(q: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit values -> (n, 4) bytes of the little-endian uint32 of their bit 4."""
    return np.packbits(((q.astype(np.uint8) >> 4) & 1), axis=1, bitorder="little")


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    amax = np.abs(x).max(axis=1)
    d = (amax / _F32(127)).astype(np.float32)
    q = _roundf(x * _inv(d)[:, None]).astype(np.int8)
    return np.concatenate([f16_bytes(d), q.view(np.uint8)], axis=1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    d = (_absmax_signed(x) / _F32(-8)).astype(np.float32)
    q = np.minimum(np.trunc(x * _inv(d)[:, None] + _F32(8.5)), 15)    # (int8_t) cast truncates
    return np.concatenate([f16_bytes(d), _pack_nibbles(q)], axis=1)


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    mn, mx = x.min(axis=1), x.max(axis=1)
    d = ((mx - mn) / _F32(15)).astype(np.float32)
    q = np.minimum(np.trunc((x - mn[:, None]) * _inv(d)[:, None] + _F32(0.5)), 15)
    return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_nibbles(q)], axis=1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    d = (_absmax_signed(x) / _F32(-16)).astype(np.float32)
    q = np.minimum(np.trunc(x * _inv(d)[:, None] + _F32(16.5)), 31)
    return np.concatenate([f16_bytes(d), _qh_bits(q), _pack_nibbles(q)], axis=1)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    mn, mx = x.min(axis=1), x.max(axis=1)
    d = ((mx - mn) / _F32(31)).astype(np.float32)
    q = np.trunc((x - mn[:, None]) * _inv(d)[:, None] + _F32(0.5))      # no MIN in the C code
    return np.concatenate([f16_bytes(d), f16_bytes(mn), _qh_bits(q), _pack_nibbles(q)], axis=1)


# name -> (elements per block, bytes per block, blocks (n, block) float32 -> (n, bytes) uint8)
BLOCK_QUANTIZERS = {
    "Q8_0": (32, 34, quantize_q8_0),
    "Q4_0": (32, 18, quantize_q4_0),
    "Q4_1": (32, 20, quantize_q4_1),
    "Q5_0": (32, 22, quantize_q5_0),
    "Q5_1": (32, 24, quantize_q5_1),
    "Q4_K": (256, 144, quantize_q4_k),
    "Q5_K": (256, 176, quantize_q5_k),
    "Q6_K": (256, 210, quantize_q6_k),
}
DENSE_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = DENSE_TYPES + tuple(BLOCK_QUANTIZERS)

# elements per chunk handed to one worker: big enough that the Python between NumPy calls (which
# holds the GIL: ~1 ms a chunk for Q4_K) is a few percent of the chunk, small enough to stay in
# cache; smaller when that leaves fewer than 4 chunks per thread
_CHUNK_ELEMENTS = 1 << 18
_MIN_CHUNK_ELEMENTS = 1 << 15


def row_bytes(qtype: str, cols: int) -> int:
    if qtype in DENSE_TYPES:
        return cols * (4 if qtype == "F32" else 2)
    block, size, _ = BLOCK_QUANTIZERS[qtype]
    return cols // block * size


def _dense(x: np.ndarray, qtype: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if qtype == "F32":
        return x
    if qtype == "F16":
        return x.astype(np.float16)
    return f32_to_bf16(x)


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def quantize(x: np.ndarray, qtype: str, threads: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Quantize the rows of `x` (any float dtype; last axis = a GGUF row, a multiple of the
    block size). Block types give uint8 shaped x.shape[:-1] + (bytes per row,); dense types give
    float32 / float16 / uint16 (bfloat16 bits) of x's shape. `out` may be given (block types)."""
    qtype = qtype.upper()
    if qtype not in QUANT_TYPES:
        raise ValueError(f"quantize: unsupported type {qtype!r} (supported: {', '.join(QUANT_TYPES)})")
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("quantize: needs at least one dimension")
    cols = x.shape[-1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols)
    rows = x2.shape[0]
    if qtype in DENSE_TYPES:
        conv = lambda a: _dense(a, qtype)
        res = np.empty(x2.shape, dtype={"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[qtype])
    else:
        block, size, fn = BLOCK_QUANTIZERS[qtype]
        if cols % block:
            raise ValueError(f"quantize: row length {cols} is not a multiple of the {qtype} block size {block}")
        rb = cols // block * size

        def conv(a):
            blocks = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, block)
            return fn(blocks).reshape(a.shape[0], rb)

        res = np.empty((rows, rb), dtype=np.uint8) if out is None else out.reshape(rows, rb)
    threads = _default_threads() if threads is None else max(1, int(threads))
    chunk = min(_CHUNK_ELEMENTS, max(_MIN_CHUNK_ELEMENTS, rows * cols // (4 * threads)))
    step = max(1, chunk // max(cols, 1))
    spans = [(r, min(rows, r + step)) for r in range(0, rows, step)]

    def work(span):
        r0, r1 = span
        res[r0:r1] = conv(x2[r0:r1])

    if threads == 1 or len(spans) == 1:
        for s in spans:
            work(s)
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(spans))) as pool:
            for _ in pool.map(work, spans):
                pass
    return res.reshape(lead + res.shape[1:])


def quantize_tensor(x: np.ndarray, qtype: str, threads: int | None = None) -> QTensor:
    """x (float, torch order: rows, cols) -> QTensor holding what a GGUF file would store."""
    qtype = qtype.upper()
    data = quantize(x, qtype, threads=threads)
    return QTensor(qtype, tuple(np.shape(x)), data)

"""Random GGUF weight blocks and the int8 activation blocks of the CUDA GEMV, in NumPy.

Types with a quantizer in the `gguf` package are made by quantizing random floats; the
others are random bytes whose fp16 scale fields are overwritten with small finite values
(every bit pattern of the remaining fields is a valid block)."""
from __future__ import annotations

import numpy as np

# ggml type id, values per block, bytes per block
QTYPES = {
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "IQ2_XXS": (16, 256, 66), "IQ2_XS": (17, 256, 74),
    "IQ3_XXS": (18, 256, 98), "IQ4_NL": (20, 32, 18), "IQ3_S": (21, 256, 110), "IQ2_S": (22, 256, 82),
    "IQ4_XS": (23, 256, 136), "IQ1_S": (19, 256, 50), "IQ1_M": (29, 256, 56),
}
GGUF_QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
# byte offsets of fp16 fields: scales (positive) and mins (either sign)
_SCALE_FIELDS = {
    "Q4_0": [0], "Q4_1": [0], "Q5_0": [0], "Q5_1": [0], "Q8_0": [0], "Q2_K": [80, 82],
    "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ2_XXS": [0],
    "IQ3_XXS": [0], "IQ4_XS": [0], "IQ2_XS": [0], "IQ1_S": [0], "IQ4_NL": [0], "IQ3_S": [0], "IQ2_S": [0],
    "IQ1_M": [],
}
_MIN_FIELDS = {"Q4_1": [2], "Q5_1": [2]}
IQ1_M_SCALES = 48       # IQ1_M: 4 uint16 scale words whose top nibbles, low word first, are the fp16 d


def random_blocks(rng: np.random.Generator, qtype: str, rows: int, cols: int,
                  use_quantizer: bool = True) -> np.ndarray:
    """uint8 [rows, cols / QK * TS] of valid random blocks."""
    _, qk, ts = QTYPES[qtype]
    assert cols % qk == 0
    if use_quantizer and qtype in GGUF_QUANTIZABLE:
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        w = rng.standard_normal((rows, cols), dtype=np.float32) * 0.05
        return np.ascontiguousarray(quantize(w, GGMLQuantizationType[qtype]))
    nblk = rows * cols // qk
    b = rng.integers(0, 256, size=(nblk, ts), dtype=np.uint8)
    for off in _SCALE_FIELDS[qtype]:
        b[:, off:off + 2] = rng.uniform(0.01, 0.05, nblk).astype(np.float16)[:, None].view(np.uint8)
    for off in _MIN_FIELDS.get(qtype, []):
        b[:, off:off + 2] = rng.uniform(-0.05, 0.05, nblk).astype(np.float16)[:, None].view(np.uint8)
    if qtype == "IQ1_M":
        d16 = rng.uniform(0.01, 0.05, nblk).astype(np.float16).view(np.uint16)
        for k in range(4):          # nibble k of d into the top nibble of word k (its high byte)
            hi = IQ1_M_SCALES + 2 * k + 1
            b[:, hi] = (b[:, hi] & 0x0F) | (((d16 >> (4 * k)) & 0xF) << 4).astype(np.uint8)
    return b.reshape(rows, cols // qk * ts)


def dequantize_blocks(qtype: str, blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
    from pocketcupy.quant.qtensor import QTensor

    return QTensor(qtype, (rows, cols), blocks).dequantize()


def quantize_q8_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror of the quantize_q8_x kernel: x [N, K] float32 -> int8 [N, K], float32 [N, K/32, 4]
    (d, d*sum32, d*sum of first 16, d*sum of last 16)."""
    n, k = x.shape
    xb = np.ascontiguousarray(x, dtype=np.float32).reshape(n, k // 32, 32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv).astype(np.int32)
    s_lo, s_hi = q[..., :16].sum(-1), q[..., 16:].sum(-1)
    d = d[..., 0]
    ds = np.stack([d, d * (s_lo + s_hi), d * s_lo, d * s_hi], axis=-1).astype(np.float32)
    return q.astype(np.int8).reshape(n, k), ds


def dequantize_q8_x(xq: np.ndarray, ds: np.ndarray) -> np.ndarray:
    n, k = xq.shape
    return (xq.reshape(n, k // 32, 32).astype(np.float64) * ds[..., :1]).reshape(n, k)

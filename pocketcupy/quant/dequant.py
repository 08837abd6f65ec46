"""NumPy dequantization of stored weights to float32 (the reference path)."""
from __future__ import annotations

import numpy as np


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def dequantize(t) -> np.ndarray:
    """QTensor -> float32 array of its logical shape. GGUF block types use the `gguf`
    package's reference dequantizers (gguf_dequant.py's faster, bit-identical ones where it has the
    type); FP8 and NVFP4 codes times their scales are rounded to BF16 first."""
    if t.qtype == "F32":
        return np.asarray(t.data, dtype=np.float32)
    if t.qtype == "F16":
        return np.asarray(t.data).astype(np.float32)
    if t.qtype == "BF16":
        return bf16_to_f32(np.asarray(t.data))
    if t.qtype == "FP8":      # rounded to BF16, as the checkpoint's dequantized weights are
        from .minifloat_weights import fp8_to_bf16

        return bf16_to_f32(fp8_to_bf16(t))
    if t.qtype == "NVFP4":    # likewise
        from .minifloat_weights import nvfp4_to_bf16

        return bf16_to_f32(nvfp4_to_bf16(t))
    from .gguf_dequant import FAST, dequantize_fast

    if t.qtype in FAST:
        return dequantize_fast(t.data, t.qtype, t.shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    qtype = GGMLQuantizationType[t.qtype]
    out = gguf_dequantize(np.asarray(t.data), qtype)
    return np.ascontiguousarray(out.reshape(t.shape), dtype=np.float32)

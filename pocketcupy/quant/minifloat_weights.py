"""FP8 (E4M3) and FP4 (E2M1) weight codes times their block scales -> BF16 bits, the arithmetic of
the FP8 / NVFP4 checkpoints loader/hf_quantized.py reads. Values are float32 products, then
rounded to BF16 half to even."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .dequant import f32_to_bf16
from .kv_quant import E4M3_VALUES

# E2M1 (sign, 2 exponent bits of bias 1, 1 mantissa bit; no infinities or NaN) of codes 0..15
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
_CHUNK_VALUES = 1 << 22     # float32 temporaries of ~16 MB at a time, whatever the tensor's size


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    """float32 values of OCP E4M3FN codes (uint8; 0x7F and 0xFF are NaN)."""
    return E4M3_VALUES[codes]


def e2m1_values(packed: np.ndarray) -> np.ndarray:
    """[rows, 2 * bytes] float32 values of FP4 E2M1 codes packed two a byte ([rows, bytes] uint8),
    value 2i in the low nibble of byte i (ModelOpt's NVFP4QTensor packing, vLLM's break_fp4_bytes)."""
    pairs = np.stack([packed & 0x0F, packed >> 4], axis=-1)
    return E2M1_VALUES[pairs.reshape(packed.shape[0], -1)]


def scaled_to_bf16(shape: tuple[int, int], decode_rows: Callable[[int, int], np.ndarray], scales: np.ndarray,
                   block: tuple[int, int], factor: float | None = None) -> np.ndarray:
    """BF16 bits (uint16, `shape`) of W[i, j] = v[i, j] * scales[i // br, j // bc] (* factor), where
    decode_rows(r0, r1) gives the float32 values v of rows r0..r1 and block = (br, bc). Computed
    a few rows at a time: an 8B model's FP8 weights as float32 all at once would take 32 GB."""
    rows, cols = shape
    br, bc = block
    scales = np.asarray(scales, np.float32)
    out = np.empty(shape, np.uint16)
    step = max(1, _CHUNK_VALUES // max(cols, 1))
    for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        grid = np.repeat(scales[np.arange(r0, r1) // br], bc, axis=1)[:, :cols]
        values = decode_rows(r0, r1) * grid
        if factor is not None:      # after the block scale: an E2M1 value times an E4M3 scale is exact
            values *= np.float32(factor)
        out[r0:r1] = f32_to_bf16(values)
    return out


def fp8_row_scales(scales: np.ndarray, block: tuple[int, int], shape: tuple[int, int], group: int) -> np.ndarray | None:
    """The scale grid of blocks `block` ([rows / br, cols / bc]) as one scale per row and `group`
    columns ([rows, ceil(cols / group)]), or None where a group would straddle two scales (bc
    neither a multiple of group nor the whole row)."""
    rows, cols = shape
    br, bc = block
    if bc % group and bc < cols:
        return None
    ng = -(-cols // group)
    col_block = np.minimum(np.arange(ng) * group // bc, scales.shape[1] - 1)
    return np.ascontiguousarray(np.asarray(scales, np.float32)[np.arange(rows) // br][:, col_block])


def nvfp4_to_bf16(t) -> np.ndarray:
    """BF16 bits of an NVFP4 QTensor (E2M1 codes times E4M3 scales per row and NVFP4_GROUP columns
    times the tensor's scale_2)."""
    from .qtensor import NVFP4_GROUP

    return scaled_to_bf16(t.shape, lambda r0, r1: e2m1_values(t.data[r0:r1]), e4m3_values(t.scales),
                          (1, NVFP4_GROUP), t.scale_2)


def fp8_to_bf16(t) -> np.ndarray:
    """BF16 bits of an FP8 QTensor (E4M3 codes times scales per row and FP8_GROUP columns)."""
    from .qtensor import FP8_GROUP

    return scaled_to_bf16(t.shape, lambda r0, r1: e4m3_values(t.data[r0:r1]), t.scales, (1, FP8_GROUP))

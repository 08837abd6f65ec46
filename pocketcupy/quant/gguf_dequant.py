"""Whole-tensor NumPy dequantizers of the common GGUF block types (Q4_0, Q4_1, Q8_0): the `gguf`
package's reference ones work 16 rows at a time (a Python call and several temporaries per group,
~2-3 s of every SmolLM2 load). Same float32 products and sums as the package's, so bit-identical."""
from __future__ import annotations

import numpy as np


def _scale(blocks: np.ndarray, byte: int) -> np.ndarray:
    """The float16 at bytes byte:byte+2 of each block, as float32 [n_blocks, 1]."""
    return blocks[:, byte:byte + 2].view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out [n_blocks, 2 * half] = the low nibbles of qs [n_blocks, half], then the high ones."""
    half = qs.shape[1]
    np.bitwise_and(qs, 0x0F, out=out[:, :half], casting="unsafe")
    np.right_shift(qs, 4, out=out[:, half:], casting="unsafe")
    return out


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    out = _nibbles(blocks[:, 2:], np.empty((len(blocks), 32), np.float32))
    out -= np.float32(8)    # (q - 8) is exact in float32, as the package's int8 difference is
    out *= _scale(blocks, 0)
    return out


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    out = _nibbles(blocks[:, 4:], np.empty((len(blocks), 32), np.float32))
    out *= _scale(blocks, 0)
    out += _scale(blocks, 2)
    return out


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    out = blocks[:, 2:].view(np.int8).astype(np.float32)
    out *= _scale(blocks, 0)
    return out


# type name -> (bytes per block, dequantizer of [n_blocks, bytes] uint8 blocks -> [n_blocks, 32] float32)
FAST = {"Q4_0": (18, _q4_0), "Q4_1": (20, _q4_1), "Q8_0": (34, _q8_0)}


def dequantize_fast(data: np.ndarray, qtype: str, shape: tuple) -> np.ndarray:
    """Raw blocks of a FAST type (uint8, any shape) -> float32 array of shape."""
    size, fn = FAST[qtype]
    return fn(np.ascontiguousarray(data, np.uint8).reshape(-1, size)).reshape(shape)

"""Quantized KV cache entries: each (token, KV head) row of head_dim values is stored as 8-bit codes
and one float32 scale (amax / code max), as vLLM's per-token quantized caches do.

    "int8": codes = round-half-even(x * (127 / amax)), the activation quantizer's arithmetic
            (act_q8.q8_roundtrip), value = code * amax / 127.
    "fp8":  OCP FP8 E4M3 (bias 7, max 448, no infinities) of x * (448 / amax), rounded to nearest
            even, value = e4m3(code) * amax / 448.

The NumPy backend stores and reads these (the reference the CUDA kernels will be checked against);
a row of zeros has scale 0 and codes 0."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
_CODE_MAX = {"int8": 127.0, "fp8": 448.0}


def _e4m3_values() -> np.ndarray:
    """The float32 value of every E4M3 code 0..255 (0x7F and 0xFF, NaN, as nan)."""
    codes = np.arange(256)
    exp, man = (codes >> 3) & 0xF, (codes & 7).astype(np.float64)
    mag = np.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * 2.0 ** (exp - 7))
    mag[(codes & 0x7F) == 0x7F] = np.nan
    return np.where(codes & 0x80, -mag, mag).astype(np.float32)


E4M3_VALUES = _e4m3_values()
_E4M3_POSITIVE = E4M3_VALUES[:0x7F]     # codes 0..0x7E, increasing


def round_e4m3(y: np.ndarray) -> np.ndarray:
    """y (float32, |y| <= 448) rounded to the nearest E4M3 value, ties to even: a quantum of 2^(e - 3)
    in the binade [2^e, 2^(e + 1)), 2^-9 below 2^-6 (subnormals)."""
    a = np.abs(y).astype(np.float32)
    _, e = np.frexp(a)
    quantum = np.ldexp(np.float32(1.0), np.maximum(e - 1, -6) - 3).astype(np.float32)
    r = np.minimum(np.rint(a / quantum) * quantum, np.float32(448.0))
    return np.copysign(r, y).astype(np.float32)


def encode_e4m3(v: np.ndarray) -> np.ndarray:
    """Codes (uint8) of values that are exactly E4M3 values (round_e4m3's output)."""
    code = np.searchsorted(_E4M3_POSITIVE, np.abs(v)).astype(np.uint8)
    return np.where(np.signbit(v) & (v != 0), code | np.uint8(0x80), code).astype(np.uint8)


def kv_row_bytes(dtype: str, head_dim: int, auto_bytes: int) -> int:
    """Bytes a (token, KV head) row of K or V takes: head_dim values of auto_bytes each (the
    backend's own cache type) for "auto", else head_dim codes and a float32 scale."""
    return head_dim * auto_bytes if dtype == "auto" else head_dim + 4


def check_kv_cache_dtype(dtype) -> str:
    if dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got {dtype!r}")
    return dtype


def quantize_kv(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """x [..., D] float32 -> (codes [..., D] int8 / uint8, scales [...] float32)."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.abs(x).max(axis=-1)
    code_max = np.float32(_CODE_MAX[dtype])
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, code_max / amax, np.float32(0.0)).astype(np.float32)
    y = x * inv[..., None]
    codes = np.rint(y).astype(np.int8) if dtype == "int8" else encode_e4m3(round_e4m3(y))
    return codes, (amax / code_max).astype(np.float32)


def dequantize_kv(codes: np.ndarray, scales: np.ndarray, dtype: str) -> np.ndarray:
    values = codes.astype(np.float32) if dtype == "int8" else E4M3_VALUES[codes]
    return values * scales[..., None]


@dataclass
class QuantKVCache:
    """One layer's K or V pages: codes [num_blocks, block_size, kv_heads, head_dim] and their scales
    [num_blocks, block_size, kv_heads]."""
    codes: np.ndarray
    scales: np.ndarray
    dtype: str

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: str) -> "QuantKVCache":
        return cls(np.zeros(shape, np.int8 if dtype == "int8" else np.uint8), np.zeros(shape[:-1], np.float32), dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape

    def store(self, slots, x: np.ndarray) -> None:
        """x [len(slots), kv_heads, head_dim] into the given slots (block * block_size + offset)."""
        codes, scales = quantize_kv(x, self.dtype)
        self.codes.reshape(-1, *self.shape[2:])[slots] = codes
        self.scales.reshape(-1, self.shape[2])[slots] = scales

    def rows(self, slots) -> np.ndarray:
        """The float32 values at the given slots: [len(slots), kv_heads, head_dim]."""
        return dequantize_kv(self.codes.reshape(-1, *self.shape[2:])[slots],
                             self.scales.reshape(-1, self.shape[2])[slots], self.dtype)

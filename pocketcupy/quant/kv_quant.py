"""Quantized KV cache entries: each (token, KV head) row of head_dim values is stored as codes and
float32 parameters, rounded half to even. Per row kind:

    "int8": one scale d = amax / 127; codes round(x * (127 / amax)) (the activation quantizer's
            arithmetic, act_q8.q8_roundtrip), value = code * d.
    "fp8":  one scale d = amax / 448; codes OCP FP8 E4M3 (bias 7, max 448, no infinities) of
            x * (448 / amax), value = e4m3(code) * d.
    "int4": per group of 32 values a scale and a minimum, s = (max - min) / 15: codes
            round((x - min) * (15 / (max - min))) in 0..15, two a byte (value 2i in the low nibble
            of byte i), value = code * s + min.

kv_cache_dtype picks the kinds of K and V: "int8" and "fp8" both, "k8v4" int8 keys and int4 values
(one scale per row for the keys, as the dot products with q need; the values' per-group minimum and
scale keep their error near fp8's on SmolLM2, where one symmetric scale per row moved its log-probs
by up to 0.88). The NumPy backend stores and reads these (the reference the CUDA kernels will be
checked against); a row of zeros has zero parameters and codes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KV_CACHE_DTYPES = ("auto", "int8", "fp8", "k8v4")
KV_KINDS = {"int8": ("int8", "int8"), "fp8": ("fp8", "fp8"), "k8v4": ("int8", "int4")}   # (K, V)
_CODE_MAX = {"int8": 127.0, "fp8": 448.0}
INT4_GROUP = 32


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


def kv_pair_bytes(dtype: str, head_dim: int, auto_bytes: int, values: bool = True) -> int:
    """Bytes a (token, KV head) takes in the K and V pages together (the K pages alone where not
    values): head_dim values of auto_bytes each (the backend's own cache type) for "auto", else each
    row's codes and parameters."""
    if dtype == "auto":
        return (1 + values) * head_dim * auto_bytes
    return sum(_code_bytes(kind, head_dim) + 4 * _num_params(kind, head_dim) for kind in KV_KINDS[dtype][:1 + values])


def _code_bytes(kind: str, head_dim: int) -> int:
    return head_dim // 2 if kind == "int4" else head_dim


def _num_params(kind: str, head_dim: int) -> int:
    """float32 parameters a row: its scale, or a scale and a minimum per group of INT4_GROUP."""
    return 2 * head_dim // INT4_GROUP if kind == "int4" else 1


def check_kv_head_dim(dtype: str, head_dim: int) -> None:
    if "int4" in KV_KINDS.get(dtype, ()) and head_dim % INT4_GROUP:
        raise ValueError(f"kv_cache_dtype: {dtype!r} quantizes values in groups of {INT4_GROUP}; this model's "
                         f"head_dim {head_dim} is not a multiple of it")


def check_kv_cache_dtype(dtype) -> str:
    if dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, got {dtype!r}")
    return dtype


def quantize_kv(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """x [..., D] float32 -> (codes [..., D] int8 / uint8, or [..., D / 2] uint8 for int4;
    parameters [..., P] float32: the scale, or int4's (scale, minimum) pairs of its D / 32 groups)."""
    x = np.asarray(x, dtype=np.float32)
    if kind == "int4":
        g = x.reshape(*x.shape[:-1], -1, INT4_GROUP)
        lo = g.min(axis=-1)
        span = g.max(axis=-1) - lo
        with np.errstate(divide="ignore"):
            inv = np.where(span > 0, np.float32(15.0) / span, np.float32(0.0)).astype(np.float32)
        n = np.clip(np.rint((g - lo[..., None]) * inv[..., None]), 0, 15).astype(np.uint8).reshape(x.shape)
        params = np.stack([span / np.float32(15.0), lo], axis=-1).astype(np.float32)
        return n[..., 0::2] | (n[..., 1::2] << 4), params.reshape(*x.shape[:-1], -1)
    amax = np.abs(x).max(axis=-1)
    code_max = np.float32(_CODE_MAX[kind])
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, code_max / amax, np.float32(0.0)).astype(np.float32)
    y = x * inv[..., None]
    codes = encode_e4m3(round_e4m3(y)) if kind == "fp8" else np.rint(y).astype(np.int8)
    return codes, (amax / code_max).astype(np.float32)[..., None]


def dequantize_kv(codes: np.ndarray, params: np.ndarray, kind: str) -> np.ndarray:
    if kind == "int4":
        n = np.stack([codes & 0xF, codes >> 4], axis=-1).astype(np.float32)
        g = n.reshape(*codes.shape[:-1], -1, INT4_GROUP)
        p = params.reshape(*params.shape[:-1], -1, 2)
        return (g * p[..., :1] + p[..., 1:]).reshape(*codes.shape[:-1], -1)
    return (E4M3_VALUES[codes] if kind == "fp8" else codes.astype(np.float32)) * params


@dataclass
class QuantKVCache:
    """One layer's K or V pages of one kind: codes [num_blocks, block_size, kv_heads, head_dim (int4:
    head_dim / 2)] and their parameters [num_blocks, block_size, kv_heads, P] (quantize_kv)."""
    codes: np.ndarray
    params: np.ndarray
    kind: str

    @classmethod
    def zeros(cls, shape: tuple[int, ...], kind: str, xp=np) -> "QuantKVCache":
        """Zeroed pages of `shape` in values; xp: the array module (cupy for device pages)."""
        codes = xp.zeros((*shape[:-1], _code_bytes(kind, shape[-1])), np.int8 if kind == "int8" else np.uint8)
        return cls(codes, xp.zeros((*shape[:-1], _num_params(kind, shape[-1])), np.float32), kind)

    @property
    def shape(self) -> tuple[int, ...]:
        """The pages' shape in values: [num_blocks, block_size, kv_heads, head_dim]."""
        return self.codes.shape[:-1] + (self.codes.shape[-1] * (2 if self.kind == "int4" else 1),)

    def _flat(self):
        return self.codes.reshape(-1, *self.codes.shape[2:]), self.params.reshape(-1, *self.params.shape[2:])

    def store(self, slots, x: np.ndarray) -> None:
        """x [len(slots), kv_heads, head_dim] into the given slots (block * block_size + offset)."""
        codes, params = self._flat()
        codes[slots], params[slots] = quantize_kv(x, self.kind)

    def rows(self, slots) -> np.ndarray:
        """The float32 values at the given slots: [len(slots), kv_heads, head_dim]."""
        codes, params = self._flat()
        return dequantize_kv(codes[slots], params[slots], self.kind)

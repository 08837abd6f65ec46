"""Rotary embedding frequencies, with linear, llama3 and yarn scaling."""
from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig, RopeScaling


def inv_freq(config: ModelConfig, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """float32 inverse frequencies for the rotary dims (rope_dim // 2 of them).
    `freq_factors` is GGUF's rope_freqs tensor (llama3 scaling baked into the file)."""
    d = config.rope_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
    s = config.rope_scaling
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float32)
    elif s.kind == "linear":
        inv = inv / s.factor
    elif s.kind == "llama3":
        low_wavelen = s.original_max_position / s.low_freq_factor
        high_wavelen = s.original_max_position / s.high_freq_factor
        wavelen = 2 * math.pi / inv
        smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        mid = (1 - smooth) * inv / s.factor + smooth * inv
        inv = np.where(wavelen > low_wavelen, inv / s.factor, inv)
        is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(is_mid, mid, inv)
    elif s.kind == "yarn":
        inv = _yarn(inv, d, config.rope_theta, s)
    return inv.astype(np.float32)


def _yarn(inv: np.ndarray, d: int, base: float, s: RopeScaling) -> np.ndarray:
    """transformers' _compute_yarn_parameters: the original frequencies where a dim turns more than
    beta_fast times over original_max_position, divided by factor where less than beta_slow, and a
    linear ramp between."""
    def dim(rotations):
        return d * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim(s.beta_fast), dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    keep = 1 - np.clip((np.arange(d // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    return inv / s.factor * (1 - keep) + inv * keep


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(s: RopeScaling) -> float:
    """What yarn multiplies cos and sin by (so the rotated q and k): 1 for the other scalings."""
    if s.kind != "yarn":
        return 1.0
    if s.attention_factor is not None:
        return s.attention_factor
    if s.mscale and s.mscale_all_dim:
        return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim)
    return yarn_mscale(s.factor)

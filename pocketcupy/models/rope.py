"""Rotary embedding frequencies, with linear and llama3 scaling."""
from __future__ import annotations

import math

import numpy as np

from ..config import ModelConfig


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
    return inv.astype(np.float32)

"""A weight kept in its stored format: dense (F32/F16/BF16), raw GGUF blocks, or FP8 codes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FP8_GROUP = 128     # columns an FP8 weight's scale covers (its scales are [rows, ceil(cols / 128)])


@dataclass
class QTensor:
    qtype: str            # "F32", "F16", "BF16" (uint16 bits), a GGUF block type name, or "FP8"
    shape: tuple          # logical shape, torch order (rows, cols)
    data: np.ndarray      # dense values, uint8 blocks shaped (rows, bytes_per_row), or E4M3 codes
    scales: np.ndarray | None = None   # FP8: float32 [rows, ceil(cols / FP8_GROUP)]

    @property
    def is_dense(self) -> bool:
        return self.qtype in ("F32", "F16", "BF16")

    def dequantize(self) -> np.ndarray:
        from .dequant import dequantize

        return dequantize(self)

"""A weight kept in its stored format: dense (F32/F16/BF16) or raw GGUF blocks."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class QTensor:
    qtype: str            # "F32", "F16", "BF16" (uint16 bits), or a GGUF block type name
    shape: tuple          # logical shape, torch order (rows, cols)
    data: np.ndarray      # dense values, or uint8 blocks shaped (rows, bytes_per_row)

    @property
    def is_dense(self) -> bool:
        return self.qtype in ("F32", "F16", "BF16")

    def dequantize(self) -> np.ndarray:
        from .dequant import dequantize

        return dequantize(self)

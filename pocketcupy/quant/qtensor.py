"""A weight kept in its stored format: dense (F32/F16/BF16), raw GGUF blocks, FP8 or NVFP4 codes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FP8_GROUP = 128     # columns an FP8 weight's scale covers (its scales are [rows, ceil(cols / 128)])
NVFP4_GROUP = 16    # columns an NVFP4 weight's scale covers (its scales are [rows, cols / 16])


@dataclass
class QTensor:
    qtype: str            # "F32", "F16", "BF16" (uint16 bits), a GGUF block type name, "FP8" or "NVFP4"
    shape: tuple          # logical shape, torch order (rows, cols)
    data: np.ndarray      # dense values, uint8 blocks shaped (rows, bytes_per_row), E4M3 codes, or
                          # NVFP4: E2M1 codes two a byte [rows, cols / 2], value 2i in the low nibble of byte i
    scales: np.ndarray | None = None   # FP8: float32 [rows, ceil(cols / FP8_GROUP)]; NVFP4: uint8 E4M3
                                       # codes [rows, cols / NVFP4_GROUP]
    scale_2: float = 1.0  # NVFP4: the tensor's scale (ModelOpt's weight_scale_2), times every value

    @property
    def is_dense(self) -> bool:
        return self.qtype in ("F32", "F16", "BF16")

    def dequantize(self) -> np.ndarray:
        from .dequant import dequantize

        return dequantize(self)

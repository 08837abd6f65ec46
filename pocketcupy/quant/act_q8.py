"""Activations of quantized linears: fp32, or int8 in blocks of 32 as llama.cpp's MMVQ does.

With int8 activations the GPU's GEMV dots int8 weights with int8 activations (__dp4a): 2-2.5x
faster on the long rows of 7B-class models (H200, `bench_decode_kernels.py`), at the cost of the
activation rounding llama.cpp has too. Short rows (small models, launch-bound) gain nothing from
it and pay a quantize launch per linear, so "auto" keeps them in fp32.

Both backends follow the same choice, made per weight when it is loaded: the NumPy reference
rounds x through `q8_roundtrip` (the CUDA quantizer's arithmetic) before its float32 matmul, so
each linear agrees to float rounding. Whole models agree less tightly than with fp32 activations:
an ulp of difference before the rounding moves a value by a whole int8 step (SmolLM2: mean
|difference| of log-probs 0.05 GPU vs CPU; 0.04 from ulp noise alone on the CPU)."""
from __future__ import annotations

import numpy as np

MODES = ("auto", "q8", "f32")
AUTO_MIN_COLS = 2048 + 1     # "auto": int8 activations for rows longer than 2048 values
# the GGUF block types the CUDA GEMVs read, with int8 activations (backend/weight_cuda.GGUF_QTYPES is
# made from it); any other goes to fp16 there, with float32 activations on both backends
INT8_QTYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                         "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS"})


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"quant_activations: must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def uses_q8(qtype: str, cols: int, mode: str) -> bool:
    """Whether a weight of this type and row length gets int8 activations under mode."""
    if check_mode(mode) == "f32" or qtype not in INT8_QTYPES or cols % 32:
        return False
    return mode == "q8" or cols >= AUTO_MIN_COLS


def q8_roundtrip(x: np.ndarray, block: int = 32) -> np.ndarray:
    """x [..., K] (K a multiple of block) -> float32 d * q per block: d = amax / 127,
    q = round-half-even(x * (127 / amax)), the CUDA kernel quantize_q8_x's float32 arithmetic."""
    x = np.asarray(x, dtype=np.float32)
    b = x.reshape(-1, block)
    amax = np.abs(b).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(b * inv)
    return (q * (amax / np.float32(127.0))).astype(np.float32).reshape(x.shape)


def q8k_roundtrip(x: np.ndarray) -> np.ndarray:
    """q8_roundtrip with one scale per 256 values (llama.cpp's Q8_K), the arithmetic of the CUDA
    quantize_q8k_x: the input of the K-quant tensor-core GEMV at batches 2-64 (gemv_kquant_mma.cu)."""
    return q8_roundtrip(x, 256)


class Q8ActWeight(np.ndarray):
    """A float32 weight (NumPy reference) whose linears take int8-rounded activations."""

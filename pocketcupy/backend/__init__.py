"""Backends: the NumPy reference (CPU) and CuPy + our kernels (CUDA)."""
from __future__ import annotations

import functools


NO_CUDA = "CuPy with a usable GPU is not available (pip install -r requirements-gpu.txt)"


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import cupy
    except Exception:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device: must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise ValueError(f"device: 'cuda' requested but {NO_CUDA}")
    return device

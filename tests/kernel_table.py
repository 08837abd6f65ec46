"""The row type of the CUDA kernel test table (tests/test_kernels.py).

Each op family contributes rows from a tests/kernel_rows_<family>.py module (a list named ROWS).
A row makes fresh random NumPy inputs (never zeros), computes the NumPy reference, runs the CUDA
op with its output buffer poisoned (NaN) beforehand, and compares by normalised error
||cuda - ref|| / ||ref|| against the row's bound."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class KernelRow:
    op: str                                        # the name registered with @cuda_op
    id: str                                        # variant, e.g. "gemv_q4k-bs4-4096x14336"
    make: Callable[[Any], dict]                    # numpy Generator -> numpy inputs
    ref: Callable[[dict], Any]                     # inputs -> numpy reference output(s)
    cuda: Callable[[dict, Callable], Any]          # (inputs, poison) -> cupy output(s); call
                                                   # poison(shape, dtype) to allocate the out buffer
    tol: float = 1e-5                              # bound on the normalised error

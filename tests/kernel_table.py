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
    tol: float | tuple = 1e-5                      # bound on the normalised error (a tuple: one an output)


def q8_blocks_dequantized(xq, xds):
    """int8 activation blocks (quantize_x's layout: xq [N, K], xds [N, K / 32, (d, d * sum, d * sum
    of the first 16, of the last 16)]) -> d * q as float32 [N, K], after checking the sums against
    the values."""
    import cupy as cp

    n, dim = xq.shape
    q = xq.astype(cp.float32).reshape(n, dim // 32, 32)
    cp.testing.assert_allclose(xds[..., 1], xds[..., 0] * q.sum(-1), rtol=1e-6, atol=1e-6)
    cp.testing.assert_allclose(xds[..., 2], xds[..., 0] * q[..., :16].sum(-1), rtol=1e-6, atol=1e-6)
    cp.testing.assert_allclose(xds[..., 3], xds[..., 0] * q[..., 16:].sum(-1), rtol=1e-6, atol=1e-6)
    return (q * xds[..., :1]).reshape(n, dim)


def q8k_blocks_dequantized(xq, xd, xb):
    """Per-256 int8 activations (quantize_x_q8k's layout: xq [K / 32, N, 32], xd [N, K / 256], xb
    [N, K / 32] the sums of each 32) -> d * q as float32 [N, K], after checking the sums against the
    values."""
    import cupy as cp

    chunks, n, _ = xq.shape
    dim = 32 * chunks
    q = xq.astype(cp.int32).transpose(1, 0, 2).reshape(n, dim)
    assert (xb.astype(cp.int32) == q.reshape(n, dim // 32, 32).sum(-1)).all(), "xb: not the sums of the int8 values"
    return (q.reshape(n, dim // 256, 256).astype(cp.float32) * xd[..., None]).reshape(n, dim)

"""Mixtures of experts on the CUDA backend: Qwen3-Next's softmax top-k router in one kernel
(cuda_src/moe_route.cu), and the routed experts, each a gated MLP over the rows routed to it. How
many rows each expert gets is read on the host, so a forward with experts cannot be captured in a
CUDA graph: such models run their decode steps eagerly (the runner asks the model's CAPTURABLE)."""
from __future__ import annotations

import numpy as np

from . import linear_cuda
from .elementwise_cuda import check_f32, row_view
from .kernels import cuda_op, kernel

ROUTE_MAX_TOP_K = 32        # a lane of the router's warp holds each pick


@cuda_op("moe_route_softmax")
def moe_route_softmax(logits, top_k: int, norm: bool):
    """NumpyOps.moe_route_softmax over logits [N, E] float32: (weights [N, top_k] float32, expert
    ids [N, top_k] int32)."""
    import cupy as cp

    check_f32("moe_route_softmax", logits)
    n, e = logits.shape
    if not 1 <= top_k <= min(e, ROUTE_MAX_TOP_K):
        raise ValueError(f"moe_route_softmax: top_k {top_k} must be between 1 and min(experts {e}, "
                         f"{ROUTE_MAX_TOP_K})")
    logits, stride = row_view(logits, e)
    weights, ids = cp.empty((n, top_k), cp.float32), cp.empty((n, top_k), cp.int32)
    if n:
        kernel("moe_route.cu", "moe_topk_softmax_f32")(
            (n,), (32,), (logits, np.int64(stride), np.int32(e), np.int32(top_k), np.int32(bool(norm)), weights, ids),
            shared_mem=4 * e)
    return weights, ids


@cuda_op("moe_experts")
def moe_experts(x, ids, weights, w_gate, w_up, w_down):
    """sum_j weights[:, j] * expert ids[:, j] of x [N, hidden] (NumpyOps.moe_experts): the (row,
    pick) pairs are sorted by expert on the host, the rows gathered once in that order, and each
    expert's gate / up and down linears run over its contiguous run of them."""
    import cupy as cp

    n, k = ids.shape
    flat = cp.asnumpy(ids).reshape(-1)
    order = np.argsort(flat, kind="stable")
    bounds = np.searchsorted(flat[order], np.arange(len(w_gate) + 1))
    order_dev = cp.asarray(order)
    xs = cp.ascontiguousarray(x[order_dev // k])
    ys = cp.empty((n * k, x.shape[1]), cp.float32)
    for e in np.flatnonzero(np.diff(bounds)).tolist():
        r0, r1 = int(bounds[e]), int(bounds[e + 1])
        gate, up = linear_cuda.linears(xs[r0:r1], [w_gate[e], w_up[e]])
        linear_cuda.silu_mul_linear(gate, up, w_down[e], out=ys[r0:r1])
    y = cp.empty_like(ys)
    y[order_dev] = ys
    return (y.reshape(n, k, -1) * weights[:, :, None]).sum(axis=1)

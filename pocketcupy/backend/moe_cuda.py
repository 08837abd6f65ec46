"""Mixtures of experts on the CUDA backend: Qwen3-Next's softmax top-k router and DeepSeek-V3's
grouped sigmoid one, a kernel each (cuda_src/moe_route.cu), and the routed experts, each a gated
MLP. Two ways to run the experts:

- per (row, pick) pair (cuda_src/moe_experts.cu): each pair's row through its expert's fp16 / bf16
  weights, found in a device table of the experts' addresses, then each row's picks summed. Nothing
  is read on the host, so decode steps with experts can be captured in CUDA graphs
  (experts_capturable; batches of up to PAIR_MAX_ROWS rows, every decode graph's, so a short
  prefill chunk takes it too). PAIR_GEMV = False turns it off.
- sorted by expert on the host: the pairs sorted by expert, the rows gathered once in that order,
  each expert's gate / up and down linears over its run of them (any weight format; prefill)."""
from __future__ import annotations

import numpy as np

from . import elementwise_cuda, linear_cuda
from .elementwise_cuda import check_f32, row_view
from .kernels import cuda_op, kernel
from .weight_cuda import DENSE_QTYPES, CudaWeight

ROUTE_MAX_TOP_K = 32        # a lane of the router's warp holds each pick
ROUTE_MAX_GROUPS = 32       # and each expert group's score (moe_route)
PAIR_GEMV = True            # the per-pair kernels (see above)
PAIR_MAX_ROWS = 256         # graphs.GRAPH_MAX_BATCH: longer batches (prefill) go sorted by expert
PAIR_WARPS = 4              # output rows a block of moe_pair_gemv16 (a warp each)
_PAIR_EXPRS = ("moe_pair_gemv16<0>", "moe_pair_gemv16<1>")
_tables: dict[int, tuple] = {}   # id(expert weight list) -> (the list, its device address table)
_pairable: dict[int, tuple] = {}   # id(a layer's gate list) -> (the list, whether its experts can go per pair)


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


@cuda_op("moe_route")
def moe_route(logits, bias, n_group: int, topk_group: int, top_k: int, norm: bool, scaling: float):
    """NumpyOps.moe_route (DeepSeek-V3's grouped sigmoid router) over logits [N, E] float32 with the
    score bias [E]: (weights [N, top_k] float32, expert ids [N, top_k] int32)."""
    import cupy as cp

    check_f32("moe_route", logits)
    n, e = logits.shape
    if not (1 <= n_group <= ROUTE_MAX_GROUPS and e % n_group == 0 and 1 <= topk_group <= n_group
            and 1 <= top_k <= min(e, ROUTE_MAX_TOP_K)):
        raise ValueError(f"moe_route: {e} experts in n_group {n_group} (at most {ROUTE_MAX_GROUPS}), topk_group "
                         f"{topk_group}, top_k {top_k} (at most {ROUTE_MAX_TOP_K}) have no CUDA kernel")
    logits, stride = row_view(logits, e)
    bias = cp.ascontiguousarray(cp.asarray(bias, dtype=cp.float32))
    weights, ids = cp.empty((n, top_k), cp.float32), cp.empty((n, top_k), cp.int32)
    if n:
        kernel("moe_route.cu", "moe_topk_sigmoid_group_f32")(
            (n,), (32,), (logits, np.int64(stride), bias, np.int32(e), np.int32(n_group), np.int32(topk_group),
                          np.int32(top_k), np.int32(bool(norm)), np.float32(scaling), weights, ids),
            shared_mem=8 * e)
    return weights, ids


def experts_capturable(w_gate, w_up, w_down) -> bool:
    """Whether moe_experts runs these experts per pair (nothing read on the host) at decode batches:
    PAIR_GEMV on, and fp16 or bf16 experts of one type and shape whose rows are multiples of 8 values
    (found once for each list: a layer's experts are hundreds of weights)."""
    lists = (w_gate, w_up, w_down)
    return PAIR_GEMV and _per_list(_pairable, w_gate, lambda: all(
        isinstance(w, CudaWeight) and w.is_dense and w.qtype == w_gate[0].qtype and w.shape == ws[0].shape
        and w.cols % 8 == 0 for ws in lists for w in ws))


def _per_list(cache: dict, ws: list, make):
    """make(), computed once for the list ws (kept alive beside its value, so its id stays its own)."""
    hit = cache.get(id(ws))
    if hit is None or hit[0] is not ws:
        hit = cache[id(ws)] = (ws, make())
    return hit[1]


def _table(ws):
    """The device table of the weights' addresses (uint64), made once for each list."""
    import cupy as cp

    return _per_list(_tables, ws, lambda: cp.asarray(np.array([w.data.data.ptr for w in ws], np.uint64)))


def _pair_gemv(ws, ids, x, x_div: int):
    """y [pairs, rows]: pair p's row of x (row p // x_div) times its expert's weight of ws."""
    import cupy as cp

    rows, cols = ws[0].shape
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    if x.data.ptr % 16:
        x = x.copy()
    y = cp.empty((len(ids), rows), cp.float32)
    expr = _PAIR_EXPRS[DENSE_QTYPES[ws[0].qtype]]
    kernel("moe_experts.cu", expr, _PAIR_EXPRS)(
        (-(-rows // PAIR_WARPS), len(ids)), (32 * PAIR_WARPS,),
        (_table(ws), ids, x, np.int64(cols), np.int32(x_div), y, np.int32(rows), np.int32(cols)))
    return y


def _pair_experts(x, ids, weights, w_gate, w_up, w_down):
    """moe_experts per (row, pick) pair, reading nothing on the host."""
    import cupy as cp

    n, k = ids.shape
    flat = cp.ascontiguousarray(ids, dtype=cp.int32).reshape(-1)
    act = elementwise_cuda.silu_mul(_pair_gemv(w_gate, flat, x, k), _pair_gemv(w_up, flat, x, k))
    y = _pair_gemv(w_down, flat, act, 1)
    hidden = y.shape[1]
    out = cp.empty((n, hidden), cp.float32)
    kernel("moe_experts.cu", "moe_combine_f32")(
        (-(-hidden // 256), n), (256,), (y, cp.ascontiguousarray(weights, dtype=cp.float32), out, np.int32(k),
                                         np.int32(hidden)))
    return out


@cuda_op("moe_experts")
def moe_experts(x, ids, weights, w_gate, w_up, w_down):
    """sum_j weights[:, j] * expert ids[:, j] of x [N, hidden] (NumpyOps.moe_experts): per pair
    where experts_capturable and N <= PAIR_MAX_ROWS; else the (row, pick) pairs are sorted by expert
    on the host, the rows gathered once in that order, and each expert's gate / up and down linears
    run over its contiguous run of them."""
    import cupy as cp

    if x.shape[0] <= PAIR_MAX_ROWS and experts_capturable(w_gate, w_up, w_down):
        return _pair_experts(x, ids, weights, w_gate, w_up, w_down)
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

"""CuPy launchers for Gated DeltaNet (cuda_src/gated_delta.cu): the causal conv with SiLU and the
gated delta rule over a flat batch of sequences, each with its conv and recurrent state at its slot
of the state arrays (state_slots.py). Prefill chunks and decode rows go in the same launches, a
sequence's tokens one after another (no chunked form yet: a prefill's tokens cost a serial step
each)."""
from __future__ import annotations

import numpy as np

from .elementwise_cuda import _cp, _out, check_f32, row_view
from .kernels import cuda_op, kernel

CONV_MAX_K = 8                              # gated_delta.cu's CONV_MAX_K
DELTA_ROWS = (1, 2, 4, 8, 16, 32, 64)       # R of gated_delta_rule_f32<R>: key heads of 4 R values
_DELTA_EXPRS = tuple(f"gated_delta_rule_f32<{r}>" for r in DELTA_ROWS)
DELTA_COLUMNS = 64                          # value columns a block of the recurrence (4 threads each)
_I32, _I64 = np.int32, np.int64


def _seq_arrays(slots, query_start):
    """The slots (int64) and query_start (int32) as device arrays."""
    cp = _cp()
    return cp.asarray(slots, dtype=cp.int64), cp.asarray(query_start, dtype=cp.int32)


@cuda_op("causal_conv1d_silu")
def causal_conv1d_silu(x, w, conv_states, slots, query_start, out=None):
    """SiLU of the depthwise causal conv of each sequence's rows of x [N, C] (a column view of a
    wider array is fine) with w [C, K], continuing from conv_states [S, C, K - 1] at its slot, which
    it replaces with its K - 1 latest inputs (NumpyOps.causal_conv1d_silu)."""
    cp = _cp()
    for name, a in (("x", x), ("w", w), ("conv_states", conv_states)):
        check_f32(f"causal_conv1d_silu {name}", a)
    n, c = x.shape
    k = w.shape[1]
    if w.shape[0] != c or not 1 <= k <= CONV_MAX_K or conv_states.shape[1:] != (c, k - 1):
        raise ValueError(f"causal_conv1d_silu: x {x.shape}, w {w.shape} and conv_states {conv_states.shape} "
                         f"disagree (kernel width at most {CONV_MAX_K})")
    if not conv_states.flags.c_contiguous:
        raise ValueError("causal_conv1d_silu: conv_states must be contiguous (it is updated in place)")
    x, stride = row_view(x, c)
    slots, qs = _seq_arrays(slots, query_start)
    out = _out(out, (n, c))
    if n and len(slots):
        kernel("gated_delta.cu", "causal_conv1d_silu_f32")(
            ((c + 127) // 128, len(slots)), (128,),
            (x, _I64(stride), cp.ascontiguousarray(w), conv_states, slots, qs, out, _I32(c), _I32(k)))
    return out


@cuda_op("gated_delta_rule")
def gated_delta_rule(q, k, v, b, a, a_log, dt_bias, states, slots, query_start, out=None):
    """The gated delta rule (NumpyOps.gated_delta_rule): q, k [N, Hk, Dk], v [N, Hv, Dv], b, a [N,
    Hv] (views of wider rows are fine), a_log, dt_bias [Hv]; states [S, Hv, Dk, Dv] float32 updated
    in place at each sequence's slot. Returns [N, Hv, Dv]. Dk must be 4 R for an R of DELTA_ROWS."""
    cp = _cp()
    n, hk, dk = q.shape
    hv, dv = v.shape[1:]
    for name, t in (("q", q), ("k", k), ("v", v), ("b", b), ("a", a), ("states", states)):
        check_f32(f"gated_delta_rule {name}", t)
    if dk % 4 or dk // 4 not in DELTA_ROWS:
        raise ValueError(f"gated_delta_rule: key head dim {dk} is not 4 x one of {DELTA_ROWS}")
    if k.shape != q.shape or hv % hk or b.shape != (n, hv) or a.shape != (n, hv) \
            or states.shape[1:] != (hv, dk, dv) or not states.flags.c_contiguous:
        raise ValueError(f"gated_delta_rule: q {q.shape}, k {k.shape}, v {v.shape}, b {b.shape}, a {a.shape} "
                         f"and states {states.shape} disagree (states contiguous)")
    q, qs = row_view(q, hk * dk)
    k, ks = row_view(k, hk * dk)
    v, vs = row_view(v, hv * dv)
    b, bs = row_view(b, hv)
    a, as_ = row_view(a, hv)
    slots, qstart = _seq_arrays(slots, query_start)
    out = _out(out, (n, hv, dv))
    if not n or not len(slots):
        return out
    qn, kn = cp.empty((n, hk, dk), cp.float32), cp.empty((n, hk, dk), cp.float32)
    beta, decay = cp.empty((n, hv), cp.float32), cp.empty((n, hv), cp.float32)
    a_log, dt_bias = (cp.ascontiguousarray(t, dtype=cp.float32) for t in (a_log, dt_bias))
    kernel("gated_delta.cu", "gdn_prepare_f32")(
        (n, 2 * hk + 1), (32,), (q, _I64(qs), k, _I64(ks), b, _I64(bs), a, _I64(as_), a_log, dt_bias, qn, kn,
                                 beta, decay, _I32(hk), _I32(dk), _I32(hv)))
    cols = min(-(-dv // 8) * 8, DELTA_COLUMNS)
    kernel("gated_delta.cu", f"gated_delta_rule_f32<{dk // 4}>", _DELTA_EXPRS)(
        (-(-dv // cols), hv, len(slots)), (4 * cols,),
        (qn, kn, v, _I64(vs), beta, decay, states, slots, qstart, out, _I32(hk), _I32(hv), _I32(dv)))
    return out

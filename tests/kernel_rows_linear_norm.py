"""Kernel-table rows for linear_add_rms_norm (linear_norm_cuda.py): the batch-1 K-quant or Q8_0 GEMV
whose epilogue adds the residual and writes the RMSNorm's int8 blocks without the norm's scale, and the
linears that read those blocks (gemv_kquant3, gemv_kquant_split, gemv_kquant and gemv_gguf taking
the scale from the partial sums). Reference: float64 NumPy, the GEMV's input rounded to int8 per 32
(act_q8.q8_roundtrip), the normalised rows rounded the same way for the linears after it.
Tolerances: the residual is an exact integer dot product plus adds (~1e-6); the blocks and what the
linears make of them: an ulp of difference in h can move one value by a whole int8 step (~4e-4)."""
from __future__ import annotations

import numpy as np

from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.quant.act_q8 import q8_roundtrip
from pocketcupy.quant.qtensor import QTensor
from tests.gguf_blocks import random_blocks
from tests.kernel_table import KernelRow, q8_blocks_dequantized

F64 = np.float64
# the linears reading the norm: one gemv_kquant3 launch (q, k in Q4_K, v in Q6_K, rows ending inside
# a block), a Q8_0 weight (gemv_gguf), and at 4096 columns a Q4_K weight of more than 2048 rows
# (gemv_kquant_split)
JOINED = (("Q4_K", 40), ("Q4_K", 9), ("Q6_K", 9))


def _make(qtype: str, rows: int, cols: int, gated: bool, bias: bool):
    def make(rng):
        inp = {"qtype": qtype, "w": random_blocks(rng, qtype, rows, cols), "shape": (rows, cols),
               "x": rng.standard_normal((1, 2 * cols if gated else cols), dtype=np.float32),
               "res": rng.standard_normal((1, rows), dtype=np.float32),
               "w_norm": (1.0 + 0.1 * rng.standard_normal(rows)).astype(np.float32), "eps": 1e-5, "gated": gated,
               "feeds": [(q, r, random_blocks(rng, q, r, rows)) for q, r in JOINED + (("Q8_0", 67),)
                         + ((("Q4_K", 2080),) if rows == 4096 else ())]}
        if bias:
            inp["bias"] = rng.standard_normal(rows, dtype=np.float32)
        return inp
    return make


def _deq(qtype, rows, cols, blocks) -> np.ndarray:
    return QTensor(qtype, (rows, cols), blocks).dequantize().astype(F64)


def _ref(inp):
    ops, (rows, cols) = NumpyOps(), inp["shape"]
    x = inp["x"]
    if inp["gated"]:
        x = ops.silu_mul(x[:, :cols], x[:, cols:])
    y = q8_roundtrip(x).astype(F64) @ _deq(inp["qtype"], rows, cols, inp["w"]).T
    if "bias" in inp:
        y += inp["bias"]
    h = (y + inp["res"]).astype(np.float32)
    normed, _ = ops.add_rms_norm(h, np.zeros_like(h), inp["w_norm"], inp["eps"])
    xq = q8_roundtrip(normed).astype(F64)
    return (h, xq) + tuple(xq @ _deq(q, r, rows, b).T for q, r, b in inp["feeds"])


def _cuda(inp, poison):
    import cupy as cp

    from pocketcupy.backend import linear_cuda, linear_norm_cuda
    from pocketcupy.backend.weight_cuda import prepare_weight

    rows, cols = inp["shape"]
    w = prepare_weight(QTensor(inp["qtype"], (rows, cols), inp["w"]), "q8")
    feeds = [prepare_weight(QTensor(q, (r, rows), b), "q8") for q, r, b in inp["feeds"]]
    x = cp.asarray(inp["x"])
    x, up = (x[:, :cols], x[:, cols:]) if inp["gated"] else (x, None)
    res = cp.asarray(inp["res"])
    bias = cp.asarray(inp["bias"]) if "bias" in inp else None
    got = linear_norm_cuda.linear_add_rms_norm(x, w, res, cp.asarray(inp["w_norm"]), inp["eps"], feeds, up=up,
                                               bias=bias)
    assert got is not None, "linear_add_rms_norm: no one-launch form for this row"
    h, res_out = got
    assert res_out is res and h.x is None and h.xpart.shape == (rows // 32,)
    scale = 1.0 / np.sqrt(float(cp.asnumpy(h.xpart).astype(F64).sum()) / rows)
    joined = linear_cuda.linears(h, feeds[:3])
    return (res_out, q8_blocks_dequantized(h.xq, h.xds) * scale, *joined,
            *(linear_cuda.linear(h, f) for f in feeds[3:]))


ROWS = [KernelRow("linear_add_rms_norm", f"{q.lower()}-{rows}x{cols}{'-gated' if gated else ''}"
                  f"{'-bias' if bias else ''}", _make(q, rows, cols, gated, bias), _ref, _cuda,
                  (1e-5, 2e-3) + (3e-3,) * (5 if rows == 4096 else 4))
        for q, rows, cols, gated, bias in (("Q4_K", 4096, 4096, False, False),   # the o projection's shape
                                           ("Q6_K", 512, 1536, True, False),     # a down projection (Q6_KR, rows rounded up)
                                           ("Q4_K", 1024, 512, True, True),
                                           ("Q5_K", 768, 1024, False, False),
                                           ("Q8_0", 4096, 4096, False, False),   # gemv_gguf_norm, short rows
                                           ("Q8_0", 512, 1536, True, True),
                                           ("Q8_0", 512, 8192, True, True))]     # long rows

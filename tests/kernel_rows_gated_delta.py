"""Kernel-table rows for the Gated DeltaNet ops and the MoE ops (cuda_src/gated_delta.cu,
moe_route.cu, act.cu's sigmoid_mul; launchers recurrent_cuda.py, moe_cuda.py, elementwise_cuda.py),
against NumpyOps. A batch mixes decode rows and prefill chunks of several sequences whose states sit
at shuffled slots and start nonzero; inputs are column views of wider arrays, as the model's are.
The state arrays come back as outputs too (they are updated in place)."""
from __future__ import annotations

import numpy as np

from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.quant.dequant import f32_to_bf16
from pocketcupy.quant.qtensor import QTensor
from tests.kernel_table import KernelRow

LENGTHS = (1, 5, 1, 40)          # tokens of each sequence in the step (40: the reference's chunked form)
SLOTS = (4, 0, 2, 5)             # their state slots, of 6


def _batch(rng) -> dict:
    return {"slots": np.asarray(SLOTS, np.int64),
            "query_start": np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int32)}


def _make_conv(channels: int, width: int):
    def make(rng):
        n = sum(LENGTHS)
        wide = rng.standard_normal((n, channels + 24), dtype=np.float32)
        return {**_batch(rng), "wide": wide, "w": rng.standard_normal((channels, width), dtype=np.float32) * 0.5,
                "states": rng.standard_normal((6, channels, width - 1), dtype=np.float32)}
    return make


def _ref_conv(inp):
    states = inp["states"].copy()
    out = NumpyOps().causal_conv1d_silu(inp["wide"][:, 8:8 + inp["w"].shape[0]], inp["w"], states, inp["slots"],
                                        inp["query_start"])
    return out, states


def _cuda_conv(inp, poison):
    import cupy as cp

    from pocketcupy.backend import recurrent_cuda

    c = inp["w"].shape[0]
    states = cp.asarray(inp["states"])
    out = poison((sum(LENGTHS), c), np.float32)
    recurrent_cuda.causal_conv1d_silu(cp.asarray(inp["wide"])[:, 8:8 + c], cp.asarray(inp["w"]), states,
                                      inp["slots"], cp.asarray(inp["query_start"]), out=out)
    return out, states


def _make_delta(hk: int, hv: int, dk: int, dv: int):
    def make(rng):
        n = sum(LENGTHS)
        return {**_batch(rng), "dims": (hk, hv, dk, dv),
                "qkv": rng.standard_normal((n, 2 * hk * dk + hv * dv + 8), dtype=np.float32),
                "ba": rng.standard_normal((n, 2 * hv), dtype=np.float32),
                # decays from ~0.4 to ~1 a token, a_log spread over heads
                "a_log": rng.uniform(-3.0, 0.0, hv).astype(np.float32),
                "dt_bias": rng.uniform(-1.0, 1.0, hv).astype(np.float32),
                "states": rng.standard_normal((6, hv, dk, dv), dtype=np.float32) * 0.3}
    return make


def _delta_args(inp, xp):
    """The op's arguments as views of the wide arrays (xp: numpy or cupy)."""
    hk, hv, dk, dv = inp["dims"]
    qkv, ba = xp.asarray(inp["qkv"]), xp.asarray(inp["ba"])
    n, kd = qkv.shape[0], hk * dk
    q, k = (qkv[:, j * kd:(j + 1) * kd].reshape(n, hk, dk) for j in (0, 1))
    v = qkv[:, 2 * kd:2 * kd + hv * dv].reshape(n, hv, dv)
    return q, k, v, ba[:, :hv], ba[:, hv:], xp.asarray(inp["a_log"]), xp.asarray(inp["dt_bias"])


def _ref_delta(inp):
    states = inp["states"].copy()
    out = NumpyOps().gated_delta_rule(*_delta_args(inp, np), states, inp["slots"], inp["query_start"])
    return out, states


def _cuda_delta(inp, poison):
    import cupy as cp

    from pocketcupy.backend import recurrent_cuda

    hk, hv, dk, dv = inp["dims"]
    states = cp.asarray(inp["states"])
    out = poison((sum(LENGTHS), hv, dv), np.float32)
    recurrent_cuda.gated_delta_rule(*_delta_args(inp, cp), states, cp.asarray(inp["slots"]), inp["query_start"],
                                    out=out)
    return out, states


def _make_sigmoid_mul(rows: int, cols: int, gate_cols: int):
    def make(rng):
        return {"x": rng.standard_normal((rows, cols + 5), dtype=np.float32),
                "gate": rng.standard_normal((rows, gate_cols + 3), dtype=np.float32) * 3, "dims": (cols, gate_cols)}
    return make


def _sigmoid_mul_args(inp, xp):
    cols, gate_cols = inp["dims"]
    return xp.asarray(inp["gate"])[:, 3:3 + gate_cols], xp.asarray(inp["x"])[:, :cols]


def _cuda_sigmoid_mul(inp, poison):
    import cupy as cp

    from pocketcupy.backend import elementwise_cuda

    gate, x = _sigmoid_mul_args(inp, cp)
    return elementwise_cuda.sigmoid_mul(gate, x, out=poison(x.shape, np.float32))


def _make_route(rows: int, experts: int, top_k: int, norm: bool):
    def make(rng):
        return {"logits": rng.standard_normal((rows, experts), dtype=np.float32) * 2, "k": top_k, "norm": norm}
    return make


def _ref_route(inp):
    return NumpyOps().moe_route_softmax(inp["logits"], inp["k"], inp["norm"])


def _cuda_route(inp, poison):
    import cupy as cp

    from pocketcupy.backend import moe_cuda

    return moe_cuda.moe_route_softmax(cp.asarray(inp["logits"]), inp["k"], inp["norm"])


EXPERTS, HIDDEN, INTER = 6, 96, 64


def _make_experts(rows: int, top_k: int, qtype: str = "BF16"):
    def make(rng):
        ids = np.stack([rng.choice(EXPERTS, top_k, replace=False) for _ in range(rows)])
        ws = {part: [rng.standard_normal(shape, dtype=np.float32) * 0.1 for _ in range(EXPERTS)]
              for part, shape in (("gate", (INTER, HIDDEN)), ("up", (INTER, HIDDEN)), ("down", (HIDDEN, INTER)))}
        return {"x": rng.standard_normal((rows, HIDDEN), dtype=np.float32), "ids": ids.astype(np.int32),
                "weights": rng.uniform(0.1, 1.0, (rows, top_k)).astype(np.float32), "qtype": qtype, **ws}
    return make


def _stored(w, qtype: str) -> QTensor:
    return QTensor(qtype, w.shape, f32_to_bf16(w) if qtype == "BF16" else w.astype(np.float16))


def _ref_experts(inp):
    ops = NumpyOps()
    parts = [[ops.weight(_stored(w, inp["qtype"])) for w in inp[p]] for p in ("gate", "up", "down")]
    return ops.moe_experts(inp["x"], inp["ids"], inp["weights"], *parts)


def _cuda_experts(pairs: bool):
    """moe_experts per (row, pick) pair (pairs) or sorted by expert on the host."""
    def run(inp, poison):
        import cupy as cp

        from pocketcupy.backend import moe_cuda
        from pocketcupy.backend.weight_cuda import prepare_weight

        parts = [[prepare_weight(_stored(w, inp["qtype"])) for w in inp[p]] for p in ("gate", "up", "down")]
        saved, moe_cuda.PAIR_GEMV = moe_cuda.PAIR_GEMV, pairs
        try:
            assert moe_cuda.experts_capturable(*parts) == pairs
            return moe_cuda.moe_experts(cp.asarray(inp["x"]), cp.asarray(inp["ids"]), cp.asarray(inp["weights"]),
                                        *parts)
        finally:
            moe_cuda.PAIR_GEMV = saved
    return run


ROWS = [KernelRow("causal_conv1d_silu", f"c{c}_k{k}", _make_conv(c, k), _ref_conv, _cuda_conv, 1e-6)
        for c, k in ((200, 4), (64, 2), (300, 8))]
# the recurrence's float32 sums in another order (the reference's 40-token sequence goes chunked)
ROWS += [KernelRow("gated_delta_rule", f"hk{hk}_hv{hv}_dk{dk}_dv{dv}", _make_delta(hk, hv, dk, dv), _ref_delta,
                   _cuda_delta, 2e-5)
         for hk, hv, dk, dv in ((2, 4, 16, 16), (1, 2, 128, 128), (2, 2, 64, 100), (1, 1, 256, 32))]
ROWS += [KernelRow("sigmoid_mul", f"{r}x{c}_gate{g}", _make_sigmoid_mul(r, c, g),
                   lambda inp: NumpyOps().sigmoid_mul(*_sigmoid_mul_args(inp, np)), _cuda_sigmoid_mul, 1e-6)
         for r, c, g in ((7, 300, 300), (9, 64, 1))]
ROWS += [KernelRow("moe_route_softmax", f"n{n}_e{e}_k{k}{'_norm' * norm}", _make_route(n, e, k, norm), _ref_route,
                   _cuda_route, (1e-6, 0.0)) for n, e, k, norm in ((5, 8, 2, True), (33, 512, 10, True), (3, 64, 8, False))]
# sorted: bf16 weights on the GEMV (fp32 activations) and, past its batch, cuBLAS over bf16
# activations; per pair: fp32 activations, fp32 sums
ROWS += [KernelRow("moe_experts", f"sorted_n{n}_top{k}", _make_experts(n, k), _ref_experts, _cuda_experts(False), 5e-3)
         for n, k in ((1, 2), (7, 2), (40, 4))]
ROWS += [KernelRow("moe_experts", f"pairs_{q.lower()}_n{n}_top{k}", _make_experts(n, k, q), _ref_experts,
                   _cuda_experts(True), 1e-5) for n, k, q in ((1, 2, "BF16"), (7, 2, "F16"), (40, 4, "BF16"))]

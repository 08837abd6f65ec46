"""Kernel-table rows for DeepSeek-V3's ops on CUDA: multi-head latent attention (mla_cuda: attn_mla
over latent pages, and mla_attention with its absorbed projections, RoPE and the latent store) and
the grouped sigmoid router (moe_cuda.moe_route), against NumpyOps. The cases are kernel_rows_attn's
(random block tables; every slot outside a context NaN, and for 8-bit pages its scale), with one
KV head of the latent row's width: DeepSeek-V3's 512 + 64 and the tiny checkpoints' 32 + 16."""
import math

import numpy as np

from pocketcupy.backend.ops_ref import NumpyOps

from .kernel_rows_attn import make_case, stored_caches
from .kernel_rows_core import _inv_freq, _randn
from .kernel_rows_kv_quant import on_device, quantized, stored_rows
from .kernel_table import KernelRow

REF = NumpyOps()
F32 = np.float32


def _cp():
    import cupy

    return cupy


def _host_pages(kc16, dtype):
    """fp16 pages as the reference takes them: float32, or NumPy codes."""
    return kc16.astype(F32) if dtype == "auto" else quantized(kc16, dtype)


def _device_pages(kc16, dtype):
    """The same pages on the device: fp16, or codes."""
    return _cp().asarray(kc16) if dtype == "auto" else on_device(quantized(kc16, dtype))


def _positions(meta) -> np.ndarray:
    """Each query row's position: the last nq of its sequence's context."""
    return np.concatenate([np.arange(c - (meta.query_start[b + 1] - meta.query_start[b]), c)
                           for b, c in enumerate(meta.seq_lens.tolist())]).astype(np.int64)


def _new_rows(cache, slots):
    """The float32 rows a cache holds at slots (host)."""
    if hasattr(cache, "kind"):
        return stored_rows(cache, slots)
    cache = cache if isinstance(cache, np.ndarray) else cache.get()
    return cache.reshape(-1, *cache.shape[2:])[slots].astype(F32)


ROWS = []

# attn_mla: queries over latent rows already stored (the new tokens' too)
for seqs, heads, rank, rope, dtype, splits in [
        ([(300, 1), (40, 1), (1000, 1)], 16, 512, 64, "auto", None),      # DeepSeek-V3 decode, split by shape
        ([(300, 1), (40, 1), (1000, 1)], 16, 512, 64, "auto", 5),
        ([(300, 1), (129, 1)], 128, 512, 64, "int8", None),                 # V3's 128 heads
        ([(200, 1), (77, 1)], 16, 512, 64, "fp8", 3),
        ([(37, 37), (90, 20), (18, 1)], 20, 32, 16, "auto", None),         # tiny: prefill, chunk, decode; 20 heads
        ([(37, 37), (90, 20), (18, 1)], 4, 32, 16, "int8", 2),
]:
    def make(rng, seqs=seqs, heads=heads, d=rank + rope):
        i = make_case(rng, seqs, 1, heads, d)
        i["kc"], _ = stored_caches({**i, "vc": i["kc"]})       # the new rows stored too
        return i

    def ref(i, rope=rope, dtype=dtype):
        pages = _host_pages(i["kc"], dtype)
        return REF.paged_attention(i["q"], pages, pages, i["meta"], i["scale"])[..., rope:]

    def cuda(i, poison, rope=rope, dtype=dtype, splits=splits):
        from pocketcupy.backend import mla_cuda

        pages = _device_pages(i["kc"], dtype)
        return mla_cuda.attn_mla(_cp().asarray(i["q"]), pages, i["meta"], i["scale"], rope, num_splits=splits)

    shape = "-".join(f"{c}x{n}" for c, n in seqs)
    ROWS.append(KernelRow("attn_mla", f"{dtype}-h{heads}-d{rank}+{rope}-{shape}-s{splits}", make, ref, cuda,
                          tol=1e-3 if dtype == "auto" else 3e-3))

# mla_attention: absorbed projections, RoPE on both rotary parts, the latent rows stored
for seqs, heads, nope, rope, rank, dv, interleaved, dtype in [
        ([(100, 1), (33, 1)], 16, 128, 64, 512, 128, True, "auto"),        # DeepSeek-V3's sizes, 16 heads
        ([(60, 1), (300, 1)], 16, 128, 64, 512, 128, False, "int8"),
        ([(37, 37), (90, 20), (18, 1)], 4, 16, 16, 32, 16, True, "auto"),  # the tiny checkpoints'
        ([(37, 37), (90, 20), (18, 1)], 4, 16, 16, 32, 16, False, "fp8"),
]:
    def make(rng, seqs=seqs, heads=heads, nope=nope, rope=rope, rank=rank, dv=dv):
        i = make_case(rng, seqs, 1, heads, rope + rank)
        n = len(i["meta"].slot_mapping)
        i.update(q=_randn(rng, n, heads, nope + rope), c_kv=_randn(rng, n, rank), k_pe=_randn(rng, n, rope + 8)[:, 3:3 + rope],
                 w=_randn(rng, heads * (nope + dv), rank, scale=1 / math.sqrt(rank)), pos=_positions(i["meta"]),
                 inv=_inv_freq(rope), scale=1 / math.sqrt(nope + rope))
        return i

    def ref(i, interleaved=interleaved, dtype=dtype):
        pages = _host_pages(i["kc"], dtype)
        out = REF.mla_attention(i["q"], i["c_kv"], i["k_pe"], i["pos"], i["inv"], interleaved, i["w"], pages,
                                i["meta"], i["scale"])
        return out, _new_rows(pages, i["meta"].slot_mapping)

    def cuda(i, poison, interleaved=interleaved, dtype=dtype):
        from pocketcupy.backend import mla_cuda

        cp = _cp()
        pages = _device_pages(i["kc"], dtype)
        out = mla_cuda.mla_attention(cp.asarray(i["q"]), cp.asarray(i["c_kv"]), cp.asarray(i["k_pe"]),
                                     cp.asarray(i["pos"]), cp.asarray(i["inv"]), interleaved, cp.asarray(i["w"]),
                                     pages, i["meta"], i["scale"])
        return out, _new_rows(pages, i["meta"].slot_mapping)

    shape = "-".join(f"{c}x{n}" for c, n in seqs)
    ROWS.append(KernelRow("mla_attention", f"{dtype}-h{heads}-{nope}+{rope}-r{rank}-v{dv}-"
                          f"{'interleaved' if interleaved else 'halves'}-{shape}", make, ref, cuda,
                          tol=(2e-3, 1e-3) if dtype == "auto" else (6e-3, 2e-3)))


def _sorted_by_id(weights, ids):
    """(weights, ids) of each row in id order (the router's pick order is free)."""
    order = np.argsort(ids, axis=1)
    return np.take_along_axis(weights, order, axis=1), np.take_along_axis(ids, order, axis=1).astype(F32)


# moe_route: DeepSeek-V3's (256 experts in 8 groups, 4 groups, 8 picks) and the tiny checkpoints'
for n, experts, n_group, topk_group, top_k, norm, scaling in [
        (37, 256, 8, 4, 8, True, 2.5), (5, 8, 2, 1, 2, True, 2.5), (9, 8, 2, 1, 2, False, 1.0),
        (3, 64, 1, 1, 6, True, 1.0)]:
    def make(rng, n=n, experts=experts):
        return {"logits": _randn(rng, n, experts + 5, scale=2.0), "bias": _randn(rng, experts, scale=0.3)}

    def ref(i, experts=experts, args=(n_group, topk_group, top_k, norm, scaling)):
        return _sorted_by_id(*REF.moe_route(i["logits"][:, :experts], i["bias"], *args))

    def cuda(i, poison, experts=experts, args=(n_group, topk_group, top_k, norm, scaling)):
        from pocketcupy.backend import moe_cuda

        cp = _cp()
        weights, ids = moe_cuda.moe_route(cp.asarray(i["logits"])[:, :experts], cp.asarray(i["bias"]), *args)
        return _sorted_by_id(weights.get(), ids.get())

    ROWS.append(KernelRow("moe_route", f"n{n}-e{experts}-g{n_group}-tg{topk_group}-k{top_k}-norm{int(norm)}", make,
                          ref, cuda, tol=(1e-6, 0.0)))

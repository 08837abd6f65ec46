"""Kernel-table rows for the quantized KV pages (kv_cache_dtype "int8" / "fp8" / "k8v4";
kv_pages_cuda): the stores against NumPy's quantizer (quant/kv_quant.py), and prefill / decode
attention over codes against NumpyOps.paged_attention over the same codes. The cases are
kernel_rows_attn's (random block tables, NaN outside every context): here the parameters of those
slots are NaN, so a kernel that reads one fails. k8v4 rows start at head dim 32 (its values come in
groups of 32)."""
import numpy as np

from pocketcupy.quant.kv_quant import KV_KINDS, QuantKVCache, dequantize_kv, quantize_kv

from .kernel_rows_attn import REF, make_case, make_rope_case, stored_caches
from .kernel_rows_core import _inv_freq, _randn
from .kernel_table import KernelRow

F32 = np.float32
DTYPES = ("int8", "fp8", "k8v4")


def _cp():
    import cupy

    return cupy


def quantized(pages16: np.ndarray, kind: str) -> QuantKVCache:
    """fp16 pages (NaN rows: never written) as NumPy codes and scales; NaN rows get NaN scales."""
    x = pages16.astype(F32)
    bad = np.isnan(x).any(axis=-1)
    codes, params = quantize_kv(np.where(np.isnan(x), 0.0, x), kind)
    params[bad] = np.nan
    return QuantKVCache(codes, params, kind)


def on_device(c: QuantKVCache) -> QuantKVCache:
    return QuantKVCache(_cp().asarray(c.codes), _cp().asarray(c.params), c.kind)


def quant_caches(i, dtype):
    """The case's pages with the new tokens stored, quantized (NumPy)."""
    return tuple(quantized(c, kind) for c, kind in zip(stored_caches(i), KV_KINDS[dtype]))


def pages_quantized(i, dtype):
    """The case's pages (the new tokens' slots still NaN), quantized, on the device."""
    return tuple(on_device(quantized(c, kind)) for c, kind in zip((i["kc"], i["vc"]), KV_KINDS[dtype]))


def zero_pages(shape, dtype):
    return tuple(QuantKVCache.zeros(shape, kind) for kind in KV_KINDS[dtype])


def stored_rows(cache: QuantKVCache, slots):
    """The float32 values a cache holds at slots (codes times scales), host arrays."""
    codes, params = (a if isinstance(a, np.ndarray) else a.get() for a in (cache.codes, cache.params))
    return dequantize_kv(codes.reshape(-1, *codes.shape[2:])[slots], params.reshape(-1, *params.shape[2:])[slots],
                         cache.kind)


def _attn():
    from pocketcupy.backend import attn_cuda

    return attn_cuda


ROWS = []

# --- stores: exactly NumPy's codes and scales ---------------------------------------------------
for dtype in DTYPES:
    for n, hkv, d, slot_dtype in [(5, 2, 64, np.int64), (3, 8, 128, np.int32), (9, 1, 16 if dtype != "k8v4" else 32,
                                                                               np.int32)]:
        def make(rng, n=n, hkv=hkv, d=d, slot_dtype=slot_dtype):
            nb, bs = 4, 16
            slots = rng.choice(nb * bs, n, replace=False).astype(slot_dtype)
            slots[n // 2] = -1                   # padding row: not written
            k, v = _randn(rng, n, hkv, d, scale=3.0), _randn(rng, n, hkv, d, scale=0.01)
            k[0, 0] = 0.0                        # a row of zeros: zero scale and codes
            return {"k": k, "v": v, "slots": slots, "shape": (nb, bs, hkv, d)}

        def ref(i, dtype=dtype):
            kc, vc = zero_pages(i["shape"], dtype)
            keep = i["slots"] >= 0
            REF.store_kv(kc, vc, i["k"][keep], i["v"][keep], i["slots"][keep])
            return tuple(a.astype(F32) for c in (kc, vc) for a in (c.codes, c.params))

        def cuda(i, poison, dtype=dtype):
            from pocketcupy.backend import elementwise_cuda
            from pocketcupy.backend.kv_pages_cuda import empty_kv_pages

            kc, vc = empty_kv_pages(*i["shape"], dtype)
            cp = _cp()
            elementwise_cuda.store_kv(kc, vc, cp.asarray(i["k"]), cp.asarray(i["v"]), cp.asarray(i["slots"]))
            return tuple(a.astype(F32) for c in (kc, vc) for a in (c.codes, c.params))

        ROWS.append(KernelRow("store_kv", f"{dtype}-n{n}-hkv{hkv}-d{d}-{np.dtype(slot_dtype).name}", make, ref, cuda,
                              tol=0.0))

# --- RoPE + store: q and the stored values (a code may round the other way where the rotated k
# differs in its last bit from NumPy's) ------------------------------------------------------------
for dtype in DTYPES:
    for n, hq, hkv, d, rot, interleaved in [(5, 4, 2, 64, 64, False), (3, 8, 2, 128, 64, True),
                                            (6, 4, 4, 32, 32, False)]:
        def make(rng, n=n, hq=hq, hkv=hkv, d=d, rot=rot):
            nb, bs = 4, 16
            slots = rng.choice(nb * bs, n, replace=False).astype(np.int64)
            slots[n // 2] = -1
            return {"q": _randn(rng, n, hq, d), "k": _randn(rng, n, hkv, d), "v": _randn(rng, n, hkv, d),
                    "pos": rng.integers(0, 4096, n).astype(np.int64), "inv": _inv_freq(rot), "slots": slots,
                    "shape": (nb, bs, hkv, d)}

        def ref(i, dtype=dtype, interleaved=interleaved):
            kc, vc = zero_pages(i["shape"], dtype)
            keep = i["slots"] >= 0
            REF.rope_store_kv(i["q"][keep], i["k"][keep], i["v"][keep], i["pos"][keep], i["inv"], interleaved, kc, vc,
                              i["slots"][keep])
            return (REF.rope(i["q"], i["pos"], i["inv"], interleaved),
                    *(stored_rows(c, i["slots"][keep]) for c in (kc, vc)))

        def cuda(i, poison, dtype=dtype, interleaved=interleaved):
            from pocketcupy.backend import elementwise_cuda
            from pocketcupy.backend.kv_pages_cuda import empty_kv_pages

            cp = _cp()
            kc, vc = empty_kv_pages(*i["shape"], dtype)
            q = elementwise_cuda.rope_store_kv(cp.asarray(i["q"]), cp.asarray(i["k"]), cp.asarray(i["v"]),
                                               cp.asarray(i["pos"]), cp.asarray(i["inv"]), interleaved, kc, vc,
                                               cp.asarray(i["slots"]), out=poison(i["q"].shape, F32))
            keep = i["slots"][i["slots"] >= 0]
            return (q, *(stored_rows(c, keep) for c in (kc, vc)))

        ROWS.append(KernelRow("rope_store_kv", f"{dtype}-{'interleaved' if interleaved else 'halves'}-n{n}-hq{hq}"
                              f"-hkv{hkv}-d{d}-rot{rot}", make, ref, cuda, tol=2e-3))


# --- attention over codes -------------------------------------------------------------------------
def reference(i, dtype):
    kc, vc = quant_caches(i, dtype)
    return REF.paged_attention(i["q"], kc, vc, i["meta"], i["scale"])


PREFILL = [  # id, seqs [(ctx, nq)], hkv, group, head_dim, num_splits
    ("b3-mixed-hkv2-g4-d128", [(100, 100), (300, 45), (17, 1)], 2, 4, 128, None),
    ("b2-prefix-hkv2-g3-d64", [(130, 70), (64, 64)], 2, 3, 64, None),
    ("b2-hkv2-g2-d32", [(21, 7), (50, 50)], 2, 2, 32, None),
    ("b1-hkv2-g2-d16", [(40, 40)], 2, 2, 16, None),
    ("split3-b3-prefix-hkv2-g4-d128", [(2000, 40), (700, 33), (50, 50)], 2, 4, 128, 3),
    ("b3-mixed-hkv2-g4-d256", [(100, 100), (300, 45), (17, 1)], 2, 4, 256, None),     # plain only
]
# the plain kernel's tiles hold the values rounded to fp16 (the reference: exact products)
for dtype in DTYPES:
    for variant, tol in [("plain", 1e-3), ("mma", 3e-3)]:
        for name, seqs, hkv, group, d, splits in PREFILL:
            if (dtype == "k8v4" and d % 32) or (variant == "mma" and d > 128):
                continue

            def cuda(i, poison, dtype=dtype, variant=variant, splits=splits):
                kc, vc = (on_device(c) for c in quant_caches(i, dtype))
                return _attn().attn_prefill(_cp().asarray(i["q"]), kc, vc, i["meta"], i["scale"],
                                            out=poison(i["q"].shape, F32), variant=variant, num_splits=splits)

            ROWS.append(KernelRow(
                "attn_prefill", f"{dtype}-{variant}-{name}",
                lambda rng, seqs=seqs, hkv=hkv, group=group, d=d: make_case(rng, seqs, hkv, group, d),
                lambda i, dtype=dtype: reference(i, dtype), cuda, tol))

DECODE = [  # id, context lengths, hkv, group, head_dim, num_splits, variant, k_ring (None: the launcher's)
    ("b4-ctx1-17-hkv2-g4-d128", [1, 15, 16, 17], 2, 4, 128, None, "mma", None),
    ("b3-long-hkv2-g3-d64", [1000, 5000, 77], 2, 3, 64, None, "mma", None),
    ("b2-splits1-hkv1-g8-d128", [300, 2000], 1, 8, 128, 1, "mma", None),
    ("b2-splits7-hkv2-g4-d128", [300, 2000], 2, 4, 128, 7, "mma", None),
    ("b2-hkv2-g12-d64", [333, 64], 2, 12, 64, 3, "mma", None),
    ("b2-plain-runs-prefill-hkv2-g2-d32", [5, 130], 2, 2, 32, None, "plain", None),
    ("k16-b4-ctx1-17-hkv2-g4-d128", [1, 15, 16, 17], 2, 4, 128, None, "mma", False),
    ("k16-b3-long-hkv2-g3-d64", [1000, 5000, 77], 2, 3, 64, None, "mma", False),
    ("ring-b2-splits7-hkv2-g4-d128", [300, 2000], 2, 4, 128, 7, "mma", True),
    ("ring-b1-splits16-hkv2-g12-d64", [517], 2, 12, 64, 16, "mma", True),
]
for dtype in DTYPES:
    for name, ctxs, hkv, group, d, splits, variant, k_ring in DECODE:
        def cuda(i, poison, dtype=dtype, splits=splits, variant=variant, k_ring=k_ring):
            kc, vc = (on_device(c) for c in quant_caches(i, dtype))
            args = (_cp().asarray(i["q"]), kc, vc, i["meta"], i["scale"])
            kw = dict(num_splits=splits, variant=variant, k_ring=k_ring)
            _attn().attn_decode(*args, out=poison(i["q"].shape, F32), **kw)
            return _attn().attn_decode(*args, out=poison(i["q"].shape, F32), **kw)

        ROWS.append(KernelRow(
            "attn_decode", f"{dtype}-{variant}-{name}",
            lambda rng, ctxs=ctxs, hkv=hkv, group=group, d=d: make_case(rng, [(c, 1) for c in ctxs], hkv, group, d),
            lambda i, dtype=dtype: reference(i, dtype), cuda, 3e-3))

# The mma decode kernel rotating q and k and quantizing the new K/V rows itself (their slots' scales
# NaN beforehand): its output and the stored values against rope_store_kv + paged attention.
DECODE_ROPE = [  # id, context lengths, hkv, group, head_dim, rot_half, interleaved, num_splits, k_ring
    ("halves-b2-splits1-hkv2-g4-d128", [300, 2000], 2, 4, 128, 64, False, 1, None),
    ("interleaved-b3-splitsauto-hkv2-g4-d128", [1, 700, 3000], 2, 4, 128, 64, True, None, None),
    ("halves-partial-b2-splits5-hkv3-g3-d64", [900, 130], 3, 3, 64, 16, False, 5, None),
    ("halves-b2-splits3-hkv1-g10-d128", [400, 90], 1, 10, 128, 64, False, 3, None),   # rows g + 8 of the mma tile
    ("k16-interleaved-b3-splitsauto-hkv2-g4-d128", [1, 700, 3000], 2, 4, 128, 64, True, None, False),
    ("ring-halves-b2-splits3-hkv1-g10-d128", [400, 90], 1, 10, 128, 64, False, 3, True),
    ("halves-b1-splits16-hkv2-g4-d128", [513], 2, 4, 128, 64, False, 16, None),
]
for dtype in DTYPES:
    for name, ctxs, hkv, group, d, rot, interleaved, splits, k_ring in DECODE_ROPE:
        def ref_rope(i, dtype=dtype, interleaved=interleaved):
            kc, vc = (quantized(c, kind) for c, kind in zip((i["kc"], i["vc"]), KV_KINDS[dtype]))
            slots = i["meta"].slot_mapping
            q = REF.rope_store_kv(i["q"], i["k"], i["v"], i["pos"], i["inv"], interleaved, kc, vc, slots)
            return (REF.paged_attention(q, kc, vc, i["meta"], i["scale"]), *(stored_rows(c, slots) for c in (kc, vc)))

        def cuda_rope(i, poison, dtype=dtype, d=d, interleaved=interleaved, splits=splits, k_ring=k_ring):
            cp, at = _cp(), _attn()
            kc, vc = pages_quantized(i, dtype)
            meta = at.device_meta(i["meta"])
            q = cp.asarray(i["q"])
            rope = at.DecodeRope(cp.asarray(i["k"]), cp.asarray(i["v"]), cp.asarray(i["pos"]), cp.asarray(i["inv"]),
                                 interleaved)
            assert at.decode_fuses_rope(q, kc, meta, rope)
            for _ in range(2):     # twice: the split counters are back at zero after a launch
                for c in (kc, vc):     # the new tokens' scales NaN until the kernel stores them
                    c.params.reshape(-1, *c.params.shape[2:])[meta.slot_mapping] = np.nan
                out = at.attn_decode(q, kc, vc, meta, i["scale"], out=poison(q.shape, F32), num_splits=splits,
                                     rope=rope, k_ring=k_ring)
            return (out, *(stored_rows(c, meta.slot_mapping.get()) for c in (kc, vc)))

        ROWS.append(KernelRow("attn_decode", f"{dtype}-mma-rope-{name}",
                              lambda rng, c=ctxs, h=hkv, g=group, d=d, r=rot: make_rope_case(rng, c, h, g, d, r),
                              ref_rope, cuda_rope, 3e-3))

# CudaOps.attention over 8-bit pages: the store, then decode or prefill
for dtype in DTYPES:
    for name, seqs, decode_only, d in [("prefill-b3", [(50, 50), (80, 20), (9, 1)], False, 128),
                                       ("decode-b3", [(1, 1), (40, 1), (300, 1)], True, 128),
                                       ("decode-b3-d256", [(1, 1), (40, 1), (300, 1)], True, 256)]:
        def make(rng, seqs=seqs, decode_only=decode_only, d=d):
            i = make_case(rng, seqs, 2, 4, d)
            i["meta"].decode_only = decode_only
            return i

        def cuda(i, poison, dtype=dtype):
            from pocketcupy.backend.ops_cuda import CudaOps

            cp = _cp()
            kc, vc = pages_quantized(i, dtype)
            return CudaOps().attention(cp.asarray(i["q"]), cp.asarray(i["k"]), cp.asarray(i["v"]), kc, vc, i["meta"],
                                       i["scale"])

        ROWS.append(KernelRow("ops.attention", f"{dtype}-{name}", make, lambda i, dtype=dtype: reference(i, dtype),
                              cuda, 3e-3))

"""Kernel-table rows for paged attention: causal prefill (plain and tensor-core variants), split-K
decode, and CudaOps.attention (store + kernel choice). Block tables are random permutations of
the cache blocks; every cache slot outside a sequence's context holds NaN, so a kernel that reads
past a context (or a padded table entry) fails. The reference runs NumPyOps.attention on the same
fp16-rounded K/V in float32."""
import math

import numpy as np

from pocketcupy.backend.attention_meta import AttentionMetadata
from pocketcupy.backend.ops_ref import NumpyOps

from .kernel_table import KernelRow, q8_blocks_dequantized

REF = NumpyOps()
F32, F16 = np.float32, np.float16


def make_case(rng, seqs, hkv, group, d, block_size=16):
    """seqs: [(context length after this step, new query rows)]."""
    nblk = [math.ceil(ctx / block_size) for ctx, _ in seqs]
    num_blocks = sum(nblk) + 3
    perm = rng.permutation(num_blocks)
    tables = np.zeros((len(seqs), max(nblk) + 1), np.int32)   # one padding column (zeros)
    kc = np.full((num_blocks, block_size, hkv, d), np.nan, F16)
    vc = kc.copy()
    kflat, vflat = kc.reshape(-1, hkv, d), vc.reshape(-1, hkv, d)
    starts, slots, used = [0], [], 0
    for b, (ctx, nq) in enumerate(seqs):
        blocks = perm[used:used + nblk[b]]
        used += nblk[b]
        tables[b, :nblk[b]] = blocks
        seq_slots = (blocks[:, None].astype(np.int64) * block_size + np.arange(block_size)).reshape(-1)[:ctx]
        prefix = seq_slots[:ctx - nq]
        kflat[prefix] = rng.standard_normal((len(prefix), hkv, d))
        vflat[prefix] = rng.standard_normal((len(prefix), hkv, d))
        slots.append(seq_slots[ctx - nq:])
        starts.append(starts[-1] + nq)
    n = starts[-1]
    rounded = lambda *s: rng.standard_normal(s).astype(F16).astype(F32)   # noqa: E731  exact in fp16
    meta = AttentionMetadata(np.asarray(starts, np.int32), np.asarray([c for c, _ in seqs], np.int32), tables,
                             np.concatenate(slots), block_size)
    return {"q": (1.5 * rng.standard_normal((n, hkv * group, d))).astype(F32), "k": rounded(n, hkv, d),
            "v": rounded(n, hkv, d), "kc": kc, "vc": vc, "meta": meta, "scale": 1.0 / math.sqrt(d)}


def reference(i):
    return REF.attention(i["q"], i["k"], i["v"], i["kc"].astype(F32), i["vc"].astype(F32), i["meta"], i["scale"])


def stored_caches(i):
    """The caches with the new tokens already written (what the attention kernels read)."""
    kc, vc = i["kc"].copy(), i["vc"].copy()
    REF.store_kv(kc, vc, i["k"], i["v"], i["meta"].slot_mapping)
    return kc, vc


def own_q8_blocks(out, xq, xds):
    """The int8 blocks a decode kernel wrote of its output, dequantized, after checking that they
    are exactly quantize_x of that output."""
    from pocketcupy.backend.linear_cuda import quantize_x

    xq2, xds2 = quantize_x(out.reshape(len(out), -1))
    _cp().testing.assert_array_equal(xq, xq2)
    _cp().testing.assert_array_equal(xds, xds2)
    return q8_blocks_dequantized(xq, xds)


def _cp():
    import cupy

    return cupy


def _attn():
    from pocketcupy.backend import attn_cuda

    return attn_cuda


ROWS = []

PREFILL = [  # id, seqs [(ctx, nq)], hkv, group, head_dim, block_size
    ("b1-ctx37-hkv2-g1-d64", [(37, 37)], 2, 1, 64, 16),
    ("b3-mixed-hkv2-g4-d128", [(100, 100), (300, 45), (17, 1)], 2, 4, 128, 16),
    ("b2-prefix-hkv2-g3-d64", [(130, 70), (64, 64)], 2, 3, 64, 16),
    ("b2-long-hkv1-g4-d128", [(1100, 300), (520, 130)], 1, 4, 128, 16),
    ("b1-hkv2-g2-d16", [(40, 40)], 2, 2, 16, 16),
    ("b2-hkv2-g2-d32", [(21, 7), (50, 50)], 2, 2, 32, 16),
    ("b2-bs32-hkv2-g1-d64", [(90, 90), (75, 11)], 2, 1, 64, 32),
    ("b1-single-row-hkv4-g1-d128", [(1, 1)], 4, 1, 128, 16),
]
for variant, tol in [("plain", 1e-4), ("mma", 3e-3)]:
    for name, seqs, hkv, group, d, bs in PREFILL:
        def cuda(i, poison, variant=variant):
            kc, vc = stored_caches(i)
            cp = _cp()
            return _attn().attn_prefill(cp.asarray(i["q"]), cp.asarray(kc), cp.asarray(vc), i["meta"], i["scale"],
                                        out=poison(i["q"].shape, F32), variant=variant)

        ROWS.append(KernelRow(
            "attn_prefill", f"{variant}-{name}",
            lambda rng, seqs=seqs, hkv=hkv, group=group, d=d, bs=bs: make_case(rng, seqs, hkv, group, d, bs),
            reference, cuda, tol))

# Split-KV prefill (a short chunk over a long prefix): the *_split_* kernels + the decode combine.
# num_splits None = the launcher's choice (splits on any GPU: 1-4 tiles x 8 heads, 2K context).
# "straddle": a 64-row tile crosses a split boundary, so some of its rows have no key in a
# non-empty split; (ctx, ctx) sequences start at position 0, (ctx, 1) is a single decode row.
PREFILL_SPLIT = [  # id, seqs [(ctx, nq)], hkv, group, head_dim, num_splits
    ("split3-b3-prefix-hkv2-g4-d128", [(2000, 40), (700, 33), (50, 50)], 2, 4, 128, 3),
    ("split7-b3-prefix-hkv2-g4-d128", [(2000, 40), (700, 33), (50, 50)], 2, 4, 128, 7),
    ("split3-b4-hkv4-g1-d64", [(1500, 20), (64, 64), (900, 1), (1300, 130)], 4, 1, 64, 3),
    ("split7-b4-hkv4-g1-d64", [(1500, 20), (64, 64), (900, 1), (1300, 130)], 4, 1, 64, 7),
    ("split7-b2-straddle-hkv1-g2-d64", [(1200, 100), (40, 40)], 1, 2, 64, 7),
    ("split7-b2-straddle-hkv2-g1-d128", [(1200, 100), (129, 129)], 2, 1, 128, 7),
    ("split2-b1-hkv2-g2-d32", [(700, 30)], 2, 2, 32, 2),
    ("splitauto-b1-48-over-2k-hkv2-g4-d128", [(2100, 48)], 2, 4, 128, None),
    ("splitauto-b2-hkv2-g4-d64", [(2100, 48), (300, 300)], 2, 4, 64, None),
]
for variant, tol in [("plain", 1e-4), ("mma", 3e-3)]:
    for name, seqs, hkv, group, d, splits in PREFILL_SPLIT:
        def cuda(i, poison, variant=variant, splits=splits):
            kc, vc = stored_caches(i)
            cp = _cp()
            return _attn().attn_prefill(cp.asarray(i["q"]), cp.asarray(kc), cp.asarray(vc), i["meta"], i["scale"],
                                        out=poison(i["q"].shape, F32), variant=variant, num_splits=splits)

        ROWS.append(KernelRow(
            "attn_prefill", f"{variant}-{name}",
            lambda rng, seqs=seqs, hkv=hkv, group=group, d=d: make_case(rng, seqs, hkv, group, d),
            reference, cuda, tol))

DECODE = [  # id, context lengths, hkv, group, head_dim, num_splits (None = the launcher's choice)
    ("b1-ctx1-hkv2-g1-d64", [1], 2, 1, 64, None),
    ("b4-ctx1-17-hkv2-g4-d128", [1, 15, 16, 17], 2, 4, 128, None),
    ("b3-long-hkv2-g3-d64", [1000, 5000, 77], 2, 3, 64, None),
    ("b2-splits1-hkv1-g8-d128", [300, 2000], 1, 8, 128, 1),
    ("b2-splits7-hkv2-g4-d128", [300, 2000], 2, 4, 128, 7),
    ("b2-splits64-short-hkv2-g4-d128", [70, 129], 2, 4, 128, 64),   # mostly empty splits
    ("b2-hkv2-g2-d16", [33, 70], 2, 2, 16, None),
    ("b2-hkv2-g2-d32", [5, 130], 2, 2, 32, None),
    ("b1-hkv1-g16-d128", [200], 1, 16, 128, None),
    ("b2-hkv2-g12-d64", [333, 64], 2, 12, 64, 3),                  # rows g + 8 of the mma tile
    ("b1-g20-falls-back-to-prefill-d64", [100], 1, 20, 64, None),
]
for variant, tol in [("plain", 1e-4), ("mma", 3e-3)]:
    for name, ctxs, hkv, group, d, splits in DECODE:
        if variant == "mma" and d not in (64, 128):
            continue

        def cuda(i, poison, splits=splits, variant=variant):
            kc, vc = stored_caches(i)
            cp = _cp()
            args = (cp.asarray(i["q"]), cp.asarray(kc), cp.asarray(vc), i["meta"], i["scale"])
            # twice: the mma kernel's split counters must be back at zero after a launch
            _attn().attn_decode(*args, out=poison(i["q"].shape, F32), num_splits=splits, variant=variant)
            return _attn().attn_decode(*args, out=poison(i["q"].shape, F32), num_splits=splits, variant=variant)

        ROWS.append(KernelRow(
            "attn_decode", f"{variant}-{name}",
            lambda rng, ctxs=ctxs, hkv=hkv, group=group, d=d: make_case(rng, [(c, 1) for c in ctxs], hkv, group, d),
            reference, cuda, tol if group <= 16 else 3e-3))

# The mma decode kernel writing its output's int8 blocks too (the output projection's input): one
# split, splits merged by the last block, and rows of the last 8-lane group past the block's values
# (group 1 at head dim 64). The blocks must be exactly quantize_x of the kernel's own output.
DECODE_Q8 = [  # id, context lengths, hkv, group, head_dim, num_splits
    ("b2-splits1-hkv2-g4-d128", [300, 2000], 2, 4, 128, 1),
    ("b3-splitsauto-hkv2-g4-d128", [1, 700, 3000], 2, 4, 128, None),
    ("b2-splits5-hkv3-g1-d64", [900, 130], 3, 1, 64, 5),
    ("b1-splits16-hkv8-g4-d128", [512], 8, 4, 128, 16),
]
for name, ctxs, hkv, group, d, splits in DECODE_Q8:
    def ref_q8(i):
        from pocketcupy.quant.act_q8 import q8_roundtrip

        out = reference(i)
        return out, q8_roundtrip(out.reshape(len(out), -1))

    def cuda_q8(i, poison, splits=splits):
        kc, vc = stored_caches(i)
        cp = _cp()
        args = (cp.asarray(i["q"]), cp.asarray(kc), cp.asarray(vc), i["meta"], i["scale"])
        for _ in range(2):     # twice: the split counters are back at zero after a launch
            out, xq, xds = _attn().attn_decode(*args, out=poison(i["q"].shape, F32), num_splits=splits,
                                               variant="mma", q8_out=True)
        return out, own_q8_blocks(out, xq, xds)

    ROWS.append(KernelRow(
        "attn_decode", f"mma-q8out-{name}",
        lambda rng, ctxs=ctxs, hkv=hkv, group=group, d=d: make_case(rng, [(c, 1) for c in ctxs], hkv, group, d),
        ref_q8, cuda_q8, 3e-3))

# The mma decode kernel applying RoPE and storing the new K/V itself (q, k, v column views of one
# QKV row, as the model passes them; the new tokens' cache slots NaN beforehand): its output and the
# stored slots against rope_store_kv + paged attention; with int8 output blocks (then exactly
# quantize_x of its own output) and without.
DECODE_ROPE = [  # id, context lengths, hkv, group, head_dim, rot_half, interleaved, num_splits, q8
    ("halves-b2-splits1-hkv2-g4-d128", [300, 2000], 2, 4, 128, 64, False, 1, False),
    ("interleaved-b3-splitsauto-hkv2-g4-d128", [1, 700, 3000], 2, 4, 128, 64, True, None, True),
    ("halves-partial-b2-splits5-hkv3-g3-d64", [900, 130], 3, 3, 64, 16, False, 5, True),
    ("interleaved-b1-splits16-hkv8-g4-d128", [512], 8, 4, 128, 64, True, 16, False),
    ("halves-b1-ctx1-hkv1-g9-d64", [1], 1, 9, 64, 32, False, None, True),
]
for name, ctxs, hkv, group, d, rot, interleaved, splits, q8 in DECODE_ROPE:
    def make_rope(rng, ctxs=ctxs, hkv=hkv, group=group, d=d, rot=rot):
        from .kernel_rows_core import _inv_freq

        i = make_case(rng, [(c, 1) for c in ctxs], hkv, group, d)
        i["pos"] = np.asarray([c - 1 for c in ctxs], np.int64)
        i["inv"] = _inv_freq(2 * rot)
        return i

    def ref_rope(i, interleaved=interleaved, q8=q8):
        from pocketcupy.quant.act_q8 import q8_roundtrip

        kc, vc, slots = i["kc"].copy(), i["vc"].copy(), i["meta"].slot_mapping
        q = REF.rope_store_kv(i["q"], i["k"], i["v"], i["pos"], i["inv"], interleaved, kc, vc, slots)
        out = REF.paged_attention(q, kc.astype(F32), vc.astype(F32), i["meta"], i["scale"])
        stored = [c.reshape(-1, *c.shape[2:])[slots].astype(F32) for c in (kc, vc)]
        return (out, *stored) + ((q8_roundtrip(out.reshape(len(out), -1)),) if q8 else ())

    def cuda_rope(i, poison, hkv=hkv, d=d, interleaved=interleaved, splits=splits, q8=q8):
        cp, at = _cp(), _attn()
        n, hq = i["q"].shape[:2]
        qkv = cp.asarray(np.concatenate([i[x].reshape(n, -1) for x in ("q", "k", "v")], axis=1))
        q, k, v = (qkv[:, :hq * d].reshape(n, hq, d), qkv[:, hq * d:(hq + hkv) * d].reshape(n, hkv, d),
                   qkv[:, (hq + hkv) * d:].reshape(n, hkv, d))
        kc, vc = cp.asarray(i["kc"]), cp.asarray(i["vc"])
        meta = at.device_meta(i["meta"])
        rope = at.DecodeRope(k, v, cp.asarray(i["pos"]), cp.asarray(i["inv"]), interleaved)
        assert at.decode_fuses_rope(q, kc, meta, rope)
        for _ in range(2):     # twice: the split counters are back at zero after a launch
            for c in (kc, vc):     # the new tokens' slots hold NaN until the kernel stores them
                c.reshape(-1, *c.shape[2:])[meta.slot_mapping] = np.nan
            got = at.attn_decode(q, kc, vc, meta, i["scale"], out=poison((n, hq, d), F32), num_splits=splits,
                                 q8_out=q8, rope=rope)
        out = got[0] if q8 else got
        stored = [c.reshape(-1, *c.shape[2:])[meta.slot_mapping].astype(F32) for c in (kc, vc)]
        return (out, *stored) + ((own_q8_blocks(out, got[1], got[2]),) if q8 else ())

    ROWS.append(KernelRow("attn_decode", f"mma-rope-{name}", make_rope, ref_rope, cuda_rope, 3e-3))

OPS = [  # CudaOps.attention: stores the new K/V, then picks decode or prefill
    ("prefill-b3-hkv2-g4-d64", [(50, 50), (80, 20), (9, 1)], 2, 4, 64, False),
    ("decode-flag-b3-hkv2-g4-d128", [(1, 1), (40, 1), (300, 1)], 2, 4, 128, True),
    ("decode-implicit-b2-hkv2-g2-d32", [(10, 1), (20, 1)], 2, 2, 32, False),
    ("prefill-split-chunk-over-prefix-b2-hkv2-g4-d128", [(2100, 48), (1500, 1)], 2, 4, 128, False),
]
for name, seqs, hkv, group, d, decode_only in OPS:
    def make(rng, seqs=seqs, hkv=hkv, group=group, d=d, decode_only=decode_only):
        i = make_case(rng, seqs, hkv, group, d)
        i["meta"].decode_only = decode_only
        return i

    def cuda(i, poison):
        from pocketcupy.backend.ops_cuda import CudaOps

        cp = _cp()
        kc, vc = cp.asarray(i["kc"]), cp.asarray(i["vc"])
        return CudaOps().attention(cp.asarray(i["q"]), cp.asarray(i["k"]), cp.asarray(i["v"]), kc, vc, i["meta"],
                                   i["scale"])

    ROWS.append(KernelRow("ops.attention", name, make, reference, cuda, 3e-3))

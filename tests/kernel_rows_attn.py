"""Kernel-table rows for paged attention: causal prefill (plain and tensor-core variants), split-K
decode, and CudaOps.attention (store + kernel choice). Block tables are random permutations of
the cache blocks; every cache slot outside a sequence's context holds NaN, so a kernel that reads
past a context (or a padded table entry) fails. The reference runs NumPyOps.attention on the same
fp16-rounded K/V in float32."""
import math

import numpy as np

from pocketcupy.backend.attention_meta import AttentionMetadata
from pocketcupy.backend.ops_ref import NumpyOps

from .kernel_table import KernelRow, q8_blocks_dequantized, q8k_blocks_dequantized

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


def make_rope_case(rng, ctxs, hkv, group, d, rot_half):
    """A decode case (one new token per sequence of the given context lengths) with the new tokens'
    positions and the inverse frequencies of rot_half rotated pairs, for the kernels doing RoPE."""
    from .kernel_rows_core import _inv_freq

    i = make_case(rng, [(c, 1) for c in ctxs], hkv, group, d)
    i["pos"] = np.asarray([c - 1 for c in ctxs], np.int64)
    i["inv"] = _inv_freq(2 * rot_half)
    return i


def reference(i):
    return REF.attention(i["q"], i["k"], i["v"], i["kc"].astype(F32), i["vc"].astype(F32), i["meta"], i["scale"])


def stored_caches(i):
    """The caches with the new tokens already written (what the attention kernels read)."""
    kc, vc = i["kc"].copy(), i["vc"].copy()
    REF.store_kv(kc, vc, i["k"], i["v"], i["meta"].slot_mapping)
    return kc, vc


def own_q8_blocks(out, blocks, per256: bool = False):
    """The int8 blocks a decode kernel wrote of its output ((xq, xds) per 32, (xq, xd, xb) per 256),
    dequantized, after checking that they are exactly quantize_x (quantize_x_q8k) of that output."""
    from pocketcupy.backend.kquant_mma_cuda import quantize_x_q8k
    from pocketcupy.backend.linear_cuda import quantize_x

    x = out.reshape(len(out), -1)
    for got, want in zip(blocks, quantize_x_q8k(x) if per256 else quantize_x(x)):
        _cp().testing.assert_array_equal(got, want)
    return q8k_blocks_dequantized(*blocks) if per256 else q8_blocks_dequantized(*blocks)


def q8_reference(out, per256: bool):
    """The reference output's int8 round trip, per 32 or per 256 values."""
    from pocketcupy.quant.act_q8 import q8_roundtrip, q8k_roundtrip

    return (q8k_roundtrip if per256 else q8_roundtrip)(out.reshape(len(out), -1))


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
    ("b3-mixed-hkv2-g4-d256", [(100, 100), (300, 45), (17, 1)], 2, 4, 256, 16),   # plain only: q tile in fp16
]
MMA_MAX_HEAD_DIM = 128      # attn_cuda.PREFILL_MMA_HEAD_DIMS
PLAIN_TOL = {256: 1e-3}     # the plain kernel's fp16 query tile past head dim 128
for variant, tol in [("plain", 1e-4), ("mma", 3e-3)]:
    for name, seqs, hkv, group, d, bs in PREFILL:
        if variant == "mma" and d > MMA_MAX_HEAD_DIM:
            continue
        def cuda(i, poison, variant=variant):
            kc, vc = stored_caches(i)
            cp = _cp()
            return _attn().attn_prefill(cp.asarray(i["q"]), cp.asarray(kc), cp.asarray(vc), i["meta"], i["scale"],
                                        out=poison(i["q"].shape, F32), variant=variant)

        ROWS.append(KernelRow(
            "attn_prefill", f"{variant}-{name}",
            lambda rng, seqs=seqs, hkv=hkv, group=group, d=d, bs=bs: make_case(rng, seqs, hkv, group, d, bs),
            reference, cuda, PLAIN_TOL.get(d, tol) if variant == "plain" else tol))

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
    ("split3-b3-prefix-hkv2-g4-d256", [(2000, 40), (700, 33), (50, 50)], 2, 4, 256, 3),
]
for variant, tol in [("plain", 1e-4), ("mma", 3e-3)]:
    for name, seqs, hkv, group, d, splits in PREFILL_SPLIT:
        if variant == "mma" and d > MMA_MAX_HEAD_DIM:
            continue
        def cuda(i, poison, variant=variant, splits=splits):
            kc, vc = stored_caches(i)
            cp = _cp()
            return _attn().attn_prefill(cp.asarray(i["q"]), cp.asarray(kc), cp.asarray(vc), i["meta"], i["scale"],
                                        out=poison(i["q"].shape, F32), variant=variant, num_splits=splits)

        ROWS.append(KernelRow(
            "attn_prefill", f"{variant}-{name}",
            lambda rng, seqs=seqs, hkv=hkv, group=group, d=d: make_case(rng, seqs, hkv, group, d),
            reference, cuda, PLAIN_TOL.get(d, tol) if variant == "plain" else tol))

DECODE = [  # id, context lengths, hkv, group, head_dim, num_splits (None = the launcher's choice)
    ("b1-ctx1-hkv2-g1-d64", [1], 2, 1, 64, None),
    ("b4-ctx1-17-hkv2-g4-d128", [1, 15, 16, 17], 2, 4, 128, None),
    ("b3-long-hkv2-g3-d64", [1000, 5000, 77], 2, 3, 64, None),
    ("b2-splits1-hkv1-g8-d128", [300, 2000], 1, 8, 128, 1),
    ("b2-splits7-hkv2-g4-d128", [300, 2000], 2, 4, 128, 7),
    ("b2-splits64-short-hkv2-g4-d128", [70, 129], 2, 4, 128, 64),   # mostly empty splits
    ("b2-splits40-hkv2-g4-d128", [3000, 700], 2, 4, 128, 40),       # 38 splits used: merged 16 at a time
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

# The mma decode kernel writing its output's int8 blocks too (the output projection's input), per 32
# ("q8") or per 256 values ("q8k"): one split, splits merged by the last block, rows of the last
# 8-lane group past the block's values (group 1 at head dim 64), a block of one super-block (half
# its threads without values) and of four (two rounds of the block's threads). The blocks must be
# exactly quantize_x (quantize_x_q8k) of the kernel's own output.
DECODE_Q8 = [  # id, context lengths, hkv, group, head_dim, num_splits, q8
    ("b2-splits1-hkv2-g4-d128", [300, 2000], 2, 4, 128, 1, "q8"),
    ("b3-splitsauto-hkv2-g4-d128", [1, 700, 3000], 2, 4, 128, None, "q8"),
    ("b2-splits5-hkv3-g1-d64", [900, 130], 3, 1, 64, 5, "q8"),
    ("b1-splits16-hkv8-g4-d128", [512], 8, 4, 128, 16, "q8"),
    ("b2-splits1-hkv2-g4-d128", [300, 2000], 2, 4, 128, 1, "q8k"),
    ("b4-splitsauto-hkv8-g4-d128", [1, 700, 3000, 512], 8, 4, 128, None, "q8k"),
    ("b3-splits3-hkv4-g2-d128", [90, 1000, 2], 4, 2, 128, 3, "q8k"),
    ("b3-splits1-hkv2-g4-d64", [5, 640, 17], 2, 4, 64, 1, "q8k"),
    ("b2-splits4-hkv1-g8-d128", [333, 1200], 1, 8, 128, 4, "q8k"),
]
for name, ctxs, hkv, group, d, splits, q8 in DECODE_Q8:
    def ref_q8(i, q8=q8):
        out = reference(i)
        return out, q8_reference(out, q8 == "q8k")

    def cuda_q8(i, poison, splits=splits, q8=q8):
        kc, vc = stored_caches(i)
        cp = _cp()
        args = (cp.asarray(i["q"]), cp.asarray(kc), cp.asarray(vc), i["meta"], i["scale"])
        for _ in range(2):     # twice: the split counters are back at zero after a launch
            out, blocks = _attn().attn_decode(*args, q8=q8, out=poison(i["q"].shape, F32), num_splits=splits,
                                              variant="mma")
        return out, own_q8_blocks(out, blocks, q8 == "q8k")

    ROWS.append(KernelRow(
        "attn_decode", f"mma-{q8}out-{name}",
        lambda rng, ctxs=ctxs, hkv=hkv, group=group, d=d: make_case(rng, [(c, 1) for c in ctxs], hkv, group, d),
        ref_q8, cuda_q8, 3e-3))

# The mma decode kernel applying RoPE and storing the new K/V itself (q, k, v column views of one
# QKV row, as the model passes them; the new tokens' cache slots NaN beforehand): its output and the
# stored slots against rope_store_kv + paged attention; with int8 output blocks (then exactly
# quantize_x of its own output) and without.
DECODE_ROPE = [  # id, context lengths, hkv, group, head_dim, rot_half, interleaved, num_splits, q8
    ("halves-b2-splits1-hkv2-g4-d128", [300, 2000], 2, 4, 128, 64, False, 1, ""),
    ("interleaved-b3-splitsauto-hkv2-g4-d128", [1, 700, 3000], 2, 4, 128, 64, True, None, "q8"),
    ("halves-partial-b2-splits5-hkv3-g3-d64", [900, 130], 3, 3, 64, 16, False, 5, "q8"),
    ("interleaved-b1-splits16-hkv8-g4-d128", [512], 8, 4, 128, 64, True, 16, ""),
    ("halves-b1-ctx1-hkv1-g9-d64", [1], 1, 9, 64, 32, False, None, "q8"),
    ("halves-b4-splitsauto-hkv8-g4-d128-q8k", [512, 513, 700, 1], 8, 4, 128, 64, False, None, "q8k"),
]
for name, ctxs, hkv, group, d, rot, interleaved, splits, q8 in DECODE_ROPE:
    def ref_rope(i, interleaved=interleaved, q8=q8):
        kc, vc, slots = i["kc"].copy(), i["vc"].copy(), i["meta"].slot_mapping
        q = REF.rope_store_kv(i["q"], i["k"], i["v"], i["pos"], i["inv"], interleaved, kc, vc, slots)
        out = REF.paged_attention(q, kc.astype(F32), vc.astype(F32), i["meta"], i["scale"])
        stored = [c.reshape(-1, *c.shape[2:])[slots].astype(F32) for c in (kc, vc)]
        return (out, *stored) + ((q8_reference(out, q8 == "q8k"),) if q8 else ())

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
            args = (q, kc, vc, meta, i["scale"])
            kw = dict(out=poison((n, hq, d), F32), num_splits=splits, rope=rope)
            out, blocks = at.attn_decode(*args, q8=q8, **kw) if q8 else (at.attn_decode(*args, **kw), None)
        stored = [c.reshape(-1, *c.shape[2:])[meta.slot_mapping].astype(F32) for c in (kc, vc)]
        return (out, *stored) + ((own_q8_blocks(out, blocks, q8 == "q8k"),) if q8 else ())

    ROWS.append(KernelRow("attn_decode", f"mma-rope-{name}",
                          lambda rng, c=ctxs, h=hkv, g=group, d=d, r=rot: make_rope_case(rng, c, h, g, d, r),
                          ref_rope, cuda_rope, 3e-3))

OPS = [  # CudaOps.attention: stores the new K/V, then picks decode or prefill
    ("prefill-b3-hkv2-g4-d64", [(50, 50), (80, 20), (9, 1)], 2, 4, 64, False),
    ("decode-flag-b3-hkv2-g4-d128", [(1, 1), (40, 1), (300, 1)], 2, 4, 128, True),
    ("decode-implicit-b2-hkv2-g2-d32", [(10, 1), (20, 1)], 2, 2, 32, False),
    ("prefill-split-chunk-over-prefix-b2-hkv2-g4-d128", [(2100, 48), (1500, 1)], 2, 4, 128, False),
    ("decode-flag-b3-hkv2-g4-d256", [(1, 1), (40, 1), (300, 1)], 2, 4, 256, True),   # no decode kernel: prefill's
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

# CudaOps.rope_attention feeding an int8-activation K-quant weight (the output projection): at
# batch 1 the decode kernel writes its output's int8 blocks of 32 for the GEMV, at batch 4 those of
# 256 for the K-quant tensor-core kernel. The projection of what it returns must equal, bit for
# bit, the projection of the bare output (which then quantizes it itself).
ROPE_FEEDS = [  # id, context lengths, hkv, group, head_dim, per256
    ("b1-hkv2-g4-d64-q8", [300], 2, 4, 64, False),
    ("b4-hkv2-g4-d64-q8k", [300, 1, 77, 1000], 2, 4, 64, True),
]
for name, ctxs, hkv, group, d, per256 in ROPE_FEEDS:
    def make_feeds(rng, ctxs=ctxs, hkv=hkv, group=group, d=d):
        from .gguf_blocks import random_blocks

        i = make_rope_case(rng, ctxs, hkv, group, d, d // 2)
        i["w"] = random_blocks(rng, "Q4_K", 48, hkv * group * d)
        return i

    def ref_feeds(i, per256=per256):
        from pocketcupy.quant.qtensor import QTensor

        kc, vc = i["kc"].copy(), i["vc"].copy()
        x = REF.rope_attention(i["q"], i["k"], i["v"], i["pos"], i["inv"], False, kc, vc, i["meta"], i["scale"])
        x = x.reshape(len(x), -1)
        w = QTensor("Q4_K", (48, x.shape[1]), i["w"]).dequantize().astype(np.float64)
        return x, q8_reference(x, per256).astype(np.float64) @ w.T

    def cuda_feeds(i, poison, per256=per256):
        from pocketcupy.backend import linear_cuda
        from pocketcupy.backend.kquant_mma_cuda import gguf_mma_tiles, quantize_x_q8k
        from pocketcupy.backend.ops_cuda import CudaOps
        from pocketcupy.backend.weight_cuda import Q8Rows, prepare_weight
        from pocketcupy.quant.qtensor import QTensor

        cp = _cp()
        n, hq, _ = i["q"].shape
        w = prepare_weight(QTensor("Q4_K", (48, hq * d), i["w"]), "q8")
        assert bool(gguf_mma_tiles(w, n)) == per256
        got = CudaOps().rope_attention(cp.asarray(i["q"]), cp.asarray(i["k"]), cp.asarray(i["v"]), cp.asarray(i["pos"]),
                                       cp.asarray(i["inv"]), False, cp.asarray(i["kc"]), cp.asarray(i["vc"]), i["meta"],
                                       i["scale"], feeds=[w])
        assert isinstance(got, Q8Rows) and (got.xk is not None) == per256
        y = linear_cuda.linear(got, w)
        x = got.x.copy()   # the same linear over a standalone quantizer's blocks of the same output
        xk = quantize_x_q8k(x) if per256 else None
        cp.testing.assert_array_equal(y, linear_cuda.linear(Q8Rows(x, *linear_cuda.quantize_x(x), xk), w))
        return got.x, y

    # 1e-2: the projections of two slightly different outputs' int8 blocks differ by rounding flips (H200,
    # batch 1: 4.1e-3); the blocks' exactness is cuda_feeds' bit-equality check, the attention's accuracy
    # the RoPE rows' 3e-3
    ROWS.append(KernelRow("ops.rope_attention", f"feeds-{name}", make_feeds, ref_feeds, cuda_feeds, 1e-2))

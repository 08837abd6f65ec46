"""CuPy launchers for paged attention over the KV cache, fp16 or quantized pages (kv_pages_cuda;
cuda_src/attn_prefill.cu, attn_decode.cu, attn_decode_mma.cu, and attn_prefill_kv8.cu /
attn_decode_mma_kv8.cu for int8 / fp8 / k8v4 codes): causal prefill (also covers prefix + chunk and mixed
batches; split-KV when a short chunk over a long prefix gives too few blocks to fill the GPU)
and split-K decode (tensor cores from sm_80 on, splits merged by the kernel's last block).

Metadata arrays are device int32 arrays (`device_meta` uploads host ones). Grids depend only on
array shapes (N, B, heads, block-table width), never on device values, so decode launches can be
captured in CUDA graphs."""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import numpy as np

from ..quant.kv_quant import QuantKVCache
from .attention_meta import AttentionMetadata
from .elementwise_cuda import _k, check_f32, index_array, row_view
from .kernels import cuda_op, has_tensor_cores, null_arg, num_sms
from .kv_pages_cuda import KvArgs, kv_args

_I32, _I64, _F32 = np.int32, np.int64, np.float32
LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128, 256)  # the prefill kernels', instantiated in the .cu files
PREFILL_MMA_HEAD_DIMS = (16, 32, 64, 128)   # 256: the plain kernel (the mma one's tiles outgrow shared memory)
DECODE_HEAD_DIMS = (16, 32, 64, 128)        # the decode kernels'; decode rows of other head dims take the prefill kernel
DECODE_MAX_GROUP = 16               # DEC_MAXG in attn_decode.cu
DECODE_MAX_SPLITS = 64
DECODE_MIN_CHUNK = {"plain": 32, "mma": 64}   # DEC_MIN_CHUNK / DM_MIN_CHUNK: fewer keys per split is not worth one
# blocks per SM a decode launch aims for: the mma kernel's warps stream their keys with loads in
# flight, so a block per SM (each warp several 16-key steps) fills the memory pipe at batch 1;
# batches in DECODE_BATCHED_RANGE take twice the splits, their merge being one atomic (H200, Q4_K_M
# 8B decode graphs at ctx 512, alternated in one process: batch 8 2,676-2,680 against 2,723-2,731
# us, batch 4 2,519-2,520 against 2,520-2,521; batch 2 lost, 2,448-2,451 against 2,444-2,445, and
# batch 1 tied, 2,032-2,039 against 2,031-2,034)
DECODE_BLOCKS_PER_SM = {"plain": 4, "mma": 1}
DECODE_BATCHED_BLOCKS_PER_SM = {"plain": 4, "mma": 2}
DECODE_BATCHED_RANGE = (3, 8)
DECODE_MMA_HEAD_DIMS = (64, 128)
DECODE_G8_GROUP = 8                 # groups of at most this many query heads take the _g8 mma kernels
# 8-bit K goes through the mma kernel's shared-memory KRing (32-key steps, copied two ahead) where a
# launch's longest split has at least this many keys, else in registers in 16-key steps as fp16 K
# does (the _k16 kernels): the ring pays once a warp has steps to pipeline, and on a 64-key split it
# leaves two of the four warps idle (H100, int8 pages, alone: batch 1 at ctx 513 / 1,024 / 4,096 /
# 32,768, splits of 64 / 64 / 256 / 2,048 keys: 6.47 / 6.73 / 9.13 / 39.0 us through the ring against
# 5.48 / 5.75 / 9.58 / 57.7 in registers; the batch-1 Q4_K_M decode graph at ctx 512 2,374 -> 2,243 us)
DECODE_RING_MIN_KEYS = 256
# Decode graphs over 8-bit pages are kept apart for batches whose longest context is at most this
# (DecodeGraphs): theirs take the _k16 kernels wherever splits of this context are short.
DECODE_SHORT_CONTEXT = 1024
DECODE_COUNTERS = 1 << 16           # (sequence, KV head) pairs whose splits the mma kernel merges itself
PREFILL_TILE = {"plain": 16, "mma": 64}
PREFILL_SPLIT_MIN_CONTEXT = 1024    # no split below this many keys (the longest context)
PREFILL_SPLIT_MIN_CHUNK = 256       # fewest keys per split at the longest context
PREFILL_MAX_SPLITS = 32
PREFILL_SPLIT_ALIGN = 64            # PF_SPLIT_ALIGN in attn_prefill.cuh: split lengths round up to it


def _cp():
    import cupy

    return cupy


def device_meta(meta: AttentionMetadata) -> AttentionMetadata:
    """`meta` with query_start, seq_lens, block_tables as contiguous device int32 arrays and
    slot_mapping as a device int32/int64 array (arrays already in that form are kept as they are)."""
    cp = _cp()

    def i32(a):
        return cp.ascontiguousarray(cp.asarray(a, dtype=np.int32))

    if all(isinstance(a, cp.ndarray) and a.dtype == np.int32 and a.flags.c_contiguous
           for a in (meta.query_start, meta.seq_lens, meta.block_tables)) and isinstance(meta.slot_mapping, cp.ndarray) \
            and meta.slot_mapping.dtype in (np.int32, np.int64):
        return meta
    return dataclasses.replace(meta, query_start=i32(meta.query_start), seq_lens=i32(meta.seq_lens),
                               block_tables=i32(meta.block_tables), slot_mapping=index_array(meta.slot_mapping))


def _check(q, k_cache, v_cache) -> tuple[int, int, int, int, KvArgs]:
    check_f32("attention", q)
    n, hq, d = q.shape
    kv = kv_args("attention", k_cache, v_cache)
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d or hq % hkv:
        raise ValueError(f"attention: q {q.shape} does not fit the cache {k_cache.shape}")
    if d not in HEAD_DIMS or (kv.tag == "k8v4" and d % 32):   # k8v4: values in groups of 32
        raise NotImplementedError(f"attention: head_dim {d} has no CUDA kernel for {kv.tag} pages (have {HEAD_DIMS})")
    return n, hq, d, hkv, kv


def _out(out, shape):
    if out is None:
        return _cp().empty(shape, np.float32)
    if tuple(out.shape) != tuple(shape) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"attention: out must be a contiguous float32 array of shape {tuple(shape)}")
    return out


def prefill_variant(head_dim: int) -> str:
    """Tensor cores (mma.sync m16n8k16) from sm_80 on up to head dim 128; the plain kernel elsewhere."""
    return "mma" if has_tensor_cores() and head_dim in PREFILL_MMA_HEAD_DIMS else "plain"


def prefill_splits(tiles: int, num_heads: int, max_context: int, sms: int) -> int:
    """Key splits per (query tile, head) block of a prefill launch of `tiles` x `num_heads` blocks:
    1 when the launch already fills the GPU (>= 2 blocks per SM) or the longest context is short;
    else enough splits for ~4 blocks per SM, none shorter than PREFILL_SPLIT_MIN_CHUNK keys at
    max_context. Depends only on shapes (a CUDA graph replays the same grid)."""
    blocks = tiles * num_heads
    if blocks >= 2 * sms or max_context <= PREFILL_SPLIT_MIN_CONTEXT:
        return 1
    want = max(1, min(math.ceil(4 * sms / max(1, blocks)), PREFILL_MAX_SPLITS,
                      max_context // PREFILL_SPLIT_MIN_CHUNK))
    chunk = -(-math.ceil(max_context / want) // PREFILL_SPLIT_ALIGN) * PREFILL_SPLIT_ALIGN
    return math.ceil(max_context / chunk)       # no split of a max_context-long tile is empty


@cuda_op("attn_prefill")
def attn_prefill(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, out=None, variant: str | None = None,
                 num_splits: int | None = None):
    """Causal attention of q [N, Hq, D] over each sequence's cached context (the cache already
    holds the new tokens). Any mix of prefill chunks and single decode rows. Returns [N, Hq, D].
    num_splits: key splits per block (None: prefill_splits' choice from the shapes, with the
    block-table width as the longest context); above 1, partials merged by the decode combine."""
    n, hq, d, hkv, kv = _check(q, k_cache, v_cache)
    meta = device_meta(meta)
    variant = variant or prefill_variant(d)
    q, qs = row_view(q, hq * d)
    if qs % 2:
        q, qs = _cp().ascontiguousarray(q), hq * d
    out = _out(out, (n, hq, d))
    b = int(meta.seq_lens.shape[0])
    if n == 0 or b == 0:
        return out
    tiles = n // PREFILL_TILE[variant] + b
    if num_splits is None:
        num_splits = prefill_splits(tiles, hq, meta.block_tables.shape[1] * meta.block_size, num_sms())
    if not 1 <= num_splits <= 65535 or (num_splits > 1 and n > 65535):
        raise ValueError(f"attn_prefill: num_splits {num_splits} out of range for {n} query rows")
    args = (q, _I64(qs), *kv.arrays, meta.query_start, meta.seq_lens, meta.block_tables,
            _I32(meta.block_tables.shape[1]), _I32(b), out, _I64(hq * d), _I32(hkv), _I32(hq // hkv),
            _I32(meta.block_size), _F32(scale * LOG2E))
    if num_splits == 1:
        _k(kv.source("attn_prefill"), f"attn_prefill_{variant}_{kv.tag}_hd{d}")((tiles, hq), (128,), args)
        return out
    cp = _cp()
    part_o = cp.empty((n, hq, num_splits, d), np.float32)
    part_lse = cp.empty((n, hq, num_splits), np.float32)
    _k(kv.source("attn_prefill"), f"attn_prefill_{variant}_split_{kv.tag}_hd{d}")(
        (tiles, hq, num_splits), (128,), args + (part_o, part_lse))
    _combine_splits(part_o, part_lse, out, n, hq, d, num_splits)
    return out


def _combine_splits(part_o, part_lse, out, rows: int, hq: int, d: int, num_splits: int) -> None:
    """attn_decode_combine_f32: each row's and head's splits merged into out (a thread a column)."""
    _k("attn_decode.cu", "attn_decode_combine_f32")(
        (hq, rows), (max(128, d),), (part_o, part_lse, out, _I64(hq * d), _I32(hq), _I32(d), _I32(num_splits)))


def decode_variant(head_dim: int) -> str:
    """Tensor cores (attn_decode_mma.cuh) from sm_80 on for head dims 64 and 128; else the plain kernel."""
    return "mma" if has_tensor_cores() and head_dim in DECODE_MMA_HEAD_DIMS else "plain"


def decode_splits(batch: int, num_kv_heads: int, max_context: int, variant: str = "plain") -> int:
    """Fixed split count for a decode launch: DECODE_BLOCKS_PER_SM blocks per SM (in
    DECODE_BATCHED_RANGE of batches DECODE_BATCHED_BLOCKS_PER_SM), no split shorter than
    DECODE_MIN_CHUNK keys at full context. Depends only on shapes."""
    batched = DECODE_BATCHED_RANGE[0] <= batch <= DECODE_BATCHED_RANGE[1]
    per_sm = (DECODE_BATCHED_BLOCKS_PER_SM if batched else DECODE_BLOCKS_PER_SM)[variant]
    want = math.ceil(per_sm * num_sms() / max(1, batch * num_kv_heads))
    if variant == "mma":               # a power of two: 16 splits beat 17 (and 8, 32) on the H200 at batch 1
        want = 1 << (want.bit_length() - 1)
    return max(1, min(want, DECODE_MAX_SPLITS, math.ceil(max_context / DECODE_MIN_CHUNK[variant])))


@functools.lru_cache(maxsize=None)
def _decode_counters(device_id: int, stream_ptr: int):
    """Zeroed int32 counters the mma decode kernel's blocks count themselves in (the last block of
    a (sequence, KV head) merges the splits and resets its counter). One set per stream, since
    launches on different streams may overlap; allocated once and never freed, so captured CUDA
    graphs keep a valid pointer."""
    return _cp().zeros(DECODE_COUNTERS, np.int32)


class DecodeRope(NamedTuple):
    """RoPE and the KV store for the tensor-core decode kernel to do itself (q then comes straight
    from the projection): the new tokens' k, v [B, Hkv, D] float32 (rows may be strided, e.g. views
    of one QKV output), positions and the cache slots int64 [B] (meta.slot_mapping), inv_freq."""
    k: object
    v: object
    positions: object
    inv_freq: object
    interleaved: bool


def decode_fuses_rope(q, k_cache, meta: AttentionMetadata, rope: DecodeRope) -> bool:
    """Whether attn_decode can take `rope` for this launch: the mma kernel, int64 positions and
    slots, a rotary part its q loads can rotate (halves layout: rot_half a multiple of 4)."""
    n, hq, d = q.shape
    rot_half = int(rope.inv_freq.shape[0])
    return (decode_variant(d) == "mma" and hq // k_cache.shape[2] <= DECODE_MAX_GROUP
            and rope.positions.dtype == np.int64 and meta.slot_mapping.dtype == np.int64
            and 2 * rot_half <= d and (rope.interleaved or rot_half % 4 == 0)
            and rope.k.dtype == np.float32 and rope.v.dtype == np.float32)


def split_keys(context: int, num_splits: int) -> int:
    """Keys per split of a context-long sequence (the mma kernel's split_chunk): whole 16-key steps,
    at least DECODE_MIN_CHUNK["mma"]."""
    chunk = -(-context // num_splits)
    return max(DECODE_MIN_CHUNK["mma"], -(-chunk // 16) * 16)


def decode_k_ring(kv_tag: str, max_context: int, num_splits: int) -> bool:
    """Whether the mma decode kernel takes 8-bit K through its KRing: quantized pages whose longest
    split (of a max_context-long sequence) has DECODE_RING_MIN_KEYS keys."""
    return kv_tag != "f16" and split_keys(max_context, num_splits) >= DECODE_RING_MIN_KEYS


def graph_short_context(k_cache, v_cache) -> int | None:
    """The longest context of a decode graph's short class (DecodeGraphs keeps such batches' graphs
    apart) where the layer's decode kernels have a short-split form (8-bit K and V pages), else None."""
    return DECODE_SHORT_CONTEXT if isinstance(k_cache, QuantKVCache) and isinstance(v_cache, QuantKVCache) else None


def decode_writes_q8(variant: str, num_splits: int, batch: int, num_kv_heads: int, q8: str,
                     block_values: int) -> bool:
    """Whether attn_decode of this launch can write its output's int8 blocks (q8 "q8" / "q8k") itself:
    the mma kernel when one block writes each output (one split, or the splits merged by their last
    block); per 256 values when a block's block_values (group x head_dim) outputs are whole super-blocks."""
    return (variant == "mma" and (num_splits == 1 or batch * num_kv_heads <= DECODE_COUNTERS)
            and (q8 != "q8k" or block_values % 256 == 0))


@cuda_op("attn_decode")
def attn_decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, out=None, num_splits: int | None = None,
                variant: str | None = None, q8: str | None = None, rope: DecodeRope | None = None,
                k_ring: bool | None = None):
    """One query row per sequence (row b of q is sequence b), split-K over the context. q [B, Hq, D].
    variant: "mma" or "plain" (None: decode_variant's choice). q8: also the output's int8 blocks,
    returned as (out, blocks) -- "q8": per 32 values (quantize_x's layout: int8 [B, Hq * D], float32
    [B, Hq * D / 32, 4]), "q8k": per 256 (quantize_x_q8k's: xq, xd, xb); None where the launch cannot
    write them (decode_writes_q8). rope: q is not yet rotated and the new tokens not yet stored; the
    kernel does both (decode_fuses_rope must hold). k_ring: 8-bit K through the mma kernel's KRing
    (None: decode_k_ring's choice for meta.max_context, else the block tables' width; fp16 pages have none)."""
    cp = _cp()
    if q8 not in (None, "q8", "q8k"):
        raise ValueError(f"attn_decode: q8 must be None, 'q8' or 'q8k', got {q8!r}")
    n, hq, d, hkv, kv = _check(q, k_cache, v_cache)
    group = hq // hkv
    variant = variant or decode_variant(d)
    if group > DECODE_MAX_GROUP or (variant == "plain" and kv.tag != "f16"):   # the plain kernel reads fp16 only
        if rope is not None:
            raise ValueError("attn_decode: this launch cannot apply RoPE itself (see decode_fuses_rope)")
        return None if q8 else attn_prefill(q, k_cache, v_cache, meta, scale, out=out)
    if variant not in DECODE_MIN_CHUNK or (variant == "mma" and d not in DECODE_MMA_HEAD_DIMS):
        raise ValueError(f"attn_decode: no {variant!r} kernel for head_dim {d}")
    meta = device_meta(meta)
    b = int(meta.seq_lens.shape[0])
    if n != b:
        raise ValueError(f"attn_decode: {n} query rows for {b} sequences")
    if rope is not None and (variant != "mma" or not decode_fuses_rope(q, k_cache, meta, rope)):
        raise ValueError("attn_decode: this launch cannot apply RoPE itself (see decode_fuses_rope)")
    q, qs = row_view(q, hq * d)
    if variant == "mma" and (q.data.ptr % 16 or qs % 4):   # its q loads are 16-byte vectors
        q, qs = row_view(cp.ascontiguousarray(q), hq * d)
    width = meta.block_tables.shape[1] * meta.block_size     # the longest context the tables can hold
    if num_splits is None:
        num_splits = decode_splits(b, hkv, width, variant)
    if not 1 <= num_splits <= DECODE_MAX_SPLITS:
        raise ValueError(f"attn_decode: num_splits {num_splits} outside 1..{DECODE_MAX_SPLITS}")
    if k_ring is None:
        k_ring = decode_k_ring(kv.tag, width if meta.max_context is None else meta.max_context, num_splits)
    elif k_ring and kv.tag == "f16":
        raise ValueError("attn_decode: k_ring needs 8-bit K pages")
    if q8 and (b == 0 or not decode_writes_q8(variant, num_splits, b, hkv, q8, group * d)):
        return None
    out = _out(out, (n, hq, d))
    if b == 0:
        return out
    if num_splits > 1:
        part_o = cp.empty((b, hq, num_splits, d), np.float32)
        part_lse = cp.empty((b, hq, num_splits), np.float32)
    else:
        part_o = part_lse = out              # unused by the kernel
    caches = kv.arrays if variant == "mma" else kv.arrays[:2]     # the plain kernel: fp16, no scales
    head = (q, _I64(qs), *caches, meta.block_tables, _I32(meta.block_tables.shape[1]), meta.seq_lens,
            out, _I64(hq * d), part_o, part_lse)
    tail = (_I32(hkv), _I32(group), _I32(meta.block_size), _I32(num_splits), _F32(scale * LOG2E))
    fused = variant == "mma" and b * hkv <= DECODE_COUNTERS
    if variant == "mma":
        counters = (_decode_counters(cp.cuda.Device().id, cp.cuda.get_current_stream().ptr) if fused
                    else null_arg())   # attn_decode_combine_f32 merges
        xq = xds = xd = xb = null_arg()    # no int8 blocks
        if q8 == "q8":
            blocks = xq, xds = cp.empty((b, hq * d), np.int8), cp.empty((b, hq * d // 32, 4), np.float32)
        elif q8 == "q8k":
            blocks = xq, xd, xb = (cp.empty((hq * d // 32, b, 32), np.int8), cp.empty((b, hq * d // 256), np.float32),
                                   cp.empty((b, hq * d // 32), np.int16))
        args = head + (counters,) + tail + (xq, xds, xd, xb)
        if rope is not None:
            k, ks = row_view(rope.k, hkv * d)
            v, vs = row_view(rope.v, hkv * d)
            args += (k, _I64(ks), v, _I64(vs), rope.positions, meta.slot_mapping,
                     cp.asarray(rope.inv_freq, dtype=np.float32), _I32(rope.inv_freq.shape[0]),
                     _I32(rope.interleaved))
        name = f"attn_decode_mma{'_rope' if rope is not None else ''}_{kv.tag}_hd{d}"
        name += "_k16" if kv.tag != "f16" and not k_ring else ""
        _k(kv.source("attn_decode_mma"), name + ("_g8" if group <= DECODE_G8_GROUP else ""))(
            (num_splits, hkv, b), (128,), args)
        if q8:
            return out, blocks
    else:
        _k("attn_decode.cu", f"attn_decode_split_f16_hd{d}")((num_splits, hkv, b), (128,), head + tail)
    if num_splits > 1 and not fused:
        _combine_splits(part_o, part_lse, out, b, hq, d, num_splits)
    return out

"""Multi-head latent attention (DeepSeek-V2/V3) on the CUDA backend, in the absorbed form that
NumpyOps.mla_attention computes: each head's W_UK multiplied into its query and W_UV onto its output
by strided-batched cuBLAS GEMMs straight from kv_b_proj's rows (float32, capturable), RoPE on the
rotary parts (elementwise_cuda.rope), the latent rows stored into K pages of one KV head and
attention over them (cuda_src/attn_mla.cu: fp16, int8 or fp8 pages; key splits for short batches,
merged by the decode combine). Plain CUDA cores: no tensor-core MLA kernel yet."""
from __future__ import annotations

import math

import numpy as np

from ..quant.kv_quant import QuantKVCache
from .attention_meta import AttentionMetadata
from .attn_cuda import LOG2E, _combine_splits, device_meta
from .cublas_graph import COMPUTE_32F, GEMM_DEFAULT, OP_N, OP_T, R_32F, gemm_strided_batched_ex
from .elementwise_cuda import _cp, _k, check_f32, index_array, rope
from .kernels import cuda_op, null_arg, num_sms

MLA_MAX_DIM = 576           # MLA_MAX_DIM in attn_mla.cu: kv_lora_rank + qk_rope_head_dim
MLA_HEADS = 16              # heads a block (MLA_HEADS)
MLA_MIN_CHUNK = 32          # fewest keys a split (two tiles)
MLA_MAX_SPLITS = 128
MLA_BLOCKS_PER_SM = 1       # what the split count aims for (one 256-thread block of ~220 registers a thread fits)
PAGE_TAGS = {"int8": "i8", "fp8": "e4m3"}


def check_dims(latent_dim: int) -> None:
    """ValueError where the kernels do not take rows of latent_dim = kv_lora_rank + qk_rope_head_dim."""
    if latent_dim > MLA_MAX_DIM or latent_dim % 8:
        raise ValueError(f"model: kv_lora_rank + qk_rope_head_dim = {latent_dim} has no CUDA MLA kernel (they take "
                         f"multiples of 8 up to {MLA_MAX_DIM}); device='cpu' runs it")


def absorbed_weight(t):
    """kv_b_proj [H * (dn + dv), R] as the float32 device matrix mla_attention multiplies by (each
    head's W_UK rows, then its W_UV rows)."""
    return _cp().asarray(t.dequantize(), dtype=np.float32)


def _pages(cache):
    """(kernel tag, codes or values, scales) of a layer's latent pages."""
    if isinstance(cache, QuantKVCache):
        if cache.kind not in PAGE_TAGS:
            raise TypeError(f"mla_attention: no CUDA kernel for {cache.kind} pages")
        return PAGE_TAGS[cache.kind], cache.codes, cache.params
    if getattr(cache, "dtype", None) != np.float16:
        raise TypeError(f"mla_attention: the cache must be float16 pages or QuantKVCache codes, got "
                        f"{type(cache).__name__} {getattr(cache, 'dtype', '')}")
    return "f16", cache, null_arg()


def store_latent(x, cache, slot_mapping) -> None:
    """x [N, D] float32 rows (row-contiguous) into the latent pages [blocks, block_size, 1, D] at
    slot_mapping [N] (negative: skipped)."""
    tag, codes, scales = _pages(cache)
    n, d = x.shape
    if x.strides[1] != 4 or tuple(cache.shape[2:]) != (1, d):
        raise ValueError(f"mla_attention: latent rows {x.shape} do not fit the pages {cache.shape}")
    if n:
        slots = _cp().asarray(slot_mapping, dtype=np.int64)
        _k("attn_mla.cu", f"mla_store_{tag}")((math.ceil(n / 4),), (128,),
                                              (x, np.int64(x.strides[0] // 4), slots, codes, scales, np.int32(n),
                                               np.int32(d)))


def mla_splits(rows: int, heads: int, max_context: int) -> int:
    """Key splits of an attn_mla launch, from shapes only (a CUDA graph replays the grid): none once
    the rows fill MLA_BLOCKS_PER_SM blocks an SM, else enough to, none shorter than MLA_MIN_CHUNK keys."""
    blocks = rows * math.ceil(heads / MLA_HEADS)
    want = math.ceil(MLA_BLOCKS_PER_SM * num_sms() / max(1, blocks))
    return max(1, min(want, MLA_MAX_SPLITS, max_context // MLA_MIN_CHUNK))


@cuda_op("attn_mla")
def attn_mla(q, cache, meta: AttentionMetadata, scale: float, rope_dim: int, num_splits: int | None = None):
    """Causal attention of q [N, H, D] (latent queries) over each sequence's latent rows in the
    pages (the new tokens' already stored), values their columns rope_dim: -> [N, H, D - rope_dim]."""
    cp = _cp()
    check_f32("attn_mla", q)
    tag, codes, scales = _pages(cache)
    n, h, d = q.shape
    check_dims(d)
    meta = device_meta(meta)
    q = cp.ascontiguousarray(q)
    r, b = d - rope_dim, int(meta.seq_lens.shape[0])
    out = cp.empty((n, h, r), np.float32)
    if n == 0 or b == 0:
        return out
    if num_splits is None:
        num_splits = mla_splits(n, h, meta.block_tables.shape[1] * meta.block_size)
    grid = (n, math.ceil(h / MLA_HEADS), num_splits)
    parts = (cp.empty((n, h, num_splits, r), np.float32), cp.empty((n, h, num_splits), np.float32)) \
        if num_splits > 1 else (null_arg(), null_arg())
    _k("attn_mla.cu", f"attn_mla_{tag}")(
        grid, (256,), (q, codes, scales, meta.query_start, meta.seq_lens, meta.block_tables,
                       np.int32(meta.block_tables.shape[1]), np.int32(b), np.int32(h), np.int32(d),
                       np.int32(rope_dim), np.int32(meta.block_size), np.float32(scale * LOG2E), out, *parts))
    if num_splits > 1:
        _combine_splits(*parts, out, n, h, r, num_splits)
    return out


@cuda_op("mla_attention")
def mla_attention(q, c_kv, k_pe, positions, inv_freq, interleaved: bool, w_kv_b, cache,
                  meta: AttentionMetadata, scale: float):
    """NumpyOps.mla_attention: q [N, H, dn + r], c_kv [N, R], k_pe [N, r] float32, w_kv_b the
    absorbed_weight -> [N, H * dv]."""
    cp = _cp()
    for name, a in (("q", q), ("c_kv", c_kv), ("k_pe", k_pe), ("w_kv_b", w_kv_b)):
        check_f32(f"mla_attention {name}", a)
    n, h, qd = q.shape
    r, rank = k_pe.shape[1], c_kv.shape[1]
    dn, d = qd - r, r + rank
    dv = w_kv_b.shape[0] // h - dn
    positions, meta = index_array(positions), device_meta(meta)
    q = cp.ascontiguousarray(q)
    # q_latent = [q_pe, q_nope W_UK] per head: (W_UK [dn, R] row-major) x q_nope in cuBLAS's column-major terms
    q_lat = cp.empty((n, h, d), np.float32)
    q_lat[..., :r] = q[..., dn:]
    latent = cp.empty((n, 1, d), np.float32)
    latent[:, 0, :r] = k_pe
    latent[:, 0, r:] = c_kv
    if n:
        gemm_strided_batched_ex(OP_N, OP_N, rank, n, dn, w_kv_b.data.ptr, R_32F, rank, (dn + dv) * rank,
                                q.data.ptr, R_32F, h * qd, qd, q_lat.data.ptr + 4 * r, R_32F, h * d, d, h,
                                COMPUTE_32F, GEMM_DEFAULT)
    rope(q_lat, positions, inv_freq, interleaved, out=q_lat)
    rope(latent, positions, inv_freq, interleaved, out=latent)
    store_latent(latent.reshape(n, d), cache, meta.slot_mapping)
    o = attn_mla(q_lat, cache, meta, scale, r)                        # [N, H, R]
    y = cp.empty((n, h * dv), np.float32)
    if n:
        # y_h = o_h W_UV^T: (W_UV [dv, R] row-major, transposed) x o_h
        gemm_strided_batched_ex(OP_T, OP_N, dv, n, rank, w_kv_b.data.ptr + 4 * dn * rank, R_32F, rank,
                                (dn + dv) * rank, o.data.ptr, R_32F, h * rank, rank, y.data.ptr, R_32F, h * dv, dv,
                                h, COMPUTE_32F, GEMM_DEFAULT)
    return y

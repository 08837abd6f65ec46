"""The CUDA backend: NumpyOps' interface over CuPy arrays and our kernels. Activations are float32;
weights stay in their stored format (weight_cuda); the paged KV cache is float16, or int8 / fp8 /
k8v4 codes with their scales per row (kv_cache_dtype; kv_pages_cuda).
Importing this module does not import CuPy; creating a CudaOps does."""
from __future__ import annotations

import numpy as np

from . import attn_cuda, elementwise_cuda, linear_cuda, linear_norm_cuda, mla_cuda, moe_cuda, recurrent_cuda
from .attention_meta import AttentionMetadata
from .kquant_mma_cuda import gguf_mma_tiles
from .kv_pages_cuda import KV_CACHE_DTYPES, empty_kv_pages
from .weight_cuda import CudaWeight, Half16Rows, Q8Rows, concat_rows, prepare_weight


def _decode_batch(q, meta: AttentionMetadata) -> bool:
    """Every sequence has one query row (the decode kernels' case); else some has several."""
    return meta.decode_only or q.shape[0] == meta.num_seqs


class CudaOps:
    name = "cuda"
    kv_dtype_bytes = 2  # float16 KV cache
    kv_cache_dtypes = KV_CACHE_DTYPES   # fp16 ("auto"), int8, fp8 and k8v4 pages (kv_pages_cuda.py)

    def __init__(self, quant_activations: str = "auto"):
        import cupy

        from ..quant.act_q8 import check_mode

        self.xp = cupy
        self.quant_activations = check_mode(quant_activations)

    # --- data movement -------------------------------------------------------------------
    def weight(self, t):
        return prepare_weight(t, self.quant_activations)

    def mla_weight(self, t):
        """kv_b_proj as mla_attention takes it: float32 on the device (mla_cuda.absorbed_weight)."""
        return mla_cuda.absorbed_weight(t)

    def concat_rows(self, ws):
        """Fused QKV / gate+up weights (or their biases): one weight whose rows are those of ws,
        or None when the parts differ in format or column count (separate projections then)."""
        if any(w is None for w in ws):
            return None
        if all(isinstance(w, self.xp.ndarray) and w.ndim == 1 for w in ws):
            return self.xp.concatenate(ws)
        return concat_rows(ws)

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def check_config(self, config) -> None:
        """A ValueError naming the field where the kernels do not take a model's sizes: the attention
        head dim (MLA: the latent row's), a Gated DeltaNet's key head dim and conv width, the routers'
        top-k and groups."""
        checks = []
        if config.mla is not None:
            mla_cuda.check_dims(config.head_dim)
        elif config.num_kv_layers:
            checks.append(("head_dim", config.head_dim, attn_cuda.HEAD_DIMS))
        if config.gdn is not None:
            checks += [("linear_key_head_dim", config.gdn.linear_key_head_dim,
                        tuple(4 * r for r in recurrent_cuda.DELTA_ROWS)),
                       ("linear_conv_kernel_dim", config.gdn.linear_conv_kernel_dim,
                        range(1, recurrent_cuda.CONV_MAX_K + 1))]
        if config.moe is not None:
            checks.append(("num_experts_per_tok", config.moe.num_experts_per_tok,
                           range(1, moe_cuda.ROUTE_MAX_TOP_K + 1)))
            if hasattr(config.moe, "n_group"):                              # DeepSeek-V3's router
                checks.append(("n_group", config.moe.n_group, range(1, moe_cuda.ROUTE_MAX_GROUPS + 1)))
                checks.append(("topk_method", config.moe.topk_method, ("noaux_tc", "greedy")))
        for field, value, allowed in checks:
            if value not in allowed:
                takes = (f"{allowed.start} to {allowed.stop - 1}" if isinstance(allowed, range)
                         else ", ".join(map(str, allowed)))
                raise ValueError(f"model: {field} {value} has no CUDA kernel (they take {takes}); "
                                 f"device='cpu' runs it")

    def to_host(self, a) -> np.ndarray:
        return self.xp.asnumpy(a) if isinstance(a, self.xp.ndarray) else np.asarray(a)

    def argmax_rows(self, x) -> np.ndarray:
        """The first index of each row's maximum, on the host (the sampler's argmax kernel)."""
        from .sampler_cuda import argmax
        return self.to_host(argmax(x))

    def scatter_tokens(self, ids, dst_rows, tokens, src_rows) -> None:
        """ids[dst_rows] = tokens[src_rows] on the device (the previous step's sampled ids)."""
        elementwise_cuda.scatter_tokens(ids, dst_rows, tokens, src_rows)

    def upload_meta(self, meta: AttentionMetadata) -> AttentionMetadata:
        """Attention metadata with its arrays on the device (int32)."""
        return attn_cuda.device_meta(meta)

    def empty_kv_cache(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                       dtype: str = "auto", values: bool = True):
        """One layer's K and V pages (V None where not values): fp16, or codes with their scales per
        row (kv_pages_cuda.py)."""
        return empty_kv_pages(num_blocks, block_size, num_kv_heads, head_dim, dtype, values)

    # --- elementwise / normalisation -----------------------------------------------------
    def embedding(self, table, ids):
        ids = self.xp.asarray(ids)
        if isinstance(table, CudaWeight):
            return linear_cuda.get_rows(table, ids)
        return self.xp.ascontiguousarray(table[ids], dtype=np.float32)

    def rms_norm(self, x, w, eps: float):
        return elementwise_cuda.rms_norm(x, w, eps)

    def add_rms_norm(self, x, residual, w, eps: float, feeds=None):
        """residual += x (in place); returns (rms_norm(residual) * w, residual). When every weight
        in feeds takes int8 activations, the output comes with its int8 blocks (Q8Rows, quantized
        by the norm kernel itself: per 256 values when they all run on the K-quant tensor-core
        kernel at this batch, else per 32) so those linears skip their own quantization; when
        they are all fp16 (or all bf16) and the batch goes to cuBLAS, with its 16-bit rounding
        (Half16Rows) so the GEMMs skip their cast."""
        n, dim = x.shape[0], x.shape[-1]
        if feeds and all(isinstance(f, CudaWeight) and f.cols == dim for f in feeds):
            if all(gguf_mma_tiles(f, n) for f in feeds):
                fused = elementwise_cuda.add_rms_norm_q8k(x, residual, w, eps)
                if fused is not None:
                    out, residual, *xk = fused
                    return Q8Rows(out, None, None, tuple(xk)), residual
            if n <= linear_cuda.QUANT_GEMV_MAX_BATCH and all(f.act_q8 for f in feeds):
                fused = elementwise_cuda.add_rms_norm_q8(x, residual, w, eps)
                if fused is not None:
                    out, residual, xq, xds = fused
                    return Q8Rows(out, xq, xds), residual
            qtype = linear_cuda.half16_type(feeds[0])
            if qtype and all(linear_cuda.half16_type(f) == qtype and linear_cuda.gemm_batch(f, n) for f in feeds):
                fused = elementwise_cuda.add_rms_norm_h16(x, residual, w, eps, qtype)
                if fused is not None:
                    out, residual, x16 = fused
                    return Half16Rows(out, x16, qtype), residual
        return elementwise_cuda.add_rms_norm(x, residual, w, eps)

    def add_rms_norm_linear(self, x, residual, w_norm, eps: float, w, bias=None):
        """(linear(h, w, bias), residual') for h, residual' = add_rms_norm(x, residual, w_norm, eps):
        one launch where the GEMV can normalise its input itself (linear_cuda.norm_linear_lanes),
        else the two ops (the norm writing the int8 or 16-bit copy w reads)."""
        fused = linear_cuda.add_rms_norm_linear(x, residual, w_norm, eps, w, bias)
        if fused is not None:
            return fused
        h, residual = self.add_rms_norm(x, residual, w_norm, eps, feeds=[w])
        return self.linear(h, w, bias), residual

    def linear_add_rms_norm(self, x, w, residual, w_norm, eps: float, feeds, up=None):
        """add_rms_norm(linear(x, w), residual, w_norm, eps, feeds) (with up: of silu(x) * up) in the
        GEMV's launch: the batch-1 K-quant or Q8_0 GEMV writes the int8 blocks the feeds read
        (linear_norm_cuda); None elsewhere."""
        return linear_norm_cuda.linear_add_rms_norm(x, w, residual, w_norm, eps, feeds, up=up)

    def add_rms_norm_mlp(self, x, residual, w_norm, eps: float, w_gate_up, w_down):
        """(silu_mul_linear(gate, up, w_down), residual') for [gate; up], residual' =
        add_rms_norm_linear(x, residual, w_norm, eps, w_gate_up): where the GEMV normalises its own
        input it also writes silu(gate) * up (linear_cuda.add_rms_norm_silu_mul), so the down
        projection is a plain GEMV; fp16 / bf16 weights on cuBLAS keep gate / up in 16 bits
        (linear_cuda.dense_mlp)."""
        fused = linear_cuda.add_rms_norm_silu_mul(x, residual, w_norm, eps, w_gate_up)
        if fused is not None:
            act, residual = fused
            return self.linear(act, w_down), residual
        if linear_cuda.dense_mlp_applies(x.shape[0], w_gate_up, w_down):
            h, residual = self.add_rms_norm(x, residual, w_norm, eps, feeds=[w_gate_up])
            return linear_cuda.dense_mlp(h, w_gate_up, w_down), residual
        gu, residual = self.add_rms_norm_linear(x, residual, w_norm, eps, w_gate_up)
        inter = gu.shape[1] // 2
        return self.silu_mul_linear(gu[:, :inter], gu[:, inter:], w_down), residual

    def silu_mul(self, gate, up):
        return elementwise_cuda.silu_mul(gate, up)

    def sigmoid_mul(self, gate, x):
        return elementwise_cuda.sigmoid_mul(gate, x)

    def add(self, a, b):
        return elementwise_cuda.add(a, b)

    def linear(self, x, w, bias=None):
        return linear_cuda.linear(x, w, bias)

    def linears(self, x, ws, biases=None):
        """[linear(x, w, b) ...] for the projections of one input; int8-activation weights share
        one quantization of x."""
        return linear_cuda.linears(x, ws, biases)

    def silu_mul_linear(self, gate, up, w):
        """linear(silu_mul(gate, up), w); one kernel for quantized short-row weights at small batch."""
        return linear_cuda.silu_mul_linear(gate, up, w)

    def rope(self, x, positions, inv_freq, interleaved: bool):
        return elementwise_cuda.rope(x, positions, inv_freq, interleaved)

    # --- attention -----------------------------------------------------------------------
    def store_kv(self, k_cache, v_cache, k, v, slot_mapping):
        elementwise_cuda.store_kv(k_cache, v_cache, k, v, slot_mapping)

    def rope_store_kv(self, q, k, v, positions, inv_freq, interleaved: bool, k_cache, v_cache, slot_mapping):
        """RoPE on q and k, rotated k and v into the paged cache, in one kernel; returns the rotated q."""
        return elementwise_cuda.rope_store_kv(q, k, v, positions, inv_freq, interleaved, k_cache, v_cache,
                                              slot_mapping)

    def attention(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
        """Writes k, v of the new tokens into the paged cache, then causal attention of every
        query row over its sequence's context."""
        meta = attn_cuda.device_meta(meta)
        elementwise_cuda.store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        return self.paged_attention(q, k_cache, v_cache, meta, scale)

    def rope_attention(self, q, k, v, positions, inv_freq, interleaved: bool, k_cache, v_cache,
                       meta: AttentionMetadata, scale: float, feeds=None):
        """rope_store_kv then paged_attention (same contract); a decode batch on the tensor-core
        kernel does it in one launch, the kernel rotating q and storing the new K/V itself (not where
        rows read K/V that other rows store: meta.shared_context)."""
        meta = attn_cuda.device_meta(meta)
        if _decode_batch(q, meta) and not meta.shared_context:
            rope = attn_cuda.DecodeRope(k, v, elementwise_cuda.index_array(positions), inv_freq, interleaved)
            if attn_cuda.decode_fuses_rope(q, k_cache, meta, rope):
                out = self._decode_attention(q, k_cache, v_cache, meta, scale, feeds, rope)
                if out is not None:
                    return out
        q = self.rope_store_kv(q, k, v, positions, inv_freq, interleaved, k_cache, v_cache, meta.slot_mapping)
        return self.paged_attention(q, k_cache, v_cache, meta, scale, feeds)

    def paged_attention(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, feeds=None):
        """Causal attention over the paged cache (the new tokens already stored). Decode kernel
        when every sequence has one row and the head dim has one (attn_cuda.DECODE_HEAD_DIMS).
        feeds: the weights that read the output; then it comes as [N, Hq * D] rows, with their int8
        blocks (Q8Rows, written by the decode kernel itself: per 32, or per 256 when they all run on
        the K-quant tensor-core kernel at this batch) when every weight in feeds takes int8
        activations."""
        meta = attn_cuda.device_meta(meta)
        n, hq, d = q.shape
        if not _decode_batch(q, meta) or d not in attn_cuda.DECODE_HEAD_DIMS:
            out = attn_cuda.attn_prefill(q, k_cache, v_cache, meta, scale)
            return out if feeds is None else out.reshape(n, hq * d)
        return self._decode_attention(q, k_cache, v_cache, meta, scale, feeds)

    def _decode_attention(self, q, k_cache, v_cache, meta, scale, feeds, rope=None):
        """The decode kernel's output as paged_attention returns it; None where `rope` is given
        and the launch cannot also write the per-32 int8 blocks the feeds want (feeds taking blocks
        per 256 then quantize the output themselves)."""
        n, hq, d = q.shape
        int8_feeds = feeds and all(isinstance(f, CudaWeight) and f.act_q8 and f.cols == hq * d for f in feeds)
        if int8_feeds and all(gguf_mma_tiles(f, n) for f in feeds):   # int8 per 256 values
            got = attn_cuda.attn_decode(q, k_cache, v_cache, meta, scale, rope=rope, q8="q8k")
            if got is not None:
                out, xk = got
                return Q8Rows(out.reshape(n, hq * d), None, None, xk)
        elif int8_feeds and n <= linear_cuda.QUANT_GEMV_MAX_BATCH and not any(
                gguf_mma_tiles(f, n) for f in feeds):                 # int8 per 32
            got = attn_cuda.attn_decode(q, k_cache, v_cache, meta, scale, rope=rope, q8="q8")
            if got is not None:
                out, (xq, xds) = got
                return Q8Rows(out.reshape(n, hq * d), xq, xds)
            if rope is not None:
                return None
        out = attn_cuda.attn_decode(q, k_cache, v_cache, meta, scale, rope=rope)
        return out if feeds is None else out.reshape(n, hq * d)

    def mla_attention(self, q, c_kv, k_pe, positions, inv_freq, interleaved: bool, w_kv_b, cache,
                      meta: AttentionMetadata, scale: float):
        """Multi-head latent attention, absorbed (mla_cuda); w_kv_b from mla_weight."""
        return mla_cuda.mla_attention(q, c_kv, k_pe, positions, inv_freq, interleaved, w_kv_b, cache, meta, scale)

    # --- mixtures of experts and Gated DeltaNet (moe_cuda, recurrent_cuda) -----------------
    def moe_route(self, logits, bias, n_group: int, topk_group: int, top_k: int, norm: bool, scaling: float):
        return moe_cuda.moe_route(logits, bias, n_group, topk_group, top_k, norm, scaling)

    def moe_route_softmax(self, logits, top_k: int, norm: bool, n_group: int = 1, topk_group: int = 1):
        if n_group > 1:
            raise ValueError("model: topk_method 'group_limited_greedy' (DeepSeek-V2) has no CUDA kernel; "
                             "device='cpu' runs it")
        return moe_cuda.moe_route_softmax(logits, top_k, norm)

    def moe_experts(self, x, ids, weights, w_gate, w_up, w_down):
        """The routed experts: per (row, pick) pair where experts_capturable, else sorted by expert
        on the host (moe_cuda)."""
        return moe_cuda.moe_experts(x, ids, weights, w_gate, w_up, w_down)

    def experts_capturable(self, w_gate, w_up, w_down) -> bool:
        """Whether moe_experts reads nothing on the host at decode batches (so graphs can hold it)."""
        return moe_cuda.experts_capturable(w_gate, w_up, w_down)

    def causal_conv1d_silu(self, x, w, conv_states, slots, query_start):
        return recurrent_cuda.causal_conv1d_silu(x, w, conv_states, slots, query_start)

    def gated_delta_rule(self, q, k, v, b, a, a_log, dt_bias, states, slots, query_start):
        return recurrent_cuda.gated_delta_rule(q, k, v, b, a, a_log, dt_bias, states, slots, query_start)

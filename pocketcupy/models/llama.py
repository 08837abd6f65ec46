"""The Llama family (Llama 2/3, SmolLM, Qwen2 with QKV bias, Qwen3 with q/k norm),
written once against the ops interface."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..dist.parallel import TensorParallel
from ..quant.qtensor import QTensor
from .rope import inv_freq
from .weights import check_shapes, weight_loader

# How each weight is split over tensor-parallel ranks (dist/layout.py); the others are replicated.
# Column-parallel QKV and gate/up, row-parallel attention output and down (then an all-reduce),
# vocab-parallel embedding and LM head.
TP_SPLITS = {"attn_q": "q_rows", "attn_k": "kv_rows", "attn_v": "kv_rows", "attn_output": "q_cols",
             "ffn_gate": "ffn_rows", "ffn_up": "ffn_rows", "ffn_down": "ffn_cols",
             "token_embd": "vocab_rows", "output": "vocab_rows"}


@dataclass
class LlamaLayer:
    attn_norm: object
    wq: object
    wk: object
    wv: object
    wo: object
    ffn_norm: object
    w_gate: object
    w_up: object
    w_down: object
    bq: object = None
    bk: object = None
    bv: object = None
    q_norm: object = None
    k_norm: object = None
    wqkv: object = None          # fused [wq; wk; wv] (ops.concat_rows) when the parts share a format
    bqkv: object = None
    w_gate_up: object = None     # fused [w_gate; w_up]

    @property
    def attn_inputs(self) -> list:
        """The weights that read the attention norm's output."""
        return [self.wqkv] if self.wqkv is not None else [self.wq, self.wk, self.wv]

    @property
    def ffn_inputs(self) -> list:
        """The weights that read the MLP norm's output."""
        return [self.w_gate_up] if self.w_gate_up is not None else [self.w_gate, self.w_up]


def weight_shapes(c: ModelConfig) -> dict[str, tuple]:
    """Name -> shape (torch order) of every weight the model may read, from the config."""
    h, q, kv, ff = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
    shapes = {"token_embd.weight": (c.vocab_size, h), "output.weight": (c.vocab_size, h),
              "output_norm.weight": (h,), "rope_freqs.weight": (c.rope_dim // 2,)}
    layer = {"attn_norm.weight": (h,), "attn_q.weight": (q, h), "attn_k.weight": (kv, h), "attn_v.weight": (kv, h),
             "attn_output.weight": (h, q), "ffn_norm.weight": (h,), "ffn_gate.weight": (ff, h),
             "ffn_up.weight": (ff, h), "ffn_down.weight": (h, ff), "attn_q.bias": (q,), "attn_k.bias": (kv,),
             "attn_v.bias": (kv,), "attn_q_norm.weight": (c.head_dim,), "attn_k_norm.weight": (c.head_dim,)}
    for i in range(c.num_layers):
        shapes.update({f"blk.{i}.{k}": v for k, v in layer.items()})
    return shapes


class LlamaModel:
    TP_SPLITS = TP_SPLITS

    @staticmethod
    def check_weights(config: ModelConfig, tensors: dict[str, QTensor]) -> None:
        c = config
        check_shapes(tensors, weight_shapes(c), c.num_layers,
                     f"vocab {c.vocab_size}, hidden {c.hidden_size}, {c.num_heads} heads and {c.num_kv_heads} KV "
                     f"heads of {c.head_dim}, intermediate {c.intermediate_size}")

    def __init__(self, config: ModelConfig, tensors: dict[str, QTensor], ops, tp: TensorParallel | None = None):
        self.config, self.ops = config, ops
        self.tp = tp or TensorParallel.single(config)
        self.layout = self.tp.layout   # this rank's heads, KV heads, MLP columns, vocabulary rows

        w = weight_loader(tensors, lambda name, t: ops.weight(self.tp.shard(name, t, TP_SPLITS)))
        self.embed = w("token_embd.weight")
        self.lm_head = self.embed if config.tie_word_embeddings else w("output.weight")
        self.final_norm = w("output_norm.weight")
        self.layers = []
        for i in range(config.num_layers):
            p = f"blk.{i}."
            layer = LlamaLayer(
                attn_norm=w(p + "attn_norm.weight"), wq=w(p + "attn_q.weight"), wk=w(p + "attn_k.weight"),
                wv=w(p + "attn_v.weight"), wo=w(p + "attn_output.weight"), ffn_norm=w(p + "ffn_norm.weight"),
                w_gate=w(p + "ffn_gate.weight"), w_up=w(p + "ffn_up.weight"), w_down=w(p + "ffn_down.weight"),
                bq=w(p + "attn_q.bias", config.qkv_bias), bk=w(p + "attn_k.bias", config.qkv_bias),
                bv=w(p + "attn_v.bias", config.qkv_bias),
                q_norm=w(p + "attn_q_norm.weight", config.qk_norm), k_norm=w(p + "attn_k_norm.weight", config.qk_norm),
            )
            fuse_projections(ops, layer)
            self.layers.append(layer)
        freq_factors = tensors.get("rope_freqs.weight")
        self.inv_freq = ops.asarray(inv_freq(config, None if freq_factors is None else freq_factors.dequantize()))
        self.scale = 1.0 / float(np.sqrt(config.head_dim))

    def forward(self, input_ids, positions, meta, kv_caches):
        """input_ids, positions [N] (flat batch) -> final hidden states [N, hidden]."""
        ops, c = self.ops, self.config
        n = len(input_ids)
        x = self.tp.embedding(ops, self.embed, input_ids)
        residual = h = None     # h: the attention norm's output where the down projection before wrote it
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            # a norm feeding one fused weight goes with it (one launch where the GEMV can normalise)
            if h is not None:
                q, k, v = self._qkv(layer, h, n)
            elif residual is None:
                residual = x
                q, k, v = self._qkv(layer, ops.rms_norm(x, layer.attn_norm, c.rms_eps), n)
            elif layer.wqkv is not None:
                qkv, residual = ops.add_rms_norm_linear(x, residual, layer.attn_norm, c.rms_eps, layer.wqkv,
                                                        layer.bqkv)
                q, k, v = self._split_qkv(qkv, n)
            else:
                h, residual = ops.add_rms_norm(x, residual, layer.attn_norm, c.rms_eps, feeds=layer.attn_inputs)
                q, k, v = self._qkv(layer, h, n)
            if c.qk_norm:
                q = ops.rms_norm(q, layer.q_norm, c.rms_eps)
                k = ops.rms_norm(k, layer.k_norm, c.rms_eps)
            attn = ops.rope_attention(q, k, v, positions, self.inv_freq, c.rope_interleaved, k_cache, v_cache, meta,
                                      self.scale, feeds=[layer.wo])   # [n, Hq * D]
            nxt = self.layers[i + 1] if i + 1 < len(self.layers) else None
            x, residual, h = self._o_and_mlp(layer, attn, residual, nxt)
        h, _ = ops.add_rms_norm(x, residual, self.final_norm, c.rms_eps)
        return h

    def _o_and_mlp(self, layer, attn, residual, nxt):
        """The o projection and the MLP of a layer: (x, residual, None) with x to add to the
        residual, or (None, residual, h) where the down projection wrote the next layer's (nxt's)
        attention norm itself."""
        ops, c = self.ops, self.config
        fused = self._linear_norm(attn, layer.wo, residual, layer.ffn_norm, layer.ffn_inputs)
        if fused is None:
            x = self.tp.all_reduce(ops.linear(attn, layer.wo))
            if layer.w_gate_up is not None:
                y, residual = ops.add_rms_norm_mlp(x, residual, layer.ffn_norm, c.rms_eps, layer.w_gate_up,
                                                   layer.w_down)
                return self.tp.all_reduce(y), residual, None
            h, residual = ops.add_rms_norm(x, residual, layer.ffn_norm, c.rms_eps, feeds=layer.ffn_inputs)
        else:
            h, residual = fused
        if layer.w_gate_up is not None:
            gu = ops.linear(h, layer.w_gate_up)
            gate, up = gu[:, :gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
        else:
            gate, up = ops.linears(h, [layer.w_gate, layer.w_up])
        fused = None if nxt is None else self._linear_norm(gate, layer.w_down, residual, nxt.attn_norm,
                                                             nxt.attn_inputs, up=up)
        if fused is not None:
            return None, fused[1], fused[0]
        return self.tp.all_reduce(ops.silu_mul_linear(gate, up, layer.w_down)), residual, None

    def _linear_norm(self, x, w, residual, w_norm, feeds, up=None):
        """ops.linear_add_rms_norm (None where the backend does not fuse them, or where the ranks
        must all-reduce the linear's output before the norm)."""
        if self.tp.world > 1:
            return None
        return self.ops.linear_add_rms_norm(x, w, residual, w_norm, self.config.rms_eps, feeds, up=up)

    def _qkv(self, layer, h, n):
        """q [n, Hq, D], k and v [n, Hkv, D]: column views of one fused projection when there is one."""
        ops, hd, hq, hkv = self.ops, self.config.head_dim, self.layout.num_heads, self.layout.num_kv_heads
        if layer.wqkv is not None:
            return self._split_qkv(ops.linear(h, layer.wqkv, layer.bqkv), n)
        q, k, v = ops.linears(h, [layer.wq, layer.wk, layer.wv], [layer.bq, layer.bk, layer.bv])
        return q.reshape(n, hq, hd), k.reshape(n, hkv, hd), v.reshape(n, hkv, hd)

    def _split_qkv(self, qkv, n):
        """q [n, Hq, D], k and v [n, Hkv, D] as column views of the fused projection's output."""
        hd, hq, hkv = self.config.head_dim, self.layout.num_heads, self.layout.num_kv_heads
        qd, kd = hq * hd, hkv * hd
        return (qkv[:, :qd].reshape(n, hq, hd), qkv[:, qd:qd + kd].reshape(n, hkv, hd),
                qkv[:, qd + kd:].reshape(n, hkv, hd))

    def compute_logits(self, hidden):
        return self.tp.logits(self.ops, self.ops.linear(hidden, self.lm_head))


def fuse_projections(ops, layer: LlamaLayer) -> None:
    """Join wq/wk/wv and w_gate/w_up into one weight each where ops.concat_rows can (same format
    and column count); the parts are dropped so their memory is freed."""
    wqkv = ops.concat_rows([layer.wq, layer.wk, layer.wv])
    bqkv = None if layer.bq is None else ops.concat_rows([layer.bq, layer.bk, layer.bv])
    if wqkv is not None and (layer.bq is None or bqkv is not None):
        layer.wqkv, layer.bqkv = wqkv, bqkv
        layer.wq = layer.wk = layer.wv = layer.bq = layer.bk = layer.bv = None
    w_gate_up = ops.concat_rows([layer.w_gate, layer.w_up])
    if w_gate_up is not None:
        layer.w_gate_up, layer.w_gate, layer.w_up = w_gate_up, None, None

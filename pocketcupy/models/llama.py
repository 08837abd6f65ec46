"""The Llama family (Llama 2/3, SmolLM, Qwen2 with QKV bias, Qwen3 with q/k norm),
written once against the ops interface."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..quant.qtensor import QTensor
from .rope import inv_freq


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


class LlamaModel:
    def __init__(self, config: ModelConfig, tensors: dict[str, QTensor], ops):
        self.config, self.ops = config, ops

        def w(name, required=True):
            t = tensors.get(name)
            if t is None:
                if required:
                    raise ValueError(f"model: weight {name!r} is missing from the checkpoint")
                return None
            return ops.weight(t)

        self.embed = w("token_embd.weight")
        self.lm_head = self.embed if config.tie_word_embeddings else w("output.weight")
        self.final_norm = w("output_norm.weight")
        self.layers = []
        for i in range(config.num_layers):
            p = f"blk.{i}."
            self.layers.append(LlamaLayer(
                attn_norm=w(p + "attn_norm.weight"), wq=w(p + "attn_q.weight"), wk=w(p + "attn_k.weight"),
                wv=w(p + "attn_v.weight"), wo=w(p + "attn_output.weight"), ffn_norm=w(p + "ffn_norm.weight"),
                w_gate=w(p + "ffn_gate.weight"), w_up=w(p + "ffn_up.weight"), w_down=w(p + "ffn_down.weight"),
                bq=w(p + "attn_q.bias", config.qkv_bias), bk=w(p + "attn_k.bias", config.qkv_bias),
                bv=w(p + "attn_v.bias", config.qkv_bias),
                q_norm=w(p + "attn_q_norm.weight", config.qk_norm), k_norm=w(p + "attn_k_norm.weight", config.qk_norm),
            ))
        freq_factors = tensors.get("rope_freqs.weight")
        self.inv_freq = ops.asarray(inv_freq(config, None if freq_factors is None else freq_factors.dequantize()))
        self.scale = 1.0 / float(np.sqrt(config.head_dim))

    def forward(self, input_ids, positions, meta, kv_caches):
        """input_ids, positions [N] (flat batch) -> final hidden states [N, hidden]."""
        ops, c = self.ops, self.config
        n = len(input_ids)
        x = ops.embedding(self.embed, input_ids)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            if residual is None:
                residual = x
                h = ops.rms_norm(x, layer.attn_norm, c.rms_eps)
            else:
                h, residual = ops.add_rms_norm(x, residual, layer.attn_norm, c.rms_eps)
            q = ops.linear(h, layer.wq, layer.bq).reshape(n, c.num_heads, c.head_dim)
            k = ops.linear(h, layer.wk, layer.bk).reshape(n, c.num_kv_heads, c.head_dim)
            v = ops.linear(h, layer.wv, layer.bv).reshape(n, c.num_kv_heads, c.head_dim)
            if c.qk_norm:
                q = ops.rms_norm(q, layer.q_norm, c.rms_eps)
                k = ops.rms_norm(k, layer.k_norm, c.rms_eps)
            q = ops.rope(q, positions, self.inv_freq, c.rope_interleaved)
            k = ops.rope(k, positions, self.inv_freq, c.rope_interleaved)
            attn = ops.attention(q, k, v, k_cache, v_cache, meta, self.scale)
            x = ops.linear(attn.reshape(n, c.num_heads * c.head_dim), layer.wo)
            h, residual = ops.add_rms_norm(x, residual, layer.ffn_norm, c.rms_eps)
            x = ops.linear(ops.silu_mul(ops.linear(h, layer.w_gate), ops.linear(h, layer.w_up)), layer.w_down)
        h, _ = ops.add_rms_norm(x, residual, self.final_norm, c.rms_eps)
        return h

    def compute_logits(self, hidden):
        return self.ops.linear(hidden, self.lm_head)

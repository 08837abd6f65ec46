"""DeepSeek-V3 (transformers' DeepseekV3ForCausalLM): multi-head latent attention (MLA) over a KV
cache of one latent row a token, dense gated MLPs in the first first_k_dense_replace layers and a
mixture of experts after them. On a backend with the MLA and MoE ops (NumPy, CUDA); over
tensor-parallel ranks as vLLM splits it (TP_SPLITS)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..dist.parallel import TensorParallel
from ..quant.qtensor import QTensor
from .moe import MLP_TP_SPLITS, GatedMLP, MoE, graphs_capture, load_mlp, load_moe, mlp_shapes, moe_shapes
from .rope import attention_factor, inv_freq, yarn_mscale
from .weights import check_shapes, weight_loader

# How each weight is split over tensor-parallel ranks (dist/layout.py); the others are replicated.
# MLA by query head (an equal number a rank): q / q_b and kv_b (W_UK, W_UV) rows, the output's
# columns, then an all-reduce; the latent (q_a, kv_a_mqa, their norms) computed and cached whole on
# every rank. The MLPs as moe.py says; vocab-parallel embedding and LM heads (the model's, and a
# multi-token-prediction layer's own, whose decoder layer splits as the others).
TP_SPLITS = {"attn_q": "rows", "attn_q_b": "rows", "attn_kv_b": "rows", "attn_output": "cols", **MLP_TP_SPLITS,
             "token_embd": "vocab_rows", "output": "vocab_rows", "shared_head_head": "vocab_rows"}


@dataclass
class MLAttention:
    wq: object                  # q_proj, or q_b_proj after q_a_proj and q_a_norm
    wkv_a: object               # kv_a_proj_with_mqa: [c_kv; k_pe] rows
    kv_a_norm: object
    wkv_b: object               # per head: W_UK, then W_UV rows
    wo: object
    wq_a: object = None
    q_a_norm: object = None
    bq_a: object = None         # attention_bias
    bkv_a: object = None
    bo: object = None


@dataclass
class DeepseekLayer:
    attn_norm: object
    attn: MLAttention
    ffn_norm: object
    mlp: GatedMLP | MoE


def layer_shapes(c: ModelConfig, p: str, dense: bool) -> dict[str, tuple]:
    """Name -> shape (torch order) of the weights of one decoder layer, its names prefixed by p."""
    m, h, heads, r = c.mla, c.hidden_size, c.num_heads, c.rope_dim
    q_rows = heads * (m.qk_nope_head_dim + r)
    shapes = {}
    if m.q_lora_rank is None:
        shapes[p + "attn_q.weight"] = (q_rows, h)
    else:
        shapes.update({p + "attn_q_a.weight": (m.q_lora_rank, h), p + "attn_q_a.bias": (m.q_lora_rank,),
                       p + "attn_q_a_norm.weight": (m.q_lora_rank,), p + "attn_q_b.weight": (q_rows, m.q_lora_rank)})
    shapes.update({p + "attn_norm.weight": (h,), p + "attn_kv_a_mqa.weight": (c.head_dim, h),
                   p + "attn_kv_a_mqa.bias": (c.head_dim,), p + "attn_kv_a_norm.weight": (m.kv_lora_rank,),
                   p + "attn_kv_b.weight": (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
                   p + "attn_output.weight": (h, heads * m.v_head_dim), p + "attn_output.bias": (h,),
                   p + "ffn_norm.weight": (h,)})
    shapes.update(mlp_shapes(p, h, c.intermediate_size) if dense else moe_shapes(p, h, c.moe))
    return shapes


def mtp_shapes(c: ModelConfig, i: int) -> dict[str, tuple]:
    """Multi-token-prediction layer i's weights (loaded under mtp.<i>.): its own norms, eh_proj and
    head, and a decoder layer (stored as layer num_layers + i)."""
    h, p = c.hidden_size, f"mtp.{i}."
    return {p + "enorm.weight": (h,), p + "hnorm.weight": (h,), p + "eh_proj.weight": (h, 2 * h),
            p + "shared_head_norm.weight": (h,), p + "shared_head_head.weight": (c.vocab_size, h),
            **layer_shapes(c, p, is_dense(c, c.num_layers + i))}


def is_dense(c: ModelConfig, index: int) -> bool:
    """Whether decoder layer index (counting the multi-token-prediction ones after the others) has a
    dense MLP rather than experts."""
    return index < c.moe.first_k_dense_replace


def weight_shapes(c: ModelConfig) -> dict[str, tuple]:
    """Name -> shape (torch order) of every weight the model may read, from the config."""
    h = c.hidden_size
    shapes = {"token_embd.weight": (c.vocab_size, h), "output.weight": (c.vocab_size, h), "output_norm.weight": (h,)}
    for i in range(c.num_layers):
        shapes.update(layer_shapes(c, f"blk.{i}.", is_dense(c, i)))
    for i in range(c.num_nextn_predict_layers):
        shapes.update(mtp_shapes(c, i))
    return shapes


def weight_load(ops, tp: TensorParallel | None = None):
    """load(name, tensor) -> the backend's weight (tp: this rank's shard of it); kv_b_proj in the
    form its mla_attention takes."""
    def load(name, t):
        if tp is not None:
            t = tp.shard(name, t, TP_SPLITS)
        return ops.mla_weight(t) if name.endswith("attn_kv_b.weight") else ops.weight(t)
    return load


def load_layer(w, config: ModelConfig, p: str, dense: bool) -> DeepseekLayer:
    """w(name, required=True) -> the backend's weight; p: the layer's name prefix."""
    m, bias = config.mla, config.mla.attention_bias
    lora = m.q_lora_rank is not None
    attn = MLAttention(
        wq=w(p + ("attn_q_b.weight" if lora else "attn_q.weight")), wkv_a=w(p + "attn_kv_a_mqa.weight"),
        kv_a_norm=w(p + "attn_kv_a_norm.weight"), wkv_b=w(p + "attn_kv_b.weight"),
        wo=w(p + "attn_output.weight"), wq_a=w(p + "attn_q_a.weight", lora),
        q_a_norm=w(p + "attn_q_a_norm.weight", lora), bq_a=w(p + "attn_q_a.bias", lora and bias),
        bkv_a=w(p + "attn_kv_a_mqa.bias", bias), bo=w(p + "attn_output.bias", bias))
    mlp = load_mlp(w, p) if dense else load_moe(w, p, config.moe)
    return DeepseekLayer(w(p + "attn_norm.weight"), attn, w(p + "ffn_norm.weight"), mlp)


class DeepseekV3Model:
    TP_SPLITS = TP_SPLITS
    KV_VALUES = False   # the latent rows in the K pages serve as values: the runner allocates no V pages

    @staticmethod
    def check_weights(config: ModelConfig, tensors: dict[str, QTensor]) -> None:
        c, m, e = config, config.mla, config.moe
        check_shapes(tensors, weight_shapes(c), c.num_layers,
                     f"vocab {c.vocab_size}, hidden {c.hidden_size}, {c.num_heads} heads, q_lora_rank "
                     f"{m.q_lora_rank}, kv_lora_rank {m.kv_lora_rank}, qk_nope_head_dim {m.qk_nope_head_dim}, "
                     f"qk_rope_head_dim {c.rope_dim}, v_head_dim {m.v_head_dim}, intermediate {c.intermediate_size}, "
                     f"{e.n_routed_experts} experts of {e.moe_intermediate_size}")

    def __init__(self, config: ModelConfig, tensors: dict[str, QTensor], ops, tp: TensorParallel | None = None):
        self.config, self.ops = config, ops
        self.tp = tp or TensorParallel.single(config)
        self.layout = self.tp.layout   # this rank's query heads, one (latent) KV head, vocabulary rows

        w = weight_loader(tensors, weight_load(ops, self.tp))
        self.embed = w("token_embd.weight")
        self.lm_head = self.embed if config.tie_word_embeddings else w("output.weight")
        self.final_norm = w("output_norm.weight")
        self.layers = [load_layer(w, config, f"blk.{i}.", is_dense(config, i)) for i in range(config.num_layers)]
        self.CAPTURABLE = graphs_capture(ops, [layer.mlp for layer in self.layers])
        self.inv_freq = ops.asarray(inv_freq(config))
        s = config.rope_scaling
        # yarn multiplies cos and sin, so the rotated q and k, by attention_factor: their one product
        # (q_pe . k_pe) takes it squared, put on q
        self.q_rope_scale = attention_factor(s) ** 2
        mscale = yarn_mscale(s.factor, s.mscale_all_dim) if s.kind == "yarn" and s.mscale_all_dim else 1.0
        self.scale = mscale * mscale / float(np.sqrt(config.mla.qk_nope_head_dim + config.rope_dim))

    def forward(self, input_ids, positions, meta, kv_caches):
        """input_ids, positions [N] (flat batch) -> final hidden states [N, hidden]."""
        return self.forward_with_hidden(input_ids, positions, meta, kv_caches)[0]

    def forward_with_hidden(self, input_ids, positions, meta, kv_caches):
        """(final hidden states, the last layer's output before the final norm): [N, hidden] each;
        the multi-token-prediction layer reads the second."""
        ops, c = self.ops, self.config
        x, residual = self.tp.embedding(ops, self.embed, input_ids), None
        for layer, (cache, _) in zip(self.layers, kv_caches):   # no V pages (KV_VALUES)
            x, residual = self.decoder_layer(layer, x, residual, positions, meta, cache)
        return ops.add_rms_norm(x, residual, self.final_norm, c.rms_eps)

    def decoder_layer(self, layer: DeepseekLayer, x, residual, positions, meta, cache):
        """One layer: (x, residual) -> its (output, residual), their sum the hidden state after it
        (residual None before the first layer: x is the input)."""
        ops, c = self.ops, self.config
        if residual is None:
            residual, h = x, ops.rms_norm(x, layer.attn_norm, c.rms_eps)
        else:
            h, residual = ops.add_rms_norm(x, residual, layer.attn_norm, c.rms_eps)
        x = self._attention(layer.attn, h, positions, meta, cache)
        h, residual = ops.add_rms_norm(x, residual, layer.ffn_norm, c.rms_eps)
        return self.tp.all_reduce(layer.mlp(ops, h)), residual

    def _attention(self, a: MLAttention, h, positions, meta, cache):
        ops, c, m = self.ops, self.config, self.config.mla
        if a.wq_a is None:
            q, kv = ops.linears(h, [a.wq, a.wkv_a], [None, a.bkv_a])
        else:
            q_a, kv = ops.linears(h, [a.wq_a, a.wkv_a], [a.bq_a, a.bkv_a])
            q = ops.linear(ops.rms_norm(q_a, a.q_a_norm, c.rms_eps), a.wq)
        q = q.reshape(len(h), self.layout.num_heads, m.qk_nope_head_dim + c.rope_dim)
        if self.q_rope_scale != 1.0:
            q[..., m.qk_nope_head_dim:] *= self.q_rope_scale
        c_kv = ops.rms_norm(kv[:, :m.kv_lora_rank], a.kv_a_norm, c.rms_eps)
        out = ops.mla_attention(q, c_kv, kv[:, m.kv_lora_rank:], positions, self.inv_freq, c.rope_interleaved,
                                a.wkv_b, cache, meta, self.scale)
        return self.tp.row_parallel_linear(ops, out, a.wo, a.bo)

    def compute_logits(self, hidden):
        return self.tp.logits(self.ops, self.ops.linear(hidden, self.lm_head))

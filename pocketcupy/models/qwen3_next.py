"""Qwen3-Next and Qwen3.5 (transformers' Qwen3NextForCausalLM, Qwen3_5ForCausalLM,
Qwen3_5MoeForCausalLM): a hybrid of Gated DeltaNet layers (linear
attention: a causal conv and the gated delta rule over a recurrent state per sequence, kept in the
runner's state slots) and gated full-attention layers over the paged KV cache, with MoE or dense
MLPs, on a backend with the Gated DeltaNet and MoE ops. Split over tensor-parallel ranks as vLLM
does: gated attention by KV group, the Gated DeltaNet by key head with its value heads (each rank
keeps the conv and recurrent states of its own heads), a dense MLP's and each expert's columns
(moe.MLP_TP_SPLITS), the vocabulary in shards."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import GatedDeltaNetConfig, ModelConfig
from ..dist.parallel import TensorParallel
from ..quant.qtensor import QTensor
from .moe import (MLP_TP_SPLITS, GatedMLP, SparseMoE, graphs_capture, load_mlp, load_sparse_moe, mlp_shapes,
                  sparse_moe_shapes)
from .rope import inv_freq
from .weights import check_shapes, weight_loader

# How each weight is split over tensor-parallel ranks (dist/layout.py); the others are replicated.
# attn_output.bias is whole on every rank (shard.split_kind), added once after the all-reduce.
TP_SPLITS = {"attn_q": "q_gate_rows", "attn_k": "kv_rows", "attn_v": "kv_rows", "attn_output": "q_cols",
             "ssm_in_qkvz": "gdn_qkvz_rows", "ssm_in_ba": "gdn_ba_rows",
             "ssm_in_qkv": "gdn_qkv_rows", "ssm_conv1d": "gdn_qkv_rows", "ssm_in_z": "gdn_z_rows",
             "ssm_in_b": "gdn_heads", "ssm_in_a": "gdn_heads", "ssm": "gdn_heads", "ssm_out": "gdn_out_cols",
             **MLP_TP_SPLITS, "token_embd": "vocab_rows", "output": "vocab_rows"}
# Qwen3.5 stores the DeltaNet's input projections apart, in_proj_qkv / _z / _b / _a, in [q; k; v] order
SPLIT_PROJECTIONS = ("qwen3_5", "qwen3_5_moe")
# RMSNorms whose stored weight w scales by 1 + w (zero-centred): folded into 1 + w at load
ZERO_CENTRED = ("attn_norm.weight", "ffn_norm.weight", "output_norm.weight", "attn_q_norm.weight",
                "attn_k_norm.weight")


@dataclass
class GatedAttention:
    wq: object                  # q_proj: per head its query rows, then its output gate's
    wk: object
    wv: object
    wo: object
    q_norm: object
    k_norm: object
    bq: object = None           # attention_bias
    bk: object = None
    bv: object = None
    bo: object = None


@dataclass
class GatedDeltaNet:
    w_qkvz: object              # in_proj_qkvz, its rows regrouped from per key head to [q; k; v; z]
    w_ba: object                # in_proj_ba, regrouped to [b; a] (Qwen3.5: the split ones joined)
    conv: object                # conv1d [conv_dim, kernel]
    dt_bias: object
    a_log: object
    norm: object                # the gated RMSNorm's weight (plain, not zero-centred)
    w_out: object


@dataclass
class Qwen3NextLayer:
    attn_norm: object
    mixer: GatedAttention | GatedDeltaNet
    ffn_norm: object
    mlp: GatedMLP | SparseMoE


def weight_shapes(c: ModelConfig) -> dict[str, tuple]:
    """Name -> shape (torch order) of every weight the model may read, from the config."""
    h, g, hd = c.hidden_size, c.gdn, c.head_dim
    q, kv = c.num_heads * hd, c.num_kv_heads * hd
    shapes = {"token_embd.weight": (c.vocab_size, h), "output.weight": (c.vocab_size, h), "output_norm.weight": (h,)}
    for i, kind in enumerate(g.layer_types):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,)})
        if kind == "full_attention":
            shapes.update({p + "attn_q.weight": (2 * q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
                           p + "attn_output.weight": (h, q), p + "attn_q_norm.weight": (hd,),
                           p + "attn_k_norm.weight": (hd,), p + "attn_q.bias": (2 * q,), p + "attn_k.bias": (kv,),
                           p + "attn_v.bias": (kv,), p + "attn_output.bias": (h,)})
        else:
            hv = g.linear_num_value_heads
            if c.architecture in SPLIT_PROJECTIONS:
                shapes.update({p + "ssm_in_qkv.weight": (g.conv_dim, h), p + "ssm_in_z.weight": (g.value_dim, h),
                               p + "ssm_in_b.weight": (hv, h), p + "ssm_in_a.weight": (hv, h)})
            else:
                shapes.update({p + "ssm_in_qkvz.weight": (g.conv_dim + g.value_dim, h),
                               p + "ssm_in_ba.weight": (2 * hv, h)})
            shapes.update({p + "ssm_conv1d.weight": (g.conv_dim, 1, g.linear_conv_kernel_dim),
                           p + "ssm.dt_bias": (hv,), p + "ssm.A_log": (hv,),
                           p + "ssm_norm.weight": (g.linear_value_head_dim,), p + "ssm_out.weight": (h, g.value_dim)})
        shapes.update(sparse_moe_shapes(p, h, c.moe) if c.moe is not None and c.moe.is_sparse(i)
                      else mlp_shapes(p, h, c.intermediate_size))
    return shapes


def regroup(groups: int, sizes: list[int]) -> np.ndarray:
    """Row order taking rows stored per group (each group: parts of `sizes` rows in turn) to part
    by part (each part: its rows of every group in turn): transformers'
    fix_query_key_value_ordering for in_proj_qkvz (q, k, v, z per key head) and in_proj_ba."""
    starts = np.cumsum([0, *sizes])
    base = np.arange(groups)[:, None] * starts[-1]
    return np.concatenate([(base + np.arange(starts[j], starts[j + 1])).reshape(-1) for j in range(len(sizes))])


class Qwen3NextModel:
    TP_SPLITS = TP_SPLITS

    @staticmethod
    def check_weights(config: ModelConfig, tensors: dict[str, QTensor]) -> None:
        c, g = config, config.gdn
        check_shapes(tensors, weight_shapes(c), c.num_layers,
                     f"vocab {c.vocab_size}, hidden {c.hidden_size}, {c.num_heads} heads and {c.num_kv_heads} KV "
                     f"heads of {c.head_dim}, intermediate {c.intermediate_size}, linear attention "
                     f"{g.linear_num_key_heads} key heads of {g.linear_key_head_dim} and {g.linear_num_value_heads} "
                     f"value heads of {g.linear_value_head_dim}, conv kernel {g.linear_conv_kernel_dim}")

    def __init__(self, config: ModelConfig, tensors: dict[str, QTensor], ops, tp: TensorParallel | None = None):
        self.config, self.ops = config, ops
        self.tp = tp or TensorParallel.single(config)
        self.layout = self.tp.layout   # this rank's heads, DeltaNet heads, MLP columns, vocabulary rows

        def load(name, t):
            if name.endswith(ZERO_CENTRED):
                t = QTensor("F32", t.shape, 1 + t.dequantize())
            return ops.weight(t)

        raw = weight_loader(tensors, lambda name, t: self.tp.shard(name, t, TP_SPLITS))   # this rank's QTensor
        w = weight_loader(tensors, lambda name, t: load(name, self.tp.shard(name, t, TP_SPLITS)))
        self.embed = w("token_embd.weight")
        self.lm_head = self.embed if config.tie_word_embeddings else w("output.weight")
        self.final_norm = w("output_norm.weight")
        self.layers = []
        for i, kind in enumerate(config.gdn.layer_types):
            p = f"blk.{i}."
            mixer = self._load_attention(w, p) if kind == "full_attention" else self._load_deltanet(w, raw, p)
            mlp = (load_sparse_moe(w, p, config.moe) if config.moe is not None and config.moe.is_sparse(i)
                   else load_mlp(w, p))
            self.layers.append(Qwen3NextLayer(w(p + "attn_norm.weight"), mixer, w(p + "ffn_norm.weight"), mlp))
        self.CAPTURABLE = graphs_capture(ops, [layer.mlp for layer in self.layers])
        self.inv_freq = ops.asarray(inv_freq(config))
        self.scale = 1.0 / float(np.sqrt(config.head_dim))

    def _load_attention(self, w, p: str) -> GatedAttention:
        bias = self.config.qkv_bias
        return GatedAttention(
            w(p + "attn_q.weight"), w(p + "attn_k.weight"), w(p + "attn_v.weight"), w(p + "attn_output.weight"),
            w(p + "attn_q_norm.weight"), w(p + "attn_k_norm.weight"), w(p + "attn_q.bias", bias),
            w(p + "attn_k.bias", bias), w(p + "attn_v.bias", bias), w(p + "attn_output.bias", bias))

    def _load_deltanet(self, w, raw, p: str) -> GatedDeltaNet:
        g: GatedDeltaNetConfig = self.config.gdn
        hk, ratio = self.layout.deltanet.num_key, g.linear_num_value_heads // g.linear_num_key_heads   # this rank's
        dk, rdv = g.linear_key_head_dim, ratio * g.linear_value_head_dim

        def rows(names, order=None):
            """The weights' rows stacked (in order: regrouped), as one weight."""
            ts = [raw(p + name) for name in names]
            if len({t.qtype for t in ts}) > 1 or ts[0].scales is not None:   # mixed, or FP8 codes and scales
                ts = [QTensor("F32", t.shape, t.dequantize()) for t in ts]
            data = np.concatenate([np.asarray(t.data) for t in ts])
            data = data if order is None else data[order]
            return self.ops.weight(QTensor(ts[0].qtype, (len(data), ts[0].shape[1]), data))

        if self.config.architecture in SPLIT_PROJECTIONS:
            w_qkvz, w_ba = rows(["ssm_in_qkv.weight", "ssm_in_z.weight"]), rows(["ssm_in_b.weight", "ssm_in_a.weight"])
        else:
            w_qkvz = rows(["ssm_in_qkvz.weight"], regroup(hk, [dk, dk, rdv, rdv]))
            w_ba = rows(["ssm_in_ba.weight"], regroup(hk, [ratio, ratio]))
        conv = raw(p + "ssm_conv1d.weight")
        c_dim, kernel = conv.shape[0], conv.shape[2]
        return GatedDeltaNet(
            w_qkvz, w_ba, self.ops.asarray(conv.dequantize().reshape(c_dim, kernel), np.float32),   # float32 taps
            w(p + "ssm.dt_bias"), w(p + "ssm.A_log"), w(p + "ssm_norm.weight"), w(p + "ssm_out.weight"))

    @property
    def state_shapes(self) -> list[tuple[tuple, tuple]]:
        """Per Gated DeltaNet layer, one sequence's conv state [conv_dim, kernel - 1] and recurrent
        state [value heads, key dim, value dim] of this rank's heads (the runner keeps them,
        ModelRunner.states)."""
        g, d = self.config.gdn, self.layout.deltanet
        one = ((d.conv_dim, g.linear_conv_kernel_dim - 1),
               (d.num_value, g.linear_key_head_dim, g.linear_value_head_dim))
        return [one] * g.layer_types.count("linear_attention")

    def forward(self, input_ids, positions, meta, kv_caches, states):
        """input_ids, positions [N] (flat batch) -> final hidden states [N, hidden]. kv_caches: the
        full-attention layers' pages; states: the StateSlots of the Gated DeltaNet layers."""
        ops, c = self.ops, self.config
        x = self.tp.embedding(ops, self.embed, input_ids)
        residual = None
        caches, recurrent = iter(kv_caches), iter(states.layers)
        for layer in self.layers:
            if residual is None:
                residual, h = x, ops.rms_norm(x, layer.attn_norm, c.rms_eps)
            else:
                h, residual = ops.add_rms_norm(x, residual, layer.attn_norm, c.rms_eps)
            if isinstance(layer.mixer, GatedAttention):
                x = self._attention(layer.mixer, h, positions, meta, *next(caches))
            else:
                x = self._deltanet(layer.mixer, h, meta, *next(recurrent), states.rows)
            h, residual = ops.add_rms_norm(x, residual, layer.ffn_norm, c.rms_eps)
            x = self.tp.all_reduce(layer.mlp(ops, h))
        h, _ = ops.add_rms_norm(x, residual, self.final_norm, c.rms_eps)
        return h

    def _attention(self, a: GatedAttention, h, positions, meta, k_cache, v_cache):
        """Attention with q/k norms, rope on the first rope_dim dims of each head, and the output
        times sigmoid of the gate q_proj computes beside each head's query."""
        ops, c, n = self.ops, self.config, len(h)
        hd, heads, kv_heads = c.head_dim, self.layout.num_heads, self.layout.num_kv_heads
        qg = ops.linear(h, a.wq, a.bq).reshape(n, heads, 2 * hd)
        q = ops.rms_norm(qg[..., :hd], a.q_norm, c.rms_eps)
        k = ops.rms_norm(ops.linear(h, a.wk, a.bk).reshape(n, kv_heads, hd), a.k_norm, c.rms_eps)
        v = ops.linear(h, a.wv, a.bv).reshape(n, kv_heads, hd)
        out = ops.rope_attention(q, k, v, positions, self.inv_freq, False, k_cache, v_cache, meta, self.scale)
        out = ops.sigmoid_mul(qg[..., hd:].reshape(n, heads * hd), out.reshape(n, heads * hd))
        return self.tp.row_parallel_linear(ops, out, a.wo, a.bo)

    def _deltanet(self, d: GatedDeltaNet, h, meta, conv_states, recurrent_states, slots):
        """Gated DeltaNet: [q; k; v] through the causal conv (SiLU), the gated delta rule, then the
        RMSNorm of each value head's output times SiLU(z), and out_proj."""
        ops, c, g, n = self.ops, self.config, self.config.gdn, len(h)
        heads = self.layout.deltanet            # this rank's key heads and their value heads
        hv, dv, conv_dim = heads.num_value, g.linear_value_head_dim, heads.conv_dim
        qkvz, ba = ops.linears(h, [d.w_qkvz, d.w_ba])
        qkv = ops.causal_conv1d_silu(qkvz[:, :conv_dim], d.conv, conv_states, slots, meta.query_start)
        kd = heads.num_key * g.linear_key_head_dim
        q, k = (qkv[:, j * kd:(j + 1) * kd].reshape(n, -1, g.linear_key_head_dim) for j in (0, 1))
        out = ops.gated_delta_rule(q, k, qkv[:, 2 * kd:].reshape(n, hv, dv), ba[:, :hv], ba[:, hv:], d.a_log,
                                   d.dt_bias, recurrent_states, slots, meta.query_start)
        out = ops.silu_mul(qkvz[:, conv_dim:].reshape(n, hv, dv), ops.rms_norm(out, d.norm, c.rms_eps))
        if g.out_proj_tiled:      # the heads into out_proj's order: [key head, value head of it] -> transposed
            out = out.reshape(n, heads.num_key, -1, dv).transpose(0, 2, 1, 3)
        return self.tp.all_reduce(ops.linear(out.reshape(n, hv * dv), d.w_out))

    def compute_logits(self, hidden):
        return self.tp.logits(self.ops, self.ops.linear(hidden, self.lm_head))

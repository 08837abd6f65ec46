"""Qwen3-Next GGUF files (llama.cpp's architecture "qwen3next", as its convert_hf_to_gguf.py
writes Qwen3NextForCausalLM): the Gated DeltaNet and MoE metadata -> ModelConfig fields, and the
tensors -> the names models/qwen3_next.py reads.

llama.cpp's layout against the Hugging Face one: the zero-centred RMSNorm weights (attn_norm,
post_attention_norm = the model's ffn_norm, output_norm, attn_q_norm, attn_k_norm) stored as
1 + w (the model adds the 1 itself: taken off here, in float32); in_proj_qkvz split into attn_qkv
([q; k; v] of every key head) and attn_gate (z), put back here into in_proj_qkvz's per-key-head
order (older files' ssm_in is in_proj_qkvz itself); A_log stored as ssm_a = -exp(A_log); dt_bias
as ssm_dt.bias; conv1d squeezed to [channels, kernel]; the shared expert's gate as
ffn_gate_inp_shexp; the routed experts stacked (gguf_layout.py); the rope on the first
rope.dimension_count dims of each head, by halves; every MLP a mixture of experts, top-k weights
normalised (llama.cpp's graph fixes both). The multi-token-prediction layer is not read.

Qwen3.5 ("qwen35", dense MLPs, and "qwen35moe", as llama.cpp's converter writes Qwen3_5ForCausalLM /
Qwen3_5MoeForCausalLM over Qwen3-Next's conversion): the projections apart, as in the Hugging Face
layout (attn_qkv, attn_gate, ssm_beta, ssm_alpha = in_proj_qkv, _z, _b, _a), and where there are more
value heads than key heads, the value heads in tiled order (value head j of key head k at j * key
heads + k, for ggml's broadcast) rather than grouped by key head: the V rows of attn_qkv and of the
conv, attn_gate, ssm_beta, ssm_alpha, ssm_a and ssm_dt.bias are put back here (whole rows, so any
block type); ssm_out's columns stay tiled and the model orders its output heads to match
(GatedDeltaNetConfig.out_proj_tiled)."""
from __future__ import annotations

import numpy as np

from ..config import GatedDeltaNetConfig, ModelConfig, SparseMoEConfig
from ..models.qwen3_next import regroup
from ..quant.qtensor import QTensor
from .gguf_config import MetaReader
from .gguf_layout import as_f32, expert_views, layer_of

# llama.cpp's name -> the model's, for the norms stored as 1 + w
_PLUS_ONE = {"attn_norm.weight": "attn_norm.weight", "post_attention_norm.weight": "ffn_norm.weight",
             "attn_q_norm.weight": "attn_q_norm.weight", "attn_k_norm.weight": "attn_k_norm.weight"}
_RENAMED = {"ssm_dt.bias": "ssm.dt_bias", "ssm_ba.weight": "ssm_in_ba.weight", "ssm_in.weight": "ssm_in_qkvz.weight"}
# Qwen3.5's DeltaNet projections: llama.cpp's names -> the model's
_QWEN35_SPLIT = {"attn_qkv.weight": "ssm_in_qkv.weight", "attn_gate.weight": "ssm_in_z.weight",
                 "ssm_beta.weight": "ssm_in_b.weight", "ssm_alpha.weight": "ssm_in_a.weight"}
QWEN35 = ("qwen35", "qwen35moe")


def qwen3_next_fields(r: MetaReader, tensors: dict) -> dict:
    """ModelConfig's Qwen3-Next fields (those config_from_gguf reads for every architecture aside),
    as loader/safetensors_loader.py's _qwen3_next makes them from config.json."""
    layers, nextn = r.count("block_count"), r.size("nextn_predict_layers", 0)
    if nextn >= layers:
        raise r.error(f"{r.arch}.nextn_predict_layers {nextn} leaves no decoder layers of {r.arch}.block_count "
                      f"{layers}")
    n, interval = layers - nextn, r.count("full_attention_interval", 4)
    hv, inner = r.count("ssm.time_step_rank", required=True), r.count("ssm.inner_size", required=True)
    if inner % hv:
        raise r.error(f"{r.arch}.ssm.inner_size {inner} is not a multiple of {r.arch}.ssm.time_step_rank {hv} "
                      f"(the value heads)")
    gdn = GatedDeltaNetConfig(
        ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)],
        linear_conv_kernel_dim=r.count("ssm.conv_kernel", required=True),
        linear_key_head_dim=r.count("ssm.state_size", required=True), linear_value_head_dim=inner // hv,
        linear_num_key_heads=(hk := r.count("ssm.group_count", required=True)), linear_num_value_heads=hv,
        out_proj_tiled=r.arch in QWEN35 and hv != hk)
    moe = None if r.arch == "qwen35" else SparseMoEConfig(
        num_experts=r.count("expert_count", required=True), num_experts_per_tok=r.count("expert_used_count",
                                                                                        required=True),
        moe_intermediate_size=r.count("expert_feed_forward_length", required=True),
        shared_expert_intermediate_size=r.count("expert_shared_feed_forward_length",
                                                r.get("feed_forward_length")),
        norm_topk_prob=True, decoder_sparse_step=1,
        # llama.cpp runs a layer without a router as a dense MLP
        mlp_only_layers=[i for i in range(n) if f"blk.{i}.ffn_gate_inp.weight" not in tensors])
    return dict(num_layers=n, rope_dim=r.count("rope.dimension_count", required=True), rope_interleaved=False,
                qk_norm=True, gdn=gdn, moe=moe, qkv_bias=any(k.endswith(".attn_q.bias") for k in tensors))


def _qkvz(c: ModelConfig, qkv: QTensor | None, gate: QTensor | None, prefix: str, r: MetaReader) -> QTensor:
    """in_proj_qkvz (per key head: its q, k, v and z rows) from attn_qkv and attn_gate."""
    g = c.gdn
    for part, t, rows in (("attn_qkv", qkv, g.conv_dim), ("attn_gate", gate, g.value_dim)):
        if t is None:
            raise r.error(f"tensor '{prefix}{part}.weight' is missing (attn_qkv and attn_gate come in pairs)")
        if tuple(t.shape) != (rows, c.hidden_size):
            raise r.error(f"tensor '{prefix}{part}.weight' has shape {tuple(t.shape)}, but the metadata needs "
                          f"{(rows, c.hidden_size)}")
    parts = [qkv, gate] if qkv.qtype == gate.qtype else [QTensor("F32", t.shape, as_f32(t)) for t in (qkv, gate)]
    dk, rdv = g.linear_key_head_dim, g.linear_num_value_heads // g.linear_num_key_heads * g.linear_value_head_dim
    order = np.argsort(regroup(g.linear_num_key_heads, [dk, dk, rdv, rdv]))   # the inverse of the model's
    data = np.concatenate([np.asarray(t.data) for t in parts])[order]
    return QTensor(parts[0].qtype, (len(data), c.hidden_size), data)


def _untiled(t: QTensor, c: ModelConfig, first: int, width: int) -> QTensor:
    """t with its value-head rows from row `first` on (width rows a head; elements of a 1-D t) put
    from tiled order back into grouped order (the rows before first kept)."""
    g = c.gdn
    hk, per = g.linear_num_key_heads, g.linear_num_value_heads // g.linear_num_key_heads
    grouped = np.arange(g.linear_num_value_heads)
    tiled = (grouped % per) * hk + grouped // per           # where grouped head k * per + j sits
    order = np.concatenate([np.arange(first), first + (tiled[:, None] * width + np.arange(width)).reshape(-1)])
    return QTensor(t.qtype, t.shape, np.asarray(t.data)[order])


def _qwen35_tensor(c: ModelConfig, rest: str, t: QTensor) -> tuple[str, QTensor] | None:
    """A Qwen3.5 DeltaNet tensor whose value heads come tiled: (the model's name, t untiled); None
    for the others."""
    g = c.gdn
    kd = 2 * g.linear_num_key_heads * g.linear_key_head_dim
    first, width = {"attn_qkv.weight": (kd, g.linear_value_head_dim), "ssm_conv1d.weight": (kd, g.linear_value_head_dim),
                    "attn_gate.weight": (0, g.linear_value_head_dim), "ssm_beta.weight": (0, 1),
                    "ssm_alpha.weight": (0, 1), "ssm_a": (0, 1), "ssm_dt.bias": (0, 1)}.get(rest, (None, None))
    if first is None:
        return None
    if g.out_proj_tiled:
        t = _untiled(t, c, first, width)
    return _QWEN35_SPLIT.get(rest, rest), t


def qwen3_next_tensors(c: ModelConfig, tensors: dict[str, QTensor], r: MetaReader) -> dict[str, QTensor]:
    qwen35 = r.arch in QWEN35
    out: dict[str, QTensor] = {}
    split: dict[str, dict[str, QTensor]] = {}      # layer prefix -> attn_qkv / attn_gate
    for name, t in tensors.items():
        layer, rest = layer_of(name)
        if layer is not None and layer >= c.num_layers:
            continue                               # the multi-token-prediction layer
        prefix = name[:len(name) - len(rest)]
        if qwen35 and layer is not None:
            untiled = _qwen35_tensor(c, rest, t)
            if untiled is not None:
                rest, t = untiled
                if rest in _QWEN35_SPLIT.values():
                    out[prefix + rest] = t
                    continue
        if rest in _PLUS_ONE or name == "output_norm.weight":
            out[prefix + _PLUS_ONE.get(rest, rest)] = QTensor("F32", t.shape, as_f32(t) - np.float32(1))
        elif rest in ("attn_qkv.weight", "attn_gate.weight"):
            split.setdefault(prefix, {})[rest.split(".")[0]] = t
        elif rest == "ssm_a":
            with np.errstate(divide="ignore", invalid="ignore"):
                out[prefix + "ssm.A_log"] = QTensor("F32", t.shape, np.log(-as_f32(t)))
        elif rest == "ssm_conv1d.weight":
            out[prefix + rest] = QTensor(t.qtype, (t.shape[0], 1, t.shape[-1]), np.asarray(t.data)[:, None])
        elif rest == "ffn_gate_inp_shexp.weight" and len(t.shape) == 1:
            out[prefix + rest] = QTensor(t.qtype, (1, t.shape[0]), np.asarray(t.data)[None])
        else:
            out.update(expert_views(name, prefix, rest, t, r) or {prefix + _RENAMED.get(rest, rest): t})
    for prefix, parts in split.items():
        out[prefix + "ssm_in_qkvz.weight"] = _qkvz(c, parts.get("attn_qkv"), parts.get("attn_gate"), prefix, r)
    return out

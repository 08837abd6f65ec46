"""DeepSeek-V3 and V2 GGUF files (llama.cpp's architecture "deepseek2", as its convert_hf_to_gguf.py
writes DeepseekV3ForCausalLM and DeepseekV2ForCausalLM; V2's: softmax expert scores, no score
bias): the MLA and MoE metadata -> ModelConfig fields, and the tensors -> the names
models/deepseek_v3.py reads.

llama.cpp's layout against the Hugging Face one: routed experts stacked into one 3-D tensor a
projection (ffn_{gate,up,down}_exps, [expert, rows, cols]: split here into per-expert views, no
copy); kv_b_proj split per head into attn_k_b (W_UK transposed, [head, kv_lora_rank,
qk_nope_head_dim]) and attn_v_b ([head, v_head_dim, kv_lora_rank]), joined back here into
attn_kv_b (float32; older files store attn_kv_b itself); e_score_correction_bias as
exp_probs_b.bias; Q and K rows unpermuted (the rope rotates adjacent pairs, rope_interleave); the
multi-token-prediction layers, where a file has them, as layers block_count - nextn_predict_layers
on with their own weights under blk.N.nextn.*."""
from __future__ import annotations

import numpy as np

from ..config import MLAConfig, ModelConfig, MoEConfig
from ..quant.qtensor import QTensor
from .gguf_config import MetaReader
from .gguf_layout import as_f32, expert_views, layer_of

SOFTMAX, SIGMOID = 1, 2   # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_*: DeepSeek-V2's, DeepSeek-V3's


def deepseek_fields(r: MetaReader, tensors: dict) -> dict:
    """ModelConfig's DeepSeek-V3 fields (those config_from_gguf reads for every architecture
    aside): as loader/safetensors_loader.py's _deepseek_v3 makes them from config.json."""
    # none: DeepSeek-V2 files from before the key, softmax as llama.cpp reads them
    gating = r.get("expert_gating_func", SOFTMAX)
    if gating not in (SOFTMAX, SIGMOID):
        raise r.error(f"{r.arch}.expert_gating_func is {gating!r}: only softmax ({SOFTMAX}, DeepSeek-V2's) and "
                      f"sigmoid ({SIGMOID}, DeepSeek-V3's) expert scores are supported")
    n_group, topk_group = r.count("expert_group_count", 1), r.count("expert_group_used_count", 1)
    if gating == SOFTMAX and n_group > 1:
        raise r.error(f"{r.arch}.expert_group_count is {n_group}: group-limited softmax routing (DeepSeek-V2's "
                      f"group_limited_greedy) is not read from GGUF files (the safetensors folder has it)")
    kv_rank, rope_dim = r.count("attention.kv_lora_rank", required=True), r.count("rope.dimension_count", required=True)
    if f"{r.arch}.attention.key_length_mla" in r.meta:   # the key_length of the latent MQA view: kv_rank + rope
        qk_head, v_head = r.count("attention.key_length_mla"), r.count("attention.value_length_mla", required=True)
        qk_key = "attention.key_length_mla"
    else:                                                # older files: the per-head sizes
        qk_head, v_head = r.count("attention.key_length", required=True), r.count("attention.value_length",
                                                                                    required=True)
        qk_key = "attention.key_length"
    if qk_head <= rope_dim:
        raise r.error(f"{r.arch}.{qk_key} {qk_head} must exceed the rope dimension {rope_dim} "
                      f"({r.arch}.rope.dimension_count): it is qk_nope_head_dim + qk_rope_head_dim")
    q_rank = r.count("attention.q_lora_rank") if f"{r.arch}.attention.q_lora_rank" in r.meta else None
    nextn, layers = r.size("nextn_predict_layers", 0), r.count("block_count")
    if nextn >= layers:
        raise r.error(f"{r.arch}.nextn_predict_layers {nextn} leaves no decoder layers of {r.arch}.block_count "
                      f"{layers}")
    moe = MoEConfig(
        n_routed_experts=r.count("expert_count", required=True),
        num_experts_per_tok=r.count("expert_used_count", required=True),
        moe_intermediate_size=r.count("expert_feed_forward_length", required=True),
        n_shared_experts=r.count("expert_shared_count", required=True),
        first_k_dense_replace=r.size("leading_dense_block_count", 0),
        n_group=n_group, topk_group=topk_group, norm_topk_prob=r.flag("expert_weights_norm", False),
        routed_scaling_factor=r.number("expert_weights_scale", 1.0),
        **({} if gating == SIGMOID else dict(scoring_func="softmax", topk_method="greedy")))
    mla = MLAConfig(q_rank, kv_rank, qk_head - rope_dim, v_head,
                    attention_bias="blk.0.attn_kv_a_mqa.bias" in tensors)
    return dict(architecture="deepseek_v3" if gating == SIGMOID else "deepseek_v2",
                num_kv_heads=1, head_dim=kv_rank + rope_dim, rope_dim=rope_dim, rope_interleaved=True,
                num_layers=layers - nextn, num_nextn_predict_layers=nextn, mla=mla, moe=moe,
                qkv_bias=mla.attention_bias)


def _kv_b(c: ModelConfig, k_b: QTensor | None, v_b: QTensor | None, prefix: str, r: MetaReader) -> QTensor:
    """attn_kv_b (per head: W_UK rows, then W_UV rows) from llama.cpp's attn_k_b and attn_v_b."""
    m = c.mla
    want = {"attn_k_b": ((c.num_heads, m.kv_lora_rank, m.qk_nope_head_dim), "heads, kv_lora_rank, qk_nope_head_dim"),
            "attn_v_b": ((c.num_heads, m.v_head_dim, m.kv_lora_rank), "heads, v_head_dim, kv_lora_rank")}
    for part, t in (("attn_k_b", k_b), ("attn_v_b", v_b)):
        name, (shape, dims) = f"{prefix}{part}.weight", want[part]
        if t is None:
            raise r.error(f"tensor {name!r} is missing (attn_k_b and attn_v_b come in pairs)")
        if tuple(t.shape) != shape:
            raise r.error(f"tensor {name!r} has shape {tuple(t.shape)}, but the metadata needs {shape} ({dims})")
    kv = np.concatenate([as_f32(k_b).transpose(0, 2, 1), as_f32(v_b)], axis=1)
    kv = np.ascontiguousarray(kv.reshape(-1, m.kv_lora_rank))
    return QTensor("F32", kv.shape, kv)


def _target(name: str, n_layers: int, mtp: bool) -> str | None:
    """The name a tensor is read under, or None where it is not read: a multi-token-prediction
    layer's (layer n_layers + i -> mtp.<i>.*) without mtp, and its embedding (the model's own)."""
    layer, rest = layer_of(name)
    if layer is None or layer < n_layers:
        return name
    if not mtp:
        return None
    rest = rest.removeprefix("nextn.")
    return None if rest.startswith("embed_tokens.") else f"mtp.{layer - n_layers}.{rest}"


def deepseek_tensors(c: ModelConfig, tensors: dict[str, QTensor], mtp: bool, r: MetaReader) -> dict[str, QTensor]:
    out: dict[str, QTensor] = {}
    split_kv: dict[str, dict[str, QTensor]] = {}     # layer prefix -> attn_k_b / attn_v_b
    for name, t in tensors.items():
        target = _target(name, c.num_layers, mtp)
        if target is None:
            continue
        cut = target.index(".", 4) + 1 if target.startswith(("blk.", "mtp.")) else 0
        prefix, rest = target[:cut], target[cut:]      # prefix: "blk.N." / "mtp.I.", or "" (not a layer's)
        if rest in ("attn_k_b.weight", "attn_v_b.weight"):
            split_kv.setdefault(prefix, {})[rest.split(".")[0]] = t
        elif rest == "exp_probs_b.bias":
            out[prefix + "ffn_gate_inp.e_score_correction_bias"] = t
        else:
            out.update(expert_views(name, prefix, rest, t, r) or {target: t})
    for i in range(c.moe.first_k_dense_replace, c.num_layers if c.moe.scoring_func == "sigmoid" else 0):
        if f"blk.{i}.ffn_gate_inp.e_score_correction_bias" not in out:
            raise r.error(f"tensor 'blk.{i}.exp_probs_b.bias' is missing: DeepSeek-V3's router needs its expert "
                          f"score correction bias (e_score_correction_bias)")
    for prefix, parts in split_kv.items():
        if prefix + "attn_kv_b.weight" in out:
            raise r.error(f"tensor {prefix}attn_kv_b.weight and the split attn_k_b / attn_v_b are both present")
        out[prefix + "attn_kv_b.weight"] = _kv_b(c, parts.get("attn_k_b"), parts.get("attn_v_b"), prefix, r)
    return out

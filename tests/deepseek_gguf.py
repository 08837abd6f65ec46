"""The tiny DeepSeek-V3 checkpoints of tests/deepseek_checkpoints.py as llama.cpp's GGUF files
(architecture "deepseek2"), written the way llama.cpp's convert_hf_to_gguf.py (DeepseekV2Model)
writes DeepseekV3ForCausalLM: names from the gguf package's own TensorNameMap, the routed experts
stacked into one [expert, rows, cols] tensor a projection, kv_b_proj split per head into attn_k_b
(transposed) and attn_v_b, e_score_correction_bias as exp_probs_b.bias, no Q/K permutation, 1-D
tensors and the router in F32 and a row length the block type cannot take in F16 (as the
converter falls back), the MTP layer left out unless nextn (tests/gguf_writing.py: the tokenizer
and the file)."""
import gguf
import numpy as np

from .deepseek_checkpoints import config, tensors
from .gguf_writing import as_f32, write_file

_NEXTN = {"enorm": "nextn.enorm", "hnorm": "nextn.hnorm", "eh_proj": "nextn.eh_proj",
          "embed_tokens": "nextn.embed_tokens", "shared_head.norm": "nextn.shared_head_norm",
          "shared_head.head": "nextn.shared_head_head"}


def _metadata(w, cfg: dict, nextn: int) -> None:
    """DeepseekV2Model.set_gguf_parameters (with TextModel's)."""
    n = cfg["num_hidden_layers"]
    w.add_block_count(n + nextn)
    if nextn:
        w.add_nextn_predict_layers(nextn)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(1)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX if cfg["model_type"] == "deepseek_v2"
                             else gguf.ExpertGatingFuncType.SIGMOID)
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        if "mscale_all_dim" in rs:
            w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg["q_lora_rank"] is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    kv, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    w.add_kv_lora_rank(kv)
    w.add_key_length(kv + rope)
    w.add_value_length(kv)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg["norm_topk_prob"]:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)


def converted(cfg: dict, hf: dict, nextn: int = 0, split_kv_b: bool = True) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (torch order) of the HF tensors, as DeepseekV2Model.modify_tensors
    turns them (split_kv_b=False: an older converter's single attn_kv_b)."""
    n, e = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, n + nextn)
    f32 = as_f32(hf)
    out = {}
    for name, a in f32.items():
        parts = name.split(".")
        bid = int(parts[2]) if name.startswith("model.layers.") else None
        if bid is not None and bid >= n + nextn or (bid is not None and bid >= n and not nextn):
            continue                                       # skip_mtp
        if ".mlp.experts." in name:
            continue                                       # stacked below
        base, suffix = name.rsplit(".", 1)
        if suffix == "e_score_correction_bias":
            base, suffix = base + ".e_score_correction", "bias"
        if bid is not None and bid >= n and ".".join(parts[3:-1]) in _NEXTN:
            out[f"blk.{bid}.{_NEXTN['.'.join(parts[3:-1])]}.{suffix}"] = a
            continue
        if base.endswith("kv_b_proj") and split_kv_b:
            heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
            kv_b = a.reshape(heads, nope + v, a.shape[-1])
            out[names.get_name(base.replace("kv_b_proj", "k_b_proj")) + ".weight"] = kv_b[:, :nope].transpose(0, 2, 1)
            out[names.get_name(base.replace("kv_b_proj", "v_b_proj")) + ".weight"] = kv_b[:, nope:]
            continue
        out[f"{names.get_name(base)}.{suffix}"] = a
    for bid in range(cfg["first_k_dense_replace"], n + nextn):
        for proj in ("down_proj", "gate_proj", "up_proj"):
            stack = np.stack([f32[f"model.layers.{bid}.mlp.experts.{j}.{proj}.weight"] for j in range(e)])
            out[names.get_name(f"model.layers.{bid}.mlp.experts.{proj}") + ".weight"] = stack
    return out


def write_gguf(path, name: str, qtype: str = "F32", config_changes=None, tensor_map=None, nextn: int = 0,
               split_kv_b: bool = True, metadata=None, drop=()) -> str:
    """The variant name (its config updated by config_changes, its tensors tensor_map's) as a GGUF
    file at path in qtype (F32, F16 or a block type of ours); metadata: keys overridden (None:
    removed); drop: GGUF tensor names left out."""
    cfg = {**config(name), **(config_changes or {})}
    return write_file(path, "deepseek2", lambda w: _metadata(w, cfg, nextn),
                      converted(cfg, tensor_map or tensors(name), nextn, split_kv_b), qtype, ("ffn_gate_inp.weight",),
                      metadata, drop)

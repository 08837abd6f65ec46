"""The tiny Qwen3-Next checkpoints of tests/qwen3_next_checkpoints.py as llama.cpp's GGUF files
(architecture "qwen3next"), written the way llama.cpp's convert_hf_to_gguf.py (Qwen3NextModel over
Qwen2MoeModel) writes Qwen3NextForCausalLM: names from the gguf package's own TensorNameMap, the
zero-centred norm weights + 1 (not linear_attn.norm), A_log as -exp(A_log), dt_bias as
dt_proj.bias, conv1d squeezed, in_proj_qkvz split into attn_qkv ([q; k; v] of every key head) and
attn_gate (z) (legacy=True: kept whole, as ssm_in), the routed experts stacked, the router, the
shared expert's gate and the conv in F32 (tests/gguf_writing.py: the tokenizer and the file).
The Qwen3.5 variants as Qwen3_5TextModel / Qwen3_5MoeTextModel write them ("qwen35", "qwen35moe"):
their value heads tiled first (_LinearAttentionVReorderBase), then the same conversion."""
import numpy as np

import gguf

from .gguf_writing import as_f32, write_file
from .qwen3_next_checkpoints import SPLIT, config, layer_types, tensors

# our variant's model type -> llama.cpp's architecture
ARCHS = {"qwen3_next": "qwen3next", "qwen3_5_text": "qwen35", "qwen3_5_moe_text": "qwen35moe"}


def _rope(cfg: dict, key: str, default):
    return cfg.get(key) or cfg.get("rope_parameters", {}).get(key, default)


def _metadata(w, cfg: dict) -> None:
    """Qwen3NextModel.set_gguf_parameters (with Qwen2MoeModel's and TextModel's); Qwen3.5's the same
    (its multimodal rope sections aside: plain rope for text)."""
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if "intermediate_size" in cfg:
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(_rope(cfg, "rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if "num_experts" in cfg:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
    w.add_rope_dimension_count(int(cfg["head_dim"] * _rope(cfg, "partial_rotary_factor", 0.25)))


def tiled(a: np.ndarray, axis: int, cfg: dict, width: int) -> np.ndarray:
    """_LinearAttentionVReorderBase._reorder_v_heads: the value heads (width values each) along axis
    from grouped by key head to tiled order."""
    hk = cfg["linear_num_key_heads"]
    per = cfg["linear_num_value_heads"] // hk
    shape = a.shape
    a = a.reshape(shape[:axis] + (hk, per, width) + shape[axis + 1:])
    return np.swapaxes(a, axis, axis + 1).reshape(shape)


def _qwen35_reordered(name: str, a: np.ndarray, cfg: dict) -> np.ndarray:
    """What Qwen3.5's converter does to a linear_attn tensor before Qwen3-Next's conversion."""
    if "linear_attn." not in name or cfg["linear_num_key_heads"] == cfg["linear_num_value_heads"]:
        return a
    kd, dv = 2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if ".in_proj_qkv." in name or ".conv1d" in name:
        a = a.squeeze() if ".conv1d" in name else a
        return np.concatenate([a[:kd], tiled(a[kd:], 0, cfg, dv)])
    if ".in_proj_z." in name:
        return tiled(a, 0, cfg, dv)
    if ".in_proj_b." in name or ".in_proj_a." in name or name.endswith((".A_log", ".dt_bias")):
        return tiled(a, 0, cfg, 1)
    if ".out_proj." in name:
        return tiled(a, 1, cfg, dv)
    return a


def converted(cfg: dict, hf: dict, legacy: bool = False) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (torch order) of the HF tensors, as Qwen3NextModel.modify_tensors
    turns them."""
    n, e = cfg["num_hidden_layers"], cfg.get("num_experts")
    arch = ARCHS[cfg["model_type"]]
    names = gguf.get_tensor_name_map({"qwen3next": gguf.MODEL_ARCH.QWEN3NEXT, "qwen35": gguf.MODEL_ARCH.QWEN35,
                                      "qwen35moe": gguf.MODEL_ARCH.QWEN35MOE}[arch], n)
    f32 = as_f32(hf)
    if cfg["model_type"] in SPLIT:
        f32 = {k: _qwen35_reordered(k, a, cfg) for k, a in f32.items()}
    out = {}
    hk, dk, dv = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    rdv = cfg["linear_num_value_heads"] // hk * dv
    for name, a in f32.items():
        if ".mlp.experts." in name:
            continue                                       # stacked below
        if name.endswith(".A_log"):
            out[names.get_name(name)] = -np.exp(a)
            continue
        if name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif "conv1d" in name:
            a = a.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            a = a + np.float32(1)
        base, suffix = name.rsplit(".", 1)
        if base.endswith("in_proj_qkvz") and not legacy:
            groups = a.reshape(hk, 2 * dk + 2 * rdv, -1)   # per key head: q, k, v, z
            q, k, v, z = np.split(groups, np.cumsum([dk, dk, rdv]), axis=1)
            bid = int(name.split(".")[2])
            out[f"blk.{bid}.attn_qkv.weight"] = np.concatenate([x.reshape(-1, a.shape[1]) for x in (q, k, v)])
            out[f"blk.{bid}.attn_gate.weight"] = z.reshape(-1, a.shape[1])
            continue
        out[f"{names.get_name(base)}.{suffix}"] = a
    for bid, _ in enumerate(layer_types(cfg) if e else ()):
        for proj in ("down_proj", "gate_proj", "up_proj"):
            stack = np.stack([f32[f"model.layers.{bid}.mlp.experts.{j}.{proj}.weight"] for j in range(e)])
            out[names.get_name(f"model.layers.{bid}.mlp.experts.{proj}") + ".weight"] = stack
    return out


def write_gguf(path, name: str = "q3n_moe", qtype: str = "F32", legacy: bool = False, metadata=None, drop=()) -> str:
    """The variant (every layer MoE, as llama.cpp converts) as a GGUF file at path in qtype;
    metadata: keys overridden (None: removed); drop: GGUF tensor names left out."""
    cfg = config(name)
    return write_file(path, ARCHS[cfg["model_type"]], lambda w: _metadata(w, cfg), converted(cfg, tensors(name), legacy),
                      qtype,
                      ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight"), metadata, drop)

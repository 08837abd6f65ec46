"""The tiny Qwen3-Next checkpoints of tests/qwen3_next_checkpoints.py as llama.cpp's GGUF files
(architecture "qwen3next"), written the way llama.cpp's convert_hf_to_gguf.py (Qwen3NextModel over
Qwen2MoeModel) writes Qwen3NextForCausalLM: names from the gguf package's own TensorNameMap, the
zero-centred norm weights + 1 (not linear_attn.norm), A_log as -exp(A_log), dt_bias as
dt_proj.bias, conv1d squeezed, in_proj_qkvz split into attn_qkv ([q; k; v] of every key head) and
attn_gate (z) (legacy=True: kept whole, as ssm_in), the routed experts stacked, the router, the
shared expert's gate and the conv in F32 (tests/gguf_writing.py: the tokenizer and the file)."""
import numpy as np

import gguf

from .gguf_writing import as_f32, write_file
from .qwen3_next_checkpoints import config, layer_types, tensors


def _metadata(w, cfg: dict) -> None:
    """Qwen3NextModel.set_gguf_parameters (with Qwen2MoeModel's and TextModel's)."""
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
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
    w.add_rope_dimension_count(int(cfg["head_dim"] * cfg["partial_rotary_factor"]))


def converted(cfg: dict, hf: dict, legacy: bool = False) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (torch order) of the HF tensors, as Qwen3NextModel.modify_tensors
    turns them."""
    n, e = cfg["num_hidden_layers"], cfg["num_experts"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3NEXT, n)
    f32 = as_f32(hf)
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
    for bid, _ in enumerate(layer_types(cfg)):
        for proj in ("down_proj", "gate_proj", "up_proj"):
            stack = np.stack([f32[f"model.layers.{bid}.mlp.experts.{j}.{proj}.weight"] for j in range(e)])
            out[names.get_name(f"model.layers.{bid}.mlp.experts.{proj}") + ".weight"] = stack
    return out


def write_gguf(path, name: str = "q3n_moe", qtype: str = "F32", legacy: bool = False, metadata=None, drop=()) -> str:
    """The variant (every layer MoE, as llama.cpp converts) as a GGUF file at path in qtype;
    metadata: keys overridden (None: removed); drop: GGUF tensor names left out."""
    cfg = config(name)
    return write_file(path, "qwen3next", lambda w: _metadata(w, cfg), converted(cfg, tensors(name), legacy), qtype,
                      ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight"), metadata, drop)

"""Tiny random Qwen3-Next and Qwen3.5 checkpoints in the Hugging Face layout
(Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM; routed experts stored one by one
as on the hub), drawn from a NumPy seed. The tests write them at test
time; scripts/make_qwen3_next_fixtures.py writes the same ones and records what transformers
computes for them in tests/fixtures/qwen3_next_logits.npz (see tests/fixtures/README.md).

All variants: hidden 64, 4 layers, 4 heads and 2 KV heads of 16, Gated DeltaNet layers of 2 key
heads and 4 value heads of 16 with a conv kernel of 4, 8 experts of 32 (2 a token) and a shared
expert of 48 (where MoE). The tokenizer is tiny_llama's (vocab 320)."""
import os

import numpy as np

from pocketcupy.quant.dequant import f32_to_bf16

from .seeded_checkpoints import FIXTURES, write_folder

REFERENCE = os.path.join(FIXTURES, "qwen3_next_logits.npz")

BASE = dict(
    architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", vocab_size=320, hidden_size=64,
    intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    hidden_act="silu", max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0, partial_rotary_factor=0.25,
    attention_bias=False, tie_word_embeddings=False, bos_token_id=None, eos_token_id=319, pad_token_id=317,
    initializer_range=0.02)

# name -> (seed, stored dtype, config changes)
VARIANTS = {
    # every layer MoE, full attention every 2nd layer (full_attention_interval, as the hub's
    # config.json writes it), rope on a quarter of each head, bfloat16
    "q3n_moe": (21, "BF16", dict(full_attention_interval=2)),
    # layer_types given, MoE on layer 1 only (decoder_sparse_step 2, layer 3 in mlp_only_layers),
    # rope on half of each head (in rope_parameters, as transformers 5 writes it), attention biases,
    # unnormalised top-k weights, tied embeddings, float32
    "q3n_dense_mlp": (22, "F32", dict(
        layer_types=["linear_attention", "full_attention", "full_attention", "linear_attention"],
        decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False, attention_bias=True,
        tie_word_embeddings=True, rope_theta=None, partial_rotary_factor=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5})),
    # Qwen3.5: in_proj_qkv / _z / _b / _a apart; dense MLPs; its multimodal rope (text positions:
    # plain rope) on half of each head; tied embeddings, bfloat16
    "q35_dense": (23, "BF16", dict(
        architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", full_attention_interval=2,
        tie_word_embeddings=True, rope_theta=None, partial_rotary_factor=None,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        **dict.fromkeys(("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                         "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                         "mlp_only_layers")))),
    # Qwen3.5-MoE: every layer MoE (normalised top-k), no dense intermediate_size, float32
    "q35_moe": (24, "F32", dict(
        architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text", full_attention_interval=2,
        **dict.fromkeys(("intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")))),
}
SPLIT = ("qwen3_5_text", "qwen3_5_moe_text")     # model types with the DeltaNet's input projections apart


def config(name: str) -> dict:
    _, dtype, changes = VARIANTS[name]
    cfg = {**BASE, **changes, "torch_dtype": "bfloat16" if dtype == "BF16" else "float32"}
    return {k: v for k, v in cfg.items() if v is not None}


def layer_types(cfg: dict) -> list[str]:
    if "layer_types" in cfg:
        return cfg["layer_types"]
    k = cfg["full_attention_interval"]
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(cfg["num_hidden_layers"])]


def _shapes(cfg: dict) -> dict[str, tuple]:
    """HF name -> shape of every stored tensor, in a fixed order."""
    h, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    vd, hv = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"], cfg["linear_num_value_heads"]
    e, bias = cfg.get("num_experts", 0), cfg["attention_bias"]

    def mlp(p, inter):
        return {f"{p}.gate_proj.weight": (inter, h), f"{p}.up_proj.weight": (inter, h), f"{p}.down_proj.weight": (h, inter)}

    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    for i, kind in enumerate(layer_types(cfg)):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if kind == "full_attention":
            a = p + "self_attn."
            shapes.update({a + "q_proj.weight": (2 * q, h), a + "k_proj.weight": (kv, h), a + "v_proj.weight": (kv, h),
                           a + "o_proj.weight": (h, q), a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)})
            if bias:
                shapes.update({a + "q_proj.bias": (2 * q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,),
                               a + "o_proj.bias": (h,)})
        else:
            a = p + "linear_attn."
            if cfg["model_type"] in SPLIT:
                shapes.update({a + "in_proj_qkv.weight": (2 * kd + vd, h), a + "in_proj_z.weight": (vd, h),
                               a + "in_proj_b.weight": (hv, h), a + "in_proj_a.weight": (hv, h)})
            else:
                shapes.update({a + "in_proj_qkvz.weight": (2 * kd + 2 * vd, h), a + "in_proj_ba.weight": (2 * hv, h)})
            shapes.update({a + "conv1d.weight": (2 * kd + vd, 1, cfg["linear_conv_kernel_dim"]),
                           a + "dt_bias": (hv,), a + "A_log": (hv,), a + "norm.weight": (cfg["linear_value_head_dim"],),
                           a + "out_proj.weight": (h, vd)})
        sparse = e and i not in cfg.get("mlp_only_layers", ()) and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0
        if not sparse:
            shapes.update(mlp(p + "mlp", cfg["intermediate_size"]))
            continue
        shapes.update({p + "mlp.gate.weight": (e, h), p + "mlp.shared_expert_gate.weight": (1, h),
                       **mlp(p + "mlp.shared_expert", cfg["shared_expert_intermediate_size"])})
        for j in range(e):
            shapes.update(mlp(f"{p}mlp.experts.{j}", cfg["moe_intermediate_size"]))
    return shapes


def tensors(name: str) -> dict[str, tuple[str, np.ndarray]]:
    """HF name -> (safetensors dtype, array): matrices normal(0, 1 / sqrt(columns)), the conv
    normal(0, 1 / sqrt(kernel)); zero-centred norm weights 0.3 randn (scaling by 1 + w), the gated
    norm's 1 + 0.1 randn; biases and dt_bias 0.1 randn (dt_bias + 1), A_log log(uniform(0.5, 4))."""
    seed, dtype, _ = VARIANTS[name]
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in _shapes(config(name)).items():
        x = rng.standard_normal(shape, dtype=np.float32)
        if key.endswith("A_log"):
            x = np.log(rng.uniform(0.5, 4.0, shape)).astype(np.float32)
        elif key.endswith("dt_bias"):
            x = 1 + 0.1 * x
        elif key.endswith("linear_attn.norm.weight"):
            x = 1 + 0.1 * x
        elif "norm" in key:
            x = 0.3 * x
        elif len(shape) == 1:
            x = 0.1 * x
        else:
            x = x / np.float32(np.sqrt(shape[-1]))
        out[key] = ("BF16", f32_to_bf16(x)) if dtype == "BF16" else ("F32", x.astype(np.float32))
    return out


def write_checkpoint(folder, name: str, tensor_map=None, config_changes=None) -> str:
    """The variant's folder in folder; tensor_map replaces its tensors, config_changes updates its
    config.json."""
    return write_folder(folder, {**config(name), **(config_changes or {})}, tensor_map or tensors(name))

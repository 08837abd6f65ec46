"""Tiny random DeepSeek-V3 checkpoints in the Hugging Face layout (DeepseekV3ForCausalLM, routed
experts stored one by one as on the hub), drawn from a NumPy seed. The tests write them at test
time; scripts/make_deepseek_fixtures.py writes the same ones and records what transformers
computes for them in tests/fixtures/deepseek_v3_logits.npz (see tests/fixtures/README.md).

Both variants: hidden 64, 3 decoder layers (the first dense, intermediate 96), 4 heads, kv_lora_rank
32, qk_nope_head_dim 16, qk_rope_head_dim 16, v_head_dim 16, 8 routed experts of 32 in 2 groups
(topk_group 1, 2 experts a token), 1 shared expert, and one multi-token-prediction layer (layer 3,
run only for speculative_method "mtp"). The tokenizer is tiny_llama's (vocab 320).

bigram_tensors(name) turns a variant into one whose MTP layer guesses the model's greedy tokens."""
import os

import numpy as np

from pocketcupy.quant.dequant import f32_to_bf16

from .seeded_checkpoints import FIXTURES, write_folder

REFERENCE = os.path.join(FIXTURES, "deepseek_v3_logits.npz")
REFERENCE_V2 = os.path.join(FIXTURES, "deepseek_v2_logits.npz")

BASE = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=320, hidden_size=64,
    intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, num_nextn_predict_layers=1,
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
    qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
    topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, hidden_act="silu",
    max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, rope_interleave=True,
    attention_bias=False, tie_word_embeddings=False, bos_token_id=None, eos_token_id=319, pad_token_id=317,
    initializer_range=0.02)

# name -> (seed, stored dtype, config changes)
VARIANTS = {
    # yarn as DeepSeek-V3's config.json writes it (mscale != mscale_all_dim: both factors show),
    # rope_interleave, biases on q_a_proj / kv_a_proj_with_mqa / o_proj, bfloat16
    "ds_lora_yarn": (11, "BF16", dict(attention_bias=True, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 0.8})),
    # q_proj (no q LoRA), rotate-half rope, unnormalised top-k weights, tied embeddings, float32
    "ds_plain": (12, "F32", dict(q_lora_rank=None, rope_interleave=False, norm_topk_prob=False,
                                 routed_scaling_factor=1.0, tie_word_embeddings=True)),
}


# DeepSeek-V2 (DeepseekV2ForCausalLM: softmax router scores, no score bias, no MTP layer); their
# fixture is scripts/make_deepseek_v2_fixtures.py's (tests/deepseek_v2_checkpoints.py)
V2_VARIANTS = {
    # V2-Lite's: q_proj, the best experts overall (greedy), float32
    "ds2_lite": (13, "F32", dict(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", q_lora_rank=None,
                                 num_nextn_predict_layers=0, topk_method="greedy", n_group=1, topk_group=1,
                                 norm_topk_prob=False, routed_scaling_factor=1.0)),
    # V2's: the best within the 2 groups (of 4) with the highest best score, weights times 2,
    # attention biases, bfloat16
    "ds2_group": (14, "BF16", dict(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                                   num_nextn_predict_layers=0, topk_method="group_limited_greedy", n_group=4,
                                   topk_group=2, norm_topk_prob=False, routed_scaling_factor=2.0,
                                   attention_bias=True)),
}


def _variant(name: str) -> tuple:
    return VARIANTS[name] if name in VARIANTS else V2_VARIANTS[name]


def config(name: str) -> dict:
    _, dtype, changes = _variant(name)
    return {**BASE, **changes, "torch_dtype": "bfloat16" if dtype == "BF16" else "float32"}


def _shapes(cfg: dict) -> dict[str, tuple]:
    """HF name -> shape of every stored tensor, in a fixed order (the MTP layer's included)."""
    h, v, heads = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    qr, kr, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    q_rows = heads * (cfg["qk_nope_head_dim"] + rope)
    e, im, bias = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["attention_bias"]

    def mlp(p, inter):
        return {f"{p}.gate_proj.weight": (inter, h), f"{p}.up_proj.weight": (inter, h), f"{p}.down_proj.weight": (h, inter)}

    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    for i in range(cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if qr is None:
            shapes[a + "q_proj.weight"] = (q_rows, h)
        else:
            shapes.update({a + "q_a_proj.weight": (qr, h), a + "q_a_layernorm.weight": (qr,),
                           a + "q_b_proj.weight": (q_rows, qr), **({a + "q_a_proj.bias": (qr,)} if bias else {})})
        shapes.update({a + "kv_a_proj_with_mqa.weight": (kr + rope, h), a + "kv_a_layernorm.weight": (kr,),
                       a + "kv_b_proj.weight": (heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), kr),
                       a + "o_proj.weight": (h, heads * cfg["v_head_dim"])})
        if bias:
            shapes.update({a + "kv_a_proj_with_mqa.bias": (kr + rope,), a + "o_proj.bias": (h,)})
        if i < cfg["first_k_dense_replace"]:
            shapes.update(mlp(p + "mlp", cfg["intermediate_size"]))
            continue
        shapes[p + "mlp.gate.weight"] = (e, h)
        if cfg["model_type"] != "deepseek_v2":      # DeepSeek-V3's score bias
            shapes[p + "mlp.gate.e_score_correction_bias"] = (e,)
        shapes.update(mlp(p + "mlp.shared_experts", im * cfg["n_shared_experts"]))
        for j in range(e):
            shapes.update(mlp(f"{p}mlp.experts.{j}", im))
        if i >= cfg["num_hidden_layers"]:   # DeepSeek-V3's MTP layer: ignored by transformers
            shapes.update({p + "enorm.weight": (h,), p + "hnorm.weight": (h,), p + "eh_proj.weight": (h, 2 * h),
                           p + "embed_tokens.weight": (v, h), p + "shared_head.norm.weight": (h,),
                           p + "shared_head.head.weight": (v, h)})
    return shapes


def tensors(name: str) -> dict[str, tuple[str, np.ndarray]]:
    """HF name -> (safetensors dtype, array): matrices normal(0, 1 / sqrt(columns)), norm weights
    1 + 0.1 randn, biases 0.1 randn; e_score_correction_bias stays F32."""
    seed, dtype, _ = _variant(name)
    rng = np.random.default_rng(seed)
    out = {}
    for key, shape in _shapes(config(name)).items():
        x = rng.standard_normal(shape, dtype=np.float32)
        if "norm" in key:
            x = 1 + 0.1 * x
        elif len(shape) == 1:
            x = 0.1 * x
        else:
            x = x / np.float32(np.sqrt(shape[1]))
        if dtype == "BF16" and not key.endswith("e_score_correction_bias"):
            out[key] = ("BF16", f32_to_bf16(x))
        else:
            out[key] = ("F32", x.astype(np.float32))
    return out


def write_checkpoint(folder, name: str, tensor_map=None, config_changes=None) -> str:
    """The variant's folder in folder; tensor_map replaces its tensors, config_changes updates its
    config.json."""
    return write_folder(folder, {**config(name), **(config_changes or {})}, tensor_map or tensors(name))


def bigram_tensors(name: str) -> dict[str, tuple[str, np.ndarray]]:
    """The variant with every attention output and MLP down projection zeroed (each layer adds
    nothing: the model's hidden state is the token's embedding, its logits a function of the last
    token alone), and an MTP layer that reads only the token (eh_proj = [I 0], enorm ones) and ends
    in the model's final norm and head: its logits at position p are the model's at p + 1, so its
    greedy drafts are the model's greedy tokens."""
    cfg = config(name)
    out = tensors(name)
    dtype = out["model.embed_tokens.weight"][0]
    h, mtp = cfg["hidden_size"], f"model.layers.{cfg['num_hidden_layers']}."

    def stored(x):
        return (dtype, f32_to_bf16(x)) if dtype == "BF16" else ("F32", x.astype(np.float32))

    for key, (qtype, a) in out.items():
        if key.endswith(("o_proj.weight", "o_proj.bias", "down_proj.weight")):
            out[key] = (qtype, np.zeros_like(a))
    out[mtp + "eh_proj.weight"] = stored(np.eye(h, 2 * h, dtype=np.float32))
    out[mtp + "enorm.weight"] = stored(np.ones(h, np.float32))
    out[mtp + "shared_head.norm.weight"] = out["model.norm.weight"]
    out[mtp + "shared_head.head.weight"] = out["model.embed_tokens.weight" if cfg["tie_word_embeddings"]
                                               else "lm_head.weight"]
    return out

"""GGUF metadata -> ModelConfig, and GGUF tensor names (which the models use as-is)."""
from __future__ import annotations

from ..config import ModelConfig, RopeScaling
from .gguf import GGUFError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")


def config_from_gguf(meta: dict, tensors: dict) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise GGUFError(f"model: unsupported GGUF architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")

    def get(key, default=None, required=False):
        full = f"{arch}.{key}"
        if full not in meta:
            if required:
                raise GGUFError(f"model: GGUF metadata lacks {full}")
            return default
        return meta[full]

    hidden = int(get("embedding_length", required=True))
    heads = int(get("attention.head_count", required=True))
    kv_heads = get("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):  # per-layer list in some files; we need a uniform count
        if len(set(kv_heads)) != 1:
            raise GGUFError("model: per-layer KV head counts are not supported")
        kv_heads = kv_heads[0]
    head_dim = int(get("attention.key_length", hidden // heads))
    vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", [])) or tensors["token_embd.weight"].shape[0]
    scaling = RopeScaling()
    stype = get("rope.scaling.type", "none")
    if stype == "linear":
        scaling = RopeScaling("linear", float(get("rope.scaling.factor", 1.0)))
    elif stype not in ("none", None):
        raise GGUFError(f"model: unsupported rope scaling type {stype!r}")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(get("block_count", required=True)),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        intermediate_size=int(get("feed_forward_length", required=True)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_dim=int(get("rope.dimension_count", head_dim)),
        # llama.cpp's converter permutes llama Q/K rows so that rotation pairs are adjacent
        rope_interleaved=(arch == "llama"),
        rope_scaling=scaling,
        max_position=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensors,
        qk_norm=(arch == "qwen3"),
        qkv_bias=("blk.0.attn_q.bias" in tensors),
    )

"""GGUF metadata -> ModelConfig, and GGUF tensor names (which the models use as-is)."""
from __future__ import annotations

from ..config import ModelConfig, RopeScaling, is_count, is_number
from .gguf import GGUFError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")


def config_from_gguf(meta: dict, tensors: dict, path: str = "GGUF file") -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise GGUFError(f"model: {path}: unsupported GGUF architecture {arch!r} "
                        f"(supported: {', '.join(SUPPORTED_ARCHS)})")

    def get(key, default=None, required=False):
        full = f"{arch}.{key}"
        if full not in meta:
            if required:
                raise GGUFError(f"model: {path}: GGUF metadata lacks {full}")
            return default
        return meta[full]

    def count(key, default=None, required=False):
        """A positive integer (llama.cpp's required keys: required=True)."""
        v = get(key, default, required)
        if isinstance(v, list) and v and all(x == v[0] for x in v):   # per-layer list, all equal
            v = v[0]
        if isinstance(v, list):
            raise GGUFError(f"model: {path}: per-layer values of {arch}.{key} ({v}) are not supported")
        if not is_count(v):
            raise GGUFError(f"model: {path}: {arch}.{key} must be a positive integer, got {v!r}")
        return v

    def number(key, default):
        v = get(key, default)
        if not is_number(v):
            raise GGUFError(f"model: {path}: {arch}.{key} must be a number, got {v!r}")
        return float(v)

    hidden = count("embedding_length", required=True)
    heads = count("attention.head_count", required=True)
    kv_heads = count("attention.head_count_kv", heads)
    head_dim = count("attention.key_length", hidden // heads or 1)
    layers, ffn = count("block_count", required=True), count("feed_forward_length", required=True)
    context = count("context_length", required=True)    # required by llama.cpp too
    embd = tensors.get("token_embd.weight")
    vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", [])) or (embd.shape[0] if embd else None)
    if vocab is None:
        raise GGUFError(f"model: {path}: no vocabulary size ({arch}.vocab_size, tokenizer.ggml.tokens "
                        f"and token_embd.weight are all missing)")
    scaling = RopeScaling()
    stype = get("rope.scaling.type", "none")
    if stype == "linear":
        scaling = RopeScaling("linear", number("rope.scaling.factor", 1.0))
    elif stype not in ("none", None):
        raise GGUFError(f"model: {path}: unsupported rope scaling type {stype!r} ({arch}.rope.scaling.type; "
                        f"supported: linear)")
    try:
        return ModelConfig(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=ffn,
            rms_eps=number("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=number("rope.freq_base", 10000.0),
            rope_dim=get("rope.dimension_count", head_dim),
            # llama.cpp's converter permutes llama Q/K rows so that rotation pairs are adjacent
            rope_interleaved=(arch == "llama"),
            rope_scaling=scaling,
            max_position=context,
            tie_word_embeddings="output.weight" not in tensors,
            qk_norm=(arch == "qwen3"),
            qkv_bias=("blk.0.attn_q.bias" in tensors),
        )
    except ValueError as e:   # ModelConfig's checks
        raise GGUFError(f"model: {path}: {str(e).removeprefix('model: ')}") from None

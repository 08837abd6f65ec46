"""GGUF metadata -> ModelConfig, and GGUF tensor names (which the models use as-is)."""
from __future__ import annotations

from ..config import ModelConfig, RopeScaling, is_count, is_number, is_size
from ..quant.qtensor import QTensor
from .gguf import GGUFError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "deepseek2", "qwen3next", "qwen35", "qwen35moe")
# GGUF architecture -> ours, where they differ
MODEL_ARCHS = {"deepseek2": "deepseek_v3", "qwen3next": "qwen3_next", "qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}
HYBRID_ARCHS = ("qwen3next", "qwen35", "qwen35moe")     # loader/gguf_qwen3_next.py
DENSE_ARCHS = ("llama", "qwen2", "qwen3")
ROPE_SCALINGS = {"deepseek2": ("linear", "yarn")}   # rope.scaling.type values (others: linear)


class MetaReader:
    """The GGUF keys of one architecture (<arch>.<key>), checked as they are read; errors name the
    key and the file."""

    def __init__(self, meta: dict, arch: str, path: str):
        self.meta, self.arch, self.path = meta, arch, path

    def error(self, message: str) -> GGUFError:
        return GGUFError(f"model: {self.path}: {message}")

    def get(self, key, default=None, required=False):
        full = f"{self.arch}.{key}"
        if full not in self.meta:
            if required:
                raise self.error(f"GGUF metadata lacks {full}")
            return default
        return self.meta[full]

    def count(self, key, default=None, required=False):
        """A positive integer (llama.cpp's required keys: required=True)."""
        v = self.get(key, default, required)
        if isinstance(v, list) and v and all(x == v[0] for x in v):   # per-layer list, all equal
            v = v[0]
        if isinstance(v, list):
            raise self.error(f"per-layer values of {self.arch}.{key} ({v}) are not supported")
        if not is_count(v):
            raise self.error(f"{self.arch}.{key} must be a positive integer, got {v!r}")
        return v

    def size(self, key, default: int) -> int:
        """An integer >= 0."""
        v = self.get(key, default)
        if not is_size(v):
            raise self.error(f"{self.arch}.{key} must be an integer >= 0, got {v!r}")
        return v

    def number(self, key, default):
        v = self.get(key, default)
        if not is_number(v):
            raise self.error(f"{self.arch}.{key} must be a number, got {v!r}")
        return float(v)

    def flag(self, key, default: bool) -> bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise self.error(f"{self.arch}.{key} must be true or false, got {v!r}")
        return v


# llama.cpp's enum llama_pooling_type for the poolings we have (none, cls and rank leave ours: last)
GGUF_POOLING_TYPES = {1: "mean", 3: "last"}


def config_from_gguf(meta: dict, tensors: dict, path: str = "GGUF file") -> ModelConfig:
    parts = meta.get("split.count", 1)
    if parts != 1:   # llama.cpp's gguf-split: metadata in the first part, the tensors spread over all
        no = meta.get("split.no")
        raise GGUFError(f"model: {path} is {f'part {no + 1}' if is_size(no) else 'a part'} of a split GGUF "
                        f"(split.count {parts!r}), which is not supported: merge the parts into one file "
                        "(llama-gguf-split --merge <first part> <out>.gguf)")
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise GGUFError(f"model: {path}: unsupported GGUF architecture {arch!r} "
                        f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    r = MetaReader(meta, arch, path)
    if arch in DENSE_ARCHS and r.size("expert_count", 0):   # llama.cpp's Mixtral files are "llama"
        raise r.error(f"{arch}.expert_count is {r.get('expert_count')}: mixture-of-experts {arch} models "
                      "(Mixtral) are not supported")
    hidden = r.count("embedding_length", required=True)
    heads = r.count("attention.head_count", required=True)
    kv_heads = r.count("attention.head_count_kv", heads)
    head_dim = r.count("attention.key_length", hidden // heads or 1)
    # Qwen3.5-MoE has no dense MLP: its experts' size stands in (as the safetensors loader does)
    layers = r.count("block_count", required=True)
    ffn = (r.count("feed_forward_length", r.get("expert_feed_forward_length")) if arch == "qwen35moe"
           else r.count("feed_forward_length", required=True))
    context = r.count("context_length", required=True)    # required by llama.cpp too
    embd = tensors.get("token_embd.weight")
    vocab = r.get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", [])) or (embd.shape[0] if embd else None)
    if vocab is None:
        raise GGUFError(f"model: {path}: no vocabulary size ({arch}.vocab_size, tokenizer.ggml.tokens "
                        f"and token_embd.weight are all missing)")
    fields = dict(
        architecture=MODEL_ARCHS.get(arch, arch), vocab_size=vocab, hidden_size=hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=ffn,
        rms_eps=r.number("attention.layer_norm_rms_epsilon", 1e-5), rope_theta=r.number("rope.freq_base", 10000.0),
        rope_dim=r.get("rope.dimension_count", head_dim),
        # llama.cpp's converter permutes llama Q/K rows so that rotation pairs are adjacent
        rope_interleaved=(arch == "llama"), rope_scaling=rope_scaling(r, ROPE_SCALINGS.get(arch, ("linear",))),
        max_position=context,
        tie_word_embeddings="output.weight" not in tensors, qk_norm=(arch == "qwen3"),
        qkv_bias=("blk.0.attn_q.bias" in tensors), pooling_type=GGUF_POOLING_TYPES.get(r.get("pooling_type")))
    try:
        if arch == "deepseek2":
            from .gguf_deepseek import deepseek_fields

            fields.update(deepseek_fields(r, tensors))
        elif arch in HYBRID_ARCHS:
            from .gguf_qwen3_next import qwen3_next_fields

            fields.update(qwen3_next_fields(r, tensors))
        return ModelConfig(**fields)
    except ValueError as e:   # ModelConfig's checks
        raise GGUFError(f"model: {path}: {str(e).removeprefix('model: ').removeprefix(f'{path}: ')}") from None


def rope_scaling(r: MetaReader, kinds: tuple[str, ...]) -> RopeScaling:
    """rope.scaling.*: linear, or yarn where kinds has it (DeepSeek's: its magnitude from
    yarn_log_multiplier, which llama.cpp's converter writes as 0.1 x mscale_all_dim and reads as
    mscale = mscale_all_dim, so the rotation keeps unit scale and the softmax scale takes it)."""
    stype = r.get("rope.scaling.type", "none")
    if stype in ("none", None):
        return RopeScaling()
    if stype not in kinds:
        raise r.error(f"unsupported rope scaling type {stype!r} ({r.arch}.rope.scaling.type; supported: "
                      f"{', '.join(kinds)})")
    factor = r.number("rope.scaling.factor", 1.0)
    if stype == "linear":
        return RopeScaling("linear", factor)
    if factor <= 0:
        raise r.error(f"{r.arch}.rope.scaling.factor must be positive, got {factor}")
    mscale = r.number("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
    return RopeScaling("yarn", factor, original_max_position=r.count("rope.scaling.original_context_length",
                                                                      required=True),
                       beta_fast=r.number("rope.scaling.yarn_beta_fast", 32.0),
                       beta_slow=r.number("rope.scaling.yarn_beta_slow", 1.0), mscale=mscale, mscale_all_dim=mscale)


def model_from_gguf(meta: dict, tensors: dict[str, QTensor], path: str,
                    mtp: bool = False) -> tuple[ModelConfig, dict[str, QTensor]]:
    """The config and the tensors under the names the model reads (the MoE architectures'
    stacked experts and split projections rearranged; DeepSeek's multi-token-prediction layers
    only where mtp)."""
    config = config_from_gguf(meta, tensors, path)
    if config.mla is not None:
        from .gguf_deepseek import deepseek_tensors

        tensors = deepseek_tensors(config, tensors, mtp, MetaReader(meta, meta["general.architecture"], path))
    elif config.gdn is not None:
        from .gguf_qwen3_next import qwen3_next_tensors

        tensors = qwen3_next_tensors(config, tensors, MetaReader(meta, meta["general.architecture"], path))
    return config, tensors

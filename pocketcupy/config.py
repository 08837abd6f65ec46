"""ModelConfig: the architecture numbers every loader produces and every model reads."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def is_count(v) -> bool:
    """A positive integer (not a bool): a size a config file may hold."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def is_number(v) -> bool:
    """An int or float (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_size(v) -> bool:
    """A non-negative integer (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def is_bool(v) -> bool:
    return isinstance(v, bool)


@dataclass
class RopeScaling:
    kind: str = "none"                 # "none" | "linear" | "llama3" | "yarn"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0            # yarn (transformers' names and defaults)
    beta_slow: float = 1.0
    mscale: float = 0.0                # 0: not given
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True


@dataclass
class MLAConfig:
    """DeepSeek-V2/V3 multi-head latent attention, in config.json's names. The rotary part of q and
    k has ModelConfig.rope_dim values; the KV cache row is the latent (kv_lora_rank + rope_dim)."""
    q_lora_rank: int | None            # None: one q_proj instead of q_a_proj / q_b_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int
    attention_bias: bool = False       # biases on q_a_proj, kv_a_proj_with_mqa and o_proj

    def __post_init__(self):
        for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            _check(is_count, self, name, "a positive integer")
        if self.q_lora_rank is not None:
            _check(is_count, self, "q_lora_rank", "a positive integer or null")
        _check(is_bool, self, "attention_bias", "true or false")


# scoring_func -> its topk_methods (DeepSeek-V3's; DeepSeek-V2's)
MOE_TOPK_METHODS = {"sigmoid": ("noaux_tc",), "softmax": ("greedy", "group_limited_greedy")}


@dataclass
class MoEConfig:
    """DeepSeek-V3's mixture of experts, in config.json's names: layers from first_k_dense_replace
    on route each token to num_experts_per_tok of n_routed_experts experts (sigmoid scores, chosen
    within the topk_group best of n_group groups), plus n_shared_experts always run. DeepSeek-V2's
    (scoring_func "softmax"): softmax scores, the best overall (topk_method "greedy") or within the
    topk_group groups of the highest best score ("group_limited_greedy")."""
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_shared_experts: int
    first_k_dense_replace: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"

    def __post_init__(self):
        for name in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                     "n_group", "topk_group"):
            _check(is_count, self, name, "a positive integer")
        _check(is_size, self, "first_k_dense_replace", "an integer >= 0")
        _check(is_bool, self, "norm_topk_prob", "true or false")
        _check(lambda v: is_number(v) and math.isfinite(v) and v > 0, self, "routed_scaling_factor",
               "a positive number")
        methods = MOE_TOPK_METHODS.get(self.scoring_func)
        if methods is None:
            raise ValueError(f"model: scoring_func must be one of {', '.join(map(repr, MOE_TOPK_METHODS))}, got "
                             f"{self.scoring_func!r}")
        if self.topk_method not in methods:
            raise ValueError(f"model: topk_method {self.topk_method!r} is not one of {', '.join(map(repr, methods))} "
                             f"(with scoring_func {self.scoring_func!r})")
        per_group, groups = divmod(self.n_routed_experts, self.n_group)
        if groups:
            raise ValueError(f"model: n_group {self.n_group} must divide n_routed_experts {self.n_routed_experts}")
        if self.topk_method == "noaux_tc" and per_group < 2:
            raise ValueError(f"model: n_group {self.n_group} must divide n_routed_experts {self.n_routed_experts} "
                             "into groups of at least 2 experts (a group scores by its best two)")
        if self.topk_group > self.n_group:
            raise ValueError(f"model: topk_group {self.topk_group} exceeds n_group {self.n_group}")
        if self.num_experts_per_tok > (self.n_routed_experts if self.topk_method == "greedy"
                                       else self.topk_group * per_group):
            raise ValueError(f"model: num_experts_per_tok {self.num_experts_per_tok} exceeds the "
                             f"{self.topk_group * per_group} experts of topk_group {self.topk_group} groups")


@dataclass
class SparseMoEConfig:
    """Qwen3-Next's mixture of experts, in config.json's names: softmax router scores, the
    num_experts_per_tok best of num_experts (their weights renormalised where norm_topk_prob), plus
    one shared expert scaled by sigmoid(shared_expert_gate). Layer i is sparse when
    (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers; the others are dense MLPs."""
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]

    def __post_init__(self):
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "decoder_sparse_step"):
            _check(is_count, self, name, "a positive integer")
        _check(is_bool, self, "norm_topk_prob", "true or false")
        _check(lambda v: isinstance(v, (list, tuple)) and all(map(is_size, v)), self, "mlp_only_layers",
               "a list of layer indices")
        self.mlp_only_layers = tuple(self.mlp_only_layers)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"model: num_experts_per_tok {self.num_experts_per_tok} exceeds num_experts "
                             f"{self.num_experts}")

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0


LAYER_TYPES = ("linear_attention", "full_attention")


@dataclass
class GatedDeltaNetConfig:
    """Qwen3-Next's hybrid layers, in config.json's names: layer_types[i] is "linear_attention" (a
    Gated DeltaNet layer: causal depthwise conv of linear_conv_kernel_dim over [q; k; v], then the
    gated delta rule over a recurrent state of linear_num_value_heads x linear_key_head_dim x
    linear_value_head_dim per sequence) or "full_attention" (gated attention over the paged KV cache)."""
    layer_types: tuple[str, ...]
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    # out_proj's input columns with the value heads in llama.cpp's tiled order (value head j of key
    # head k at j * key heads + k; qwen35 GGUF files), not grouped by key head (k * value heads a key + j)
    out_proj_tiled: bool = False

    def __post_init__(self):
        for name in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                     "linear_num_value_heads"):
            _check(is_count, self, name, "a positive integer")
        _check(lambda v: isinstance(v, (list, tuple)) and all(t in LAYER_TYPES for t in v), self, "layer_types",
               f"a list of {' or '.join(map(repr, LAYER_TYPES))}")
        self.layer_types = tuple(self.layer_types)
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"model: linear_num_value_heads {self.linear_num_value_heads} is not a multiple of "
                             f"linear_num_key_heads {self.linear_num_key_heads}")
        if "full_attention" not in self.layer_types:
            raise ValueError("model: layer_types has no 'full_attention' layer")

    @property
    def conv_dim(self) -> int:
        """The channels of the convolution: q, k ([key heads, key dim] each) and v."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.value_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim


def _check(ok, obj, name: str, what: str) -> None:
    v = getattr(obj, name)
    if not ok(v):
        raise ValueError(f"model: {name} must be {what}, got {v!r}")


@dataclass
class ModelConfig:
    architecture: str                  # "llama" | "qwen2" | "qwen3" | "deepseek_v2" | "deepseek_v3" | "qwen3_next"
    #                                    | "qwen3_5"[_moe]
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_dim: int = 0                  # rotary dims per head (0 = head_dim)
    rope_interleaved: bool = False     # True: rotate adjacent pairs (GGUF llama); False: halves (HF)
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position: int = 4096
    tie_word_embeddings: bool = False
    qk_norm: bool = False              # Qwen3: RMSNorm over each head of q and k
    qkv_bias: bool = False             # Qwen2
    mla: MLAConfig | None = None       # DeepSeek-V3: num_kv_heads 1, head_dim the latent cache row
    moe: MoEConfig | SparseMoEConfig | None = None
    gdn: GatedDeltaNetConfig | None = None   # Qwen3-Next: the hybrid's layer types and Gated DeltaNet sizes
    num_nextn_predict_layers: int = 0  # DeepSeek-V3: multi-token-prediction layers stored after the decoder layers
    pooling_type: str | None = None    # an embedding model's own pooling ("mean" | "last"; GGUF {arch}.pooling_type)

    def __post_init__(self):
        """Values a damaged or unusual config holds, refused here rather than as a division by zero
        or a broadcast error in the first forward (loaders add the file to the message)."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "max_position"):
            v = getattr(self, name)
            if not is_count(v):
                raise ValueError(f"model: {name} must be a positive integer, got {v!r}")
        if self.rope_dim == 0:
            self.rope_dim = self.head_dim
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model: {self.num_heads} heads not divisible by {self.num_kv_heads} KV heads")
        if not (isinstance(self.rope_dim, int) and 0 < self.rope_dim <= self.head_dim and self.rope_dim % 2 == 0):
            raise ValueError(f"model: rope dimension {self.rope_dim!r} must be even and at most the head "
                             f"dimension {self.head_dim}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"model: rope_theta must be positive, got {self.rope_theta}")
        if not (math.isfinite(self.rms_eps) and self.rms_eps >= 0):
            raise ValueError(f"model: rms_eps must be a finite number >= 0, got {self.rms_eps}")
        if not is_size(self.num_nextn_predict_layers):
            raise ValueError(f"model: num_nextn_predict_layers must be an integer >= 0, got "
                             f"{self.num_nextn_predict_layers!r}")
        if self.gdn is not None and len(self.gdn.layer_types) != self.num_layers:
            raise ValueError(f"model: layer_types has {len(self.gdn.layer_types)} entries for {self.num_layers} layers")

    @property
    def num_kv_layers(self) -> int:
        """The layers with K/V in the paged cache (a hybrid's full-attention layers; else all)."""
        return self.num_layers if self.gdn is None else self.gdn.layer_types.count("full_attention")

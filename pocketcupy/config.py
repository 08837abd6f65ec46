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


@dataclass
class RopeScaling:
    kind: str = "none"                 # "none" | "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass
class ModelConfig:
    architecture: str                  # "llama" | "qwen2" | "qwen3"
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

"""Embeddings from a generative model: a pooling request's prompt runs as a prefill whose final
hidden states (after the last norm) come back instead of logits, and are pooled into one vector,
as vLLM's embedding runner and llama.cpp's --embeddings do for decoder models."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POOLING_TYPES = ("last", "mean")


def default_pooling_type(config) -> str:
    """The model's own pooling where its file names one (ModelConfig.pooling_type), else "last"."""
    return getattr(config, "pooling_type", None) or "last"


@dataclass(frozen=True)
class PoolingParams:
    """pooling_type: "last" (the last prompt token's hidden state: what decoder embedding models
    such as Qwen3-Embedding and e5-mistral are trained for) or "mean" (over the prompt's tokens);
    normalize: scale the vector to unit L2 norm; truncate_prompt_tokens: keep only the prompt's last
    k tokens (as SamplingParams': -1 the last max_model_len), None for all."""
    pooling_type: str = "last"
    normalize: bool = True
    truncate_prompt_tokens: int | None = None

    def __post_init__(self):
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type: must be one of {', '.join(map(repr, POOLING_TYPES))}, "
                             f"got {self.pooling_type!r}")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize: must be a bool, got {self.normalize!r}")
        t = self.truncate_prompt_tokens
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or not (t >= 1 or t == -1)):
            raise ValueError(f"truncate_prompt_tokens: must be an int >= 1, -1 (the context length) or None, "
                             f"got {t!r}")


@dataclass
class HiddenChunk:
    """What the runner hands over of one prefill chunk's final hidden states: their float64 sum and
    the last row (reduced where they are, so that a chunk's rows never travel to the host)."""
    total: np.ndarray
    last: np.ndarray
    count: int

    @classmethod
    def of(cls, rows, to_host) -> "HiddenChunk":
        """rows [n, hidden] on the backend (NumPy or CuPy); to_host: the backend's copy to the host."""
        return cls(to_host(rows.sum(axis=0, dtype=np.float64)), to_host(rows[-1]), len(rows))


class Pooler:
    """Accumulates a prompt's hidden states chunk by chunk (a long prompt is prefilled in several
    steps): the last row, or a float64 running sum."""

    def __init__(self, params: PoolingParams):
        self.params = params
        self.total: np.ndarray | None = None
        self.count = 0

    def add(self, chunk: HiddenChunk) -> None:
        if self.params.pooling_type == "last":
            self.total = np.asarray(chunk.last, dtype=np.float64)
        else:
            self.total = chunk.total + (0.0 if self.total is None else self.total)
        self.count += chunk.count

    def result(self) -> list[float]:
        v = self.total if self.params.pooling_type == "last" else self.total / self.count
        if self.params.normalize:
            norm = float(np.linalg.norm(v))
            v = v / norm if norm > 0 else v
        return v.astype(np.float32).tolist()

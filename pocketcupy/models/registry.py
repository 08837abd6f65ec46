"""Architecture name -> model class."""
from __future__ import annotations

from .llama import LlamaModel

MODELS = {"llama": LlamaModel, "qwen2": LlamaModel, "qwen3": LlamaModel}


def build_model(config, tensors, ops):
    cls = MODELS.get(config.architecture)
    if cls is None:
        raise ValueError(f"model: no implementation for architecture {config.architecture!r}")
    return cls(config, tensors, ops)

"""Architecture name -> model class."""
from __future__ import annotations

from .deepseek_v3 import DeepseekV3Model
from .llama import LlamaModel
from .qwen3_next import Qwen3NextModel

MODELS = {"llama": LlamaModel, "qwen2": LlamaModel, "qwen3": LlamaModel, "deepseek_v2": DeepseekV3Model,
          "deepseek_v3": DeepseekV3Model, "qwen3_next": Qwen3NextModel, "qwen3_5": Qwen3NextModel, "qwen3_5_moe": Qwen3NextModel}


def model_class(config):
    cls = MODELS.get(config.architecture)
    if cls is None:
        raise ValueError(f"model: no implementation for architecture {config.architecture!r}")
    return cls


def build_model(config, tensors, ops, tp=None, path: str | None = None):
    """tp: this rank's dist.TensorParallel (None: the whole model on one rank); path: the
    checkpoint, named in the errors of its weights (a missing one)."""
    try:
        return model_class(config)(config, tensors, ops, tp)
    except ValueError as e:
        if path is None or not str(e).startswith("model: weight "):
            raise
        raise ValueError(f"model: {path}: {str(e).removeprefix('model: ')}") from None

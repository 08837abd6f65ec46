"""Model files -> (ModelConfig, tensors by GGUF name, tokenizer source)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import ModelConfig
from ..quant.qtensor import QTensor


@dataclass
class LoadedCheckpoint:
    path: str
    format: str                    # "gguf" | "safetensors"
    config: ModelConfig
    tensors: dict[str, QTensor]
    gguf_metadata: dict | None     # the tokenizer is built from this (GGUF) or from the folder


def load_checkpoint(path: str, mtp: bool = False) -> LoadedCheckpoint:
    """mtp: load a DeepSeek-V3 checkpoint's multi-token-prediction layers too (weights mtp.<i>.*)."""
    if not isinstance(path, str) or not path:
        raise ValueError("model: must be a path to a .gguf file or a Hugging Face checkpoint folder")
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        from .safetensors_loader import read_safetensors_folder

        config, tensors = read_safetensors_folder(path, mtp)
        ckpt = LoadedCheckpoint(path, "safetensors", config, tensors, None)
    elif not os.path.exists(path):
        raise ValueError(f"model: {path} does not exist")
    else:
        from .gguf import read_gguf
        from .gguf_config import model_from_gguf

        meta, tensors = read_gguf(path)
        config, tensors = model_from_gguf(meta, tensors, path, mtp)
        ckpt = LoadedCheckpoint(path, "gguf", config, tensors, meta)
    from ..models.registry import model_class

    try:
        model_class(ckpt.config).check_weights(ckpt.config, ckpt.tensors)
    except ValueError as e:
        raise ValueError(f"model: {path}: {str(e).removeprefix('model: ')}") from None
    return ckpt

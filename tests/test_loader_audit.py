"""Broken or unusual checkpoints: a clear error naming the file and the field or tensor, never a
bare traceback from deep inside nor a silently different model."""
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from pocketcupy import Engine
from pocketcupy.loader import load_checkpoint
from pocketcupy.loader.safetensors_loader import _read_safetensors

from .test_hf_models import _copy_fixture


def _rewrite_weights(folder, edit) -> str:
    """The folder's model.safetensors as F32, edited (edit(tensors by HF name)) and written again
    with the safetensors package."""
    path = os.path.join(folder, "model.safetensors")
    tensors = {k: (a.astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else np.array(a, np.float32)
               for k, (dt, a) in _read_safetensors(path).items()}
    edit(tensors)
    save_file(tensors, path)
    return folder


def test_missing_weight_names_the_folder(tmp_path):
    """A weight the model reads but the folder lacks: the error named the weight, not the checkpoint."""
    path = _rewrite_weights(_copy_fixture("tiny_llama", tmp_path),
                            lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match="'blk.1.ffn_up.weight' is missing from the checkpoint") as e:
        Engine(path, device="cpu", max_model_len=32)
    assert str(tmp_path) in str(e.value)
    assert load_checkpoint(path).config.num_layers == 2

"""Shared test helpers: run a model's forward pass directly over one sequence; load a script of
scripts/ as a module."""
import importlib.util
import os
import sys

import numpy as np

from pocketcupy.backend.attention_meta import AttentionMetadata
from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.loader import load_checkpoint
from pocketcupy.models.registry import build_model


def load_reference_model(path):
    ck = load_checkpoint(path)
    ops = NumpyOps()
    return build_model(ck.config, ck.tensors, ops), ops


def full_logits(model, ops, ids, block_size=16):
    """Logits at every position of `ids`, computed in one prefill pass."""
    c, n = model.config, len(ids)
    nblk = -(-n // block_size)
    caches = [ops.empty_kv_cache(nblk, block_size, c.num_kv_heads, c.head_dim) for _ in range(c.num_layers)]
    meta = AttentionMetadata(np.array([0, n], np.int32), np.array([n], np.int32),
                             np.arange(nblk, dtype=np.int32)[None], np.arange(n), block_size)
    hidden = model.forward(np.asarray(ids, np.int64), np.arange(n), meta, caches)
    return ops.to_host(model.compute_logits(hidden))


def load_script(name: str):
    """scripts/<name>.py as a module (registered under its name: dataclasses look their module up)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod

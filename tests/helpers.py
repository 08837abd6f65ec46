"""Shared test helpers: run a model's forward pass directly over one sequence."""
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

"""scripts/profile_marginal.py's OpRemoval on the real SmolLM2 (CPU engine): a removed op runs
once per place in the forward and then returns that output, only the calls of the named weight are
removed, and leaving restores the ops and the model."""
import numpy as np
import pytest

from .helpers import load_script


def _module():
    return load_script("profile_marginal")


def _counting(ops, name, calls):
    """ops.<name> wrapped (an instance attribute) to record the id of each call's weight."""
    real = getattr(ops, name)

    def wrapped(*args, **kw):
        calls.append(id(args[1]) if len(args) > 1 else None)
        return real(*args, **kw)
    setattr(ops, name, wrapped)


def test_removed_calls_run_once_per_place_then_come_from_the_cache(smollm2_gguf):
    from pocketcupy import Engine

    mod = _module()
    eng = Engine(smollm2_gguf, device="cpu", progress=False)
    model = eng.runner.model
    ids, pos = np.arange(5, dtype=np.int64) + 100, np.arange(5, dtype=np.int64)
    calls = []
    _counting(model.ops, "linear", calls)          # beneath the removal: what really runs
    wo = {id(layer.wo) for layer in model.layers}
    with mod.OpRemoval(model, "linear:wo") as r:
        first = model.forward(*_inputs(eng, ids, pos))
        real_wo = sum(c in wo for c in calls)
        others = len(calls) - real_wo
        calls.clear()
        again = model.forward(*_inputs(eng, ids, pos))
        assert r.skipped == len(model.layers)
        assert sum(c in wo for c in calls) == 0 and len(calls) == others   # wo served from the cache, the rest ran
    assert real_wo == len(model.layers) and first.shape == again.shape
    # left: the model's own forward, and the ops' instance attribute of before (the counter) back
    assert "forward" not in vars(model) and model.ops.linear.__name__ == "wrapped"


def _inputs(eng, ids, pos):
    """forward's arguments for one 5-token prompt in fresh KV blocks."""
    from pocketcupy.backend.attention_meta import AttentionMetadata

    n, bs = len(ids), eng.runner.block_size
    tables = np.zeros((1, 1), np.int32)
    meta = AttentionMetadata(np.array([0, n], np.int32), np.array([n], np.int32), tables,
                             np.arange(n, dtype=np.int64), bs)
    return eng.runner.ops.asarray(ids), eng.runner.ops.asarray(pos), eng.runner.ops.upload_meta(meta), \
        eng.runner.kv_caches


def test_unknown_ops_and_weights_are_refused(smollm2_gguf):
    from pocketcupy import Engine

    mod = _module()
    model = Engine(smollm2_gguf, device="cpu", progress=False).runner.model
    with pytest.raises(ValueError, match="no method 'lineer'"):
        mod.OpRemoval(model, "lineer")
    with pytest.raises(ValueError, match="weight 'w_nothing'"):
        mod.OpRemoval(model, "linear:w_nothing")

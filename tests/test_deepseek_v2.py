"""DeepSeek-V2 (DeepseekV2ForCausalLM: DeepSeek-V3's MLA with softmax router scores, the best
experts overall or within the best groups, no score bias, no MTP layer) on the tiny random
checkpoints of tests/deepseek_checkpoints.py (V2_VARIANTS) against transformers' logits and greedy
tokens (scripts/make_deepseek_v2_fixtures.py), batched with preemption and prefix hits, and the
router sizes the CUDA backend refuses."""
import dataclasses

import numpy as np
import pytest

from pocketcupy import Engine
from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.loader import load_checkpoint

from .cuda_rounding import MEDIAN_TOL, SimulatedCudaRounding, backend_error
from .deepseek_v2_checkpoints import REFERENCE, VARIANTS, write_checkpoint
from .seeded_checkpoints import (GREEDY_NEW, GREEDY_PROMPT, batch_alone, batch_tiny, greedy, logits_error,
                                 variant_fixture)

REF = np.load(REFERENCE)


variant = variant_fixture(VARIANTS, write_checkpoint)     # (name, folder) of each variant


def test_logits_match_transformers(variant):
    name, folder = variant
    err = logits_error(folder, REF, name)
    assert err <= 1e-5, f"{name}: relative error {err:.1e}"   # float32 rounding: ~1e-6


def test_greedy_matches_transformers(variant):
    name, folder = variant
    engine = Engine(folder, device="cpu", progress=False)
    c = engine.config
    assert (c.architecture, c.moe.scoring_func, c.head_dim) == ("deepseek_v2", "softmax", 48)
    assert c.moe.topk_method == {"ds2_lite": "greedy", "ds2_group": "group_limited_greedy"}[name]
    assert engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0].outputs[0].token_ids == \
        REF[f"{name}__greedy_ids"].tolist()


def test_concurrent_requests_with_preemption_and_prefix_cache_match_alone(variant):
    _, folder = variant
    tiny, got = batch_tiny(folder)
    assert got == batch_alone(folder)
    st = tiny.stats()
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] > 0


def test_group_limited_greedy_picks_within_the_best_groups():
    """NumpyOps.moe_route_softmax with groups: only experts of the topk_group groups whose best
    probability is highest, their weights the probabilities over all experts."""
    logits = np.log(np.array([[0.30, 0.17, 0.01, 0.24, 0.25, 0.01, 0.01, 0.01]], np.float32))
    weights, ids = NumpyOps().moe_route_softmax(logits, 3, False, n_group=4, topk_group=2)
    assert sorted(ids[0].tolist()) == [0, 1, 4]       # groups {0, 1} and {4, 5} win: 3 (0.24) is out, 1 (0.17) in
    np.testing.assert_allclose(sorted(weights[0]), [0.17, 0.25, 0.30], rtol=1e-5)


@pytest.mark.parametrize("changes, match", [
    (dict(topk_method="noaux_tc"), "topk_method 'noaux_tc' is not one of 'greedy', 'group_limited_greedy' "
                                   "\\(with scoring_func 'softmax'\\)"),
    (dict(scoring_func="relu"), "scoring_func must be one of 'sigmoid', 'softmax', got 'relu'"),
    (dict(n_group=3), "n_group 3 must divide n_routed_experts 8"),
])
def test_router_config_checked(tmp_path, changes, match):
    c = load_checkpoint(write_checkpoint(tmp_path, "ds2_group")).config
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(c.moe, **changes)


def test_cuda_refuses_group_limited_greedy(tmp_path):
    """CudaOps.check_config: no CUDA kernel for the group-limited softmax router (greedy has one)."""
    from pocketcupy.backend.ops_cuda import CudaOps

    ops = object.__new__(CudaOps)
    ops.check_config(load_checkpoint(write_checkpoint(tmp_path / "lite", "ds2_lite")).config)
    with pytest.raises(ValueError, match="topk_method group_limited_greedy has no CUDA kernel .*device='cpu' runs it"):
        ops.check_config(load_checkpoint(write_checkpoint(tmp_path / "group", "ds2_group")).config)


@pytest.mark.gpu
def test_cuda_logits_close_to_transformers(tmp_path):
    """V2-Lite's greedy router on CUDA (the softmax top-k kernel, weights scaled after it), bounded
    as tests/cuda_rounding.py says."""
    from pocketcupy.backend.ops_cuda import CudaOps

    err = backend_error(REF, "ds2_lite", write_checkpoint(tmp_path, "ds2_lite"), CudaOps())
    assert err <= MEDIAN_TOL["F32"], f"median relative error {err:.2e}"


def test_simulated_cuda_roundings_within_half_the_bound(tmp_path):
    err = backend_error(REF, "ds2_lite", write_checkpoint(tmp_path, "ds2_lite"), SimulatedCudaRounding("F32"))
    assert err <= MEDIAN_TOL["F32"] / 2

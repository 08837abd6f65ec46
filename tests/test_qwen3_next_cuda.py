"""Qwen3-Next and Qwen3.5 on the CUDA backend (Gated DeltaNet and MoE kernels: cuda_src/gated_delta.cu,
moe_route.cu): the tiny checkpoints' logits against transformers' (tests/fixtures/qwen3_next_logits.npz),
and the engine's greedy tokens, alone and batched with chunked prefill and preemption, against
transformers' and the NumPy backend's."""
import numpy as np
import pytest

from pocketcupy import Engine
from pocketcupy.loader import load_checkpoint
from pocketcupy.models.registry import build_model

from . import qwen3_next_checkpoints
from .helpers import full_logits, rel_err
from .qwen3_next_checkpoints import REFERENCE
from .seeded_checkpoints import BATCH, GREEDY_NEW, GREEDY_PROMPT, MAX_TOKENS, PROMPTS, batch_alone, greedy

REF = np.load(REFERENCE)
variant = qwen3_next_checkpoints.variant     # the fixture: (name, folder) of each variant
# max |cuda - ref| / max |ref|: fp16 K/V pages, float32 weights kept as fp16 (prepare_weight) and
# 16-bit activations into cuBLAS past the GEMVs' batches
TOL = 1e-2

pytestmark = pytest.mark.gpu


def test_logits_match_transformers(variant):
    from pocketcupy.backend.ops_cuda import CudaOps

    name, folder = variant
    ck = load_checkpoint(folder)
    ops = CudaOps()
    model = build_model(ck.config, ck.tensors, ops)
    for k, ids in enumerate(PROMPTS):
        want = REF[f"{name}__logits{k}"]
        err = rel_err(full_logits(model, ops, ids)[-len(want):], want)
        assert err <= TOL, f"{name} prompt {k}: relative error {err:.2e}"


@pytest.fixture(params=[False, True], ids=["sorted", "pairs"])
def pair_gemv(request, monkeypatch):
    """moe_cuda.PAIR_GEMV: the experts per (row, pick) pair (decode captured in graphs) or sorted
    by expert on the host (eager decode for a model with experts)."""
    from pocketcupy.backend import moe_cuda

    monkeypatch.setattr(moe_cuda, "PAIR_GEMV", request.param)
    return request.param


def test_greedy_matches_transformers(variant, pair_gemv):
    """Decode steps replay CUDA graphs (the state slots among their inputs) unless routed experts
    read their routing on the host (Qwen3NextModel.CAPTURABLE): then they run eagerly."""
    name, folder = variant
    engine = Engine(folder, device="cuda", progress=False, max_num_seqs=4, kv_cache_memory=1 << 24)
    graphs = name == "q35_dense" or pair_gemv                 # the one variant without experts, or experts per pair
    assert (engine.runner.graphs is not None) == graphs
    assert engine.runner.states.layers[0][0].shape[0] == 4 + graphs   # + the graphs' scratch slot
    out = engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0]
    assert out.outputs[0].token_ids == REF[f"{name}__greedy_ids"].tolist()


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_batched_with_preemption_matches_the_numpy_backend(variant, cuda_graphs, pair_gemv):
    """BATCH at once in 11 usable blocks of 4 tokens, prefills in chunks of at most 40 tokens a step,
    decode rows beside prefill chunks (graph padding rows in the scratch state slot): each request's
    tokens as the NumPy backend gives it alone."""
    _, folder = variant
    engine = Engine(folder, device="cuda", progress=False, num_kv_blocks=12, block_size=4, max_num_batched_tokens=40,
                    max_num_seqs=4, cuda_graphs=cuda_graphs)
    got = [o.outputs[0].token_ids for o in engine.generate(BATCH, [greedy(m) for m in MAX_TOKENS])]
    assert got == batch_alone(folder)
    assert engine.stats()["num_preemptions"] > 0
    engine.step()
    assert engine.runner.states.num_used == 0

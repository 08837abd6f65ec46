"""Qwen3-Next and Qwen3.5 on the CUDA backend (Gated DeltaNet and MoE kernels: cuda_src/gated_delta.cu,
moe_route.cu, moe_experts.cu, each checked against NumPy in tests/kernel_rows_gated_delta.py): the tiny
checkpoints' logits against transformers' (tests/fixtures/qwen3_next_logits.npz), and the engine's
tokens batched with chunked prefill and preemption against the NumPy backend's alone.

The logits are bounded by their median error over positions (tests/cuda_rounding.py says why: an H100
run failed a max-error bound of 1e-2 for three of the four variants, and greedy equality with
transformers for three, from the backend's roundings alone)."""
import numpy as np
import pytest

from pocketcupy import Engine

from .cuda_rounding import MEDIAN_TOL, SimulatedCudaRounding, backend_error
from .qwen3_next_checkpoints import REFERENCE, VARIANTS, write_checkpoint
from .seeded_checkpoints import GREEDY_NEW, GREEDY_PROMPT, batch_alone, batch_tiny, greedy, variant_fixture

REF = np.load(REFERENCE)
variant = variant_fixture(VARIANTS, write_checkpoint)     # (name, folder) of each variant
# the variants whose activations are fp16 on the GPU: their greedy tokens held through batching
FP16_ACTIVATIONS = [name for name, (_, dtype, _) in VARIANTS.items() if dtype == "F32"]


@pytest.mark.gpu
def test_logits_close_to_transformers(variant):
    from pocketcupy.backend.ops_cuda import CudaOps

    name, folder = variant
    err = backend_error(REF, name, folder, CudaOps())
    assert err <= MEDIAN_TOL[VARIANTS[name][1]], f"{name}: median relative error {err:.2e}"


def test_simulated_cuda_roundings_within_half_the_bound(variant):
    name, folder = variant
    stored = VARIANTS[name][1]
    assert backend_error(REF, name, folder, SimulatedCudaRounding(stored)) <= MEDIAN_TOL[stored] / 2


@pytest.fixture(params=[False, True], ids=["sorted", "pairs"])
def pair_gemv(request, monkeypatch):
    """moe_cuda.PAIR_GEMV: the experts per (row, pick) pair (decode captured in graphs) or sorted
    by expert on the host (eager decode for a model with experts)."""
    from pocketcupy.backend import moe_cuda

    monkeypatch.setattr(moe_cuda, "PAIR_GEMV", request.param)
    return request.param


@pytest.mark.gpu
def test_decode_graphs_unless_experts_read_on_the_host(variant, pair_gemv):
    """Decode steps replay CUDA graphs (the state slots among their inputs, one more slot for the
    padding rows) unless routed experts read their routing on the host (Qwen3NextModel.CAPTURABLE)."""
    name, folder = variant
    engine = Engine(folder, device="cuda", progress=False, max_num_seqs=4, kv_cache_memory=1 << 24)
    graphs = name == "q35_dense" or pair_gemv                 # the one variant without experts, or experts per pair
    assert (engine.runner.graphs is not None) == graphs
    assert engine.runner.states.layers[0][0].shape[0] == 4 + graphs
    out = engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0]
    assert len(out.outputs[0].token_ids) == GREEDY_NEW


@pytest.mark.gpu
@pytest.mark.parametrize("name", FP16_ACTIVATIONS)
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_batched_with_preemption_matches_the_numpy_backend(tmp_path, name, cuda_graphs, pair_gemv):
    """BATCH at once in 11 usable blocks of 4 tokens, prefills in chunks of at most 40 tokens a step,
    decode rows beside prefill chunks (graph padding rows in the scratch state slot): each request's
    tokens as the NumPy backend gives it alone (the variants with fp16 activations on the GPU)."""
    folder = write_checkpoint(tmp_path, name)
    engine, got = batch_tiny(folder, "cuda", max_num_seqs=4, cuda_graphs=cuda_graphs)
    assert got == batch_alone(folder)
    assert engine.stats()["num_preemptions"] > 0
    engine.step()
    assert engine.runner.states.num_used == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", FP16_ACTIVATIONS)
def test_speculative_decoding_rolls_the_state_back(tmp_path, name):
    """Drafts kept whole or in part (test_qwen3_next.OracleDrafts) verified eagerly on CUDA, the
    states of the requests that rejected some put back and their kept tokens run again: the NumPy
    backend's tokens alone. Every step drafts (adaptive drafting drafted once here on an H100, where
    the plain steps replay graphs and the verifications run eagerly)."""
    from .test_qwen3_next import OracleDrafts

    folder = write_checkpoint(tmp_path, name)
    alone = batch_alone(folder)
    engine, got = batch_tiny(folder, "cuda", OracleDrafts.install(alone), max_num_seqs=4, speculative_method="ngram",
                             num_speculative_tokens=3, speculative_adaptive=False)
    assert got == alone
    st = engine.stats()
    assert st["spec_num_drafts"] < st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"]


def test_experts_go_per_pair_when_fp16_or_bf16_of_one_shape(monkeypatch):
    """moe_cuda.experts_capturable (no GPU needed: it reads the weights' types and shapes)."""
    from pocketcupy.backend import moe_cuda
    from pocketcupy.backend.weight_cuda import CudaWeight

    def experts(qtype="BF16", shape=(64, 96), n=3):
        return [CudaWeight(qtype, shape, None) for _ in range(n)]

    dense = (experts(), experts(), experts(shape=(96, 64)))
    assert moe_cuda.experts_capturable(*dense)
    assert not moe_cuda.experts_capturable(experts(), experts("Q4_K"), experts(shape=(96, 64)))
    assert not moe_cuda.experts_capturable(experts(), experts(), experts(shape=(96, 60)))     # rows of 60 values
    assert not moe_cuda.experts_capturable(experts(), experts("F16"), experts(shape=(96, 64)))  # mixed types
    monkeypatch.setattr(moe_cuda, "PAIR_GEMV", False)
    assert not moe_cuda.experts_capturable(*dense)

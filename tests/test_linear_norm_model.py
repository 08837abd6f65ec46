"""The batch-1 norm epilogue (linear_norm_cuda.linear_add_rms_norm) inside a model: small random
Q4_K_M and Q8_0 models (int8 activations forced) decode one sequence with the o projections and
the first layer's down projection writing the norms after them, and their logits match the NumPy
backend's as closely as the same steps with the norms launched apart; greedy tokens through the
engine are the same replayed in CUDA graphs and run eagerly."""
import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.loader import load_checkpoint
from pocketcupy.models.registry import build_model

from .helpers import PagedRun, load_script, rel_err

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("norm_epilogue"))
    return load_script("make_synthetic_model").main([
        "--out", out, "--vocab", "4096", "--hidden", "512", "--layers", "2", "--heads", "8", "--kv-heads", "2",
        "--intermediate", "1536", "--formats", "q4_k_m,q8_0", "--tokenizer", "synthetic"])["formats"]


@pytest.fixture(params=["q4_k_m", "q8_0"])
def model_path(request, made):
    return made[request.param]["path"]


def _decode_logits(path, ops, ids):
    ck = load_checkpoint(path)
    model = build_model(ck.config, ck.tensors, ops)
    run = PagedRun(model, ops)
    got = run.step([("a", ids[:12], 0)])
    for p in range(12, len(ids)):
        got += run.step([("a", ids[p:p + 1], p)], decode_only=True)
    return np.concatenate(got)


def test_norm_epilogue_matches_numpy(model_path, monkeypatch):
    from pocketcupy.backend import linear_norm_cuda
    from pocketcupy.backend.ops_cuda import CudaOps
    from pocketcupy.backend.ops_ref import NumpyOps

    ids = np.random.default_rng(0).integers(10, 4000, 20)
    ref = _decode_logits(model_path, NumpyOps("q8"), ids)
    fused_calls = []
    real = linear_norm_cuda.linear_add_rms_norm

    def counted(*args, **kw):
        out = real(*args, **kw)
        fused_calls.append(out is not None)
        return out

    monkeypatch.setattr(linear_norm_cuda, "linear_add_rms_norm", counted)
    fused = _decode_logits(model_path, CudaOps("q8"), ids)
    # the 12-token prefill asks for the two o projections' (not fused), each of 8 decode steps fuses
    # three norms (after both o projections and the first layer's down projection)
    assert sum(fused_calls) == 8 * 3 and len(fused_calls) == 2 + 8 * 3
    monkeypatch.setattr(linear_norm_cuda, "NORM_GEMV_LAUNCH", {})
    apart = _decode_logits(model_path, CudaOps("q8"), ids)
    dec = slice(12, None)                      # the decode steps' rows (the prefill's are the same code)
    err_fused, err_apart = rel_err(fused[dec], ref[dec]), rel_err(apart[dec], ref[dec])
    assert err_fused <= 1.5 * err_apart + 1e-3, (err_fused, err_apart)
    assert rel_err(fused[dec], apart[dec]) <= 5e-3
    np.testing.assert_array_equal(fused[:12], apart[:12])


def test_norm_epilogue_graphs_match_eager(model_path):
    prompt = [(7 * j) % 4000 + 10 for j in range(9)]
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    runs = {}
    for graphs in (True, False):
        gpu = Engine(model_path, device="cuda", progress=False, cuda_graphs=graphs, quant_activations="q8")
        runs[graphs] = gpu.generate([prompt], p)[0].outputs[0].token_ids
        del gpu
    assert runs[True] == runs[False]

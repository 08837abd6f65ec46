"""The CUDA backend end to end on the tiny HF checkpoints, against transformers' logits (which the
NumPy backend matches to 1e-4): one-pass prefill, chunked prefill + decode steps, and a batch
mixing prefill chunks with decode rows, all through a paged cache with shuffled blocks."""
import os

import numpy as np
import pytest

from pocketcupy.loader import load_checkpoint
from pocketcupy.models.registry import build_model

from .conftest import FIXTURES
from .helpers import PagedRun, full_logits, rel_err

MODELS = ["tiny_llama", "tiny_qwen2", "tiny_qwen3"]
REF = np.load(os.path.join(FIXTURES, "hf_logits.npz"))
# max |cuda - ref| / max |ref|. The CUDA path keeps K/V in fp16 and feeds fp16/bf16 activations to
# cuBLAS for batches > 8 rows; the same roundings simulated in NumPy give at most 2.6e-3 here.
TOL = 1e-2


def cuda_model(name):
    from pocketcupy.backend.ops_cuda import CudaOps

    ck = load_checkpoint(os.path.join(FIXTURES, name))
    ops = CudaOps()
    return build_model(ck.config, ck.tensors, ops), ops


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_prefill_logits(name):
    model, ops = cuda_model(name)
    for j in range(3):
        got = full_logits(model, ops, REF[f"{name}__ids{j}"])
        err = rel_err(got, REF[f"{name}__logits{j}"])
        assert err <= TOL, f"{name} sequence {j}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_chunked_prefill_then_decode(name):
    model, ops = cuda_model(name)
    ids, ref = REF[f"{name}__ids2"], REF[f"{name}__logits2"]          # 40 tokens
    run = PagedRun(model, ops)
    got = run.step([("a", ids[:20], 0)]) + run.step([("a", ids[20:30], 20)])
    for p in range(30, 40):
        got += run.step([("a", ids[p:p + 1], p)], decode_only=True)
    err = rel_err(np.concatenate(got), ref)
    assert err <= TOL, f"{name}: relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODELS)
def test_mixed_batch_then_batched_decode(name):
    model, ops = cuda_model(name)
    a, b, c = (REF[f"{name}__ids{j}"] for j in (2, 1, 0))
    ra, rb, rc = (REF[f"{name}__logits{j}"] for j in (2, 1, 0))
    run = PagedRun(model, ops)
    ga, gb, gc = run.step([("a", a[:33], 0), ("b", b[:4], 0), ("c", c, 0)])
    got_a, got_b = [ga], [gb]
    assert rel_err(gc, rc) <= TOL
    for k in range(3):                                                 # decode rows only
        da, db = run.step([("a", a[33 + k:34 + k], 33 + k), ("b", b[4 + k:5 + k], 4 + k)], decode_only=k != 1)
        got_a.append(da)
        got_b.append(db)
    ga2, = run.step([("a", a[36:], 36)])                               # a prefill chunk after decode
    got_a.append(ga2)
    for got, ref, label in [(got_a, ra, "a"), (got_b, rb, "b")]:
        err = rel_err(np.concatenate(got), ref)
        assert err <= TOL, f"{name} sequence {label}: relative error {err:.2e}"

"""Structured output on the CUDA backend (gpu marker: skipped without a GPU): the device sampler
applies packed grammar masks exactly as the NumPy sampler does, in batches that mix masked and free
rows, and SmolLM2 on the GPU gives schema-valid JSON, with free batch-mates unchanged."""

import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.backend.sampler_cuda import pack_mask
from pocketcupy.sampler import Sampler, SamplingRow
from tests.test_structured_engine import REGEXES, check_all_schemas, greedy

pytestmark = pytest.mark.gpu


def _rows(V, seed):
    """Masked rows (sparse masks: greedy, sampled, with logprobs) mixed with free rows, made fresh
    for each sampler (the generators advance)."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(12):
        p = SamplingParams(temperature=0.0 if b % 3 else 0.8, seed=b, logprobs=4 if b % 4 == 0 else None)
        mask = pack_mask(rng.random(V) < 0.01, V) if b % 2 == 0 else None
        rows.append(SamplingRow(p, packed_mask=mask))
    return rows


@pytest.mark.parametrize("V", [49152, 1003, 128256])
def test_device_sampler_applies_packed_masks(V):
    import cupy as cp

    from pocketcupy.backend.sampler_cuda import CudaSampler

    x = (np.random.default_rng(V).standard_normal((12, V)) * 3).astype(np.float32)
    ref = Sampler([0])(x, _rows(V, 1))
    rows = _rows(V, 1)
    got = CudaSampler([0])(cp.asarray(x), rows)
    greedy_rows = [i for i, r in enumerate(rows) if r.params.greedy]
    assert [int(got.token_ids[i]) for i in greedy_rows] == [int(ref.token_ids[i]) for i in greedy_rows]
    for i, r in enumerate(rows):
        if r.packed_mask is not None:
            t = int(got.token_ids[i])
            assert (int(r.packed_mask[t // 32]) >> (t % 32)) & 1, (i, t)
        if r.params.logprobs is not None and r.params.greedy:
            a, b = ref.logprobs[i], got.logprobs[i]
            assert list(a) == list(b)
            assert np.allclose([v.logprob for v in a.values()], [v.logprob for v in b.values()], atol=1e-4)


@pytest.fixture(scope="module")
def gpu(smollm2_gguf):
    return Engine(smollm2_gguf, device="cuda", progress=False, max_num_seqs=32)


def test_json_schemas_validate_on_gpu(gpu):
    check_all_schemas(gpu)


def test_mixed_batch_on_gpu(gpu):
    free = ["The history of Rome", "My favourite food is"]
    fp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = [gpu.generate(p, fp)[0].outputs[0].token_ids for p in free]
    outs = gpu.generate([free[0], "Date:", free[1]],
                        [fp, greedy(structured_outputs={"regex": REGEXES["iso_date"][0]}, max_tokens=40), fp])
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == alone
    assert outs[1].outputs[0].finish_reason == "stop"


def test_late_bound_rows_on_gpu(gpu, smollm2_gguf):
    """Async scheduling on the device sampler (the default there) with rows whose sampling waits for
    the previous token (late binding: grammars, penalties, bad words, a thinking budget): every output
    is the synchronous engine's, and every step but the last left the next one in flight."""
    from tests.test_async_scheduling import check_late_bound

    sync = Engine(smollm2_gguf, device="cuda", progress=False, max_num_seqs=32, async_scheduling="off",
                  max_model_len=1024, num_kv_blocks=128)
    check_late_bound(sync, gpu)


def test_rows_sampled_alone_beside_a_step_in_flight(gpu):
    """A request whose constraints leave no token joins while the others' step is in flight: its step's
    rows are then sampled one by one (the failing one fails its request). The device sampler's results
    alternate between two pinned buffers, so the step in flight is resolved first; before, the second
    row alone overwrote its buffer and the others got wrong tokens."""
    blue = gpu.tokenizer.encode(" blue", add_special_tokens=False)[0]
    fp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = ["The sky is", "Once upon a time", "My name is"]
    alone = [gpu.generate(p, fp)[0].outputs[0].token_ids for p in prompts]
    for i, p in enumerate(prompts):
        gpu.add_request(f"free{i}", p, fp)
    gpu.step()
    gpu.step()
    assert gpu._inflight is not None
    gpu.add_request("doomed", "Hello", SamplingParams(temperature=0, max_tokens=4, allowed_token_ids=[blue],
                                                      bad_words=[" blue"]))
    final = {}
    while gpu.has_unfinished_requests():
        final.update((out.request_id, out) for out in gpu.step() if out.finished)
    assert [final[f"free{i}"].outputs[0].token_ids for i in range(3)] == alone
    assert final["doomed"].outputs[0].finish_reason == "error"

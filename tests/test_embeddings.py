"""Embeddings (Engine.embed, pooling.py) with the real SmolLM2 on the CPU: a pooling request's
prompt runs through the scheduler like any other and its final hidden states are pooled.
- The last token's state is llama.cpp's too: its logits (through the model's LM head) give
  llama.cpp's next-token log-probs of the committed fixture.
- Mean pooling over a prompt prefilled in chunks equals the mean of one whole pass's rows.
- Neither the prefix cache nor preemption changes a vector; embeddings and generation run in the
  same steps; bad pooling settings are ValueErrors naming the field."""
import json
import os

import numpy as np
import pytest

from pocketcupy import Engine, PoolingParams, SamplingParams
from pocketcupy.sampler import log_softmax

from .conftest import FIXTURES
from .helpers import full_hidden, load_reference_model

RAW = PoolingParams(normalize=False)


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    return smollm2_engine


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    return load_reference_model(smollm2_gguf)


def _vectors(outs) -> np.ndarray:
    return np.asarray([o.outputs.embedding for o in outs], dtype=np.float64)


def test_last_token_state_gives_llamacpp_next_token_logprobs(engine, reference):
    with open(os.path.join(FIXTURES, "llamacpp_logits.json")) as f:
        paragraphs = json.load(f)["paragraphs"][:2]
    model, ops = reference
    diffs, agree, total = [], 0, 0
    for p in paragraphs:
        ids = p["ids"]
        cuts = [4, len(ids) // 2, len(ids) - 1]
        outs = engine.embed([ids[:k] for k in cuts], RAW)
        lp = log_softmax(ops.to_host(model.compute_logits(_vectors(outs).astype(np.float32))).astype(np.float64))
        for row, k in zip(lp, cuts):
            diffs.append(abs(row[ids[k]] - p["next_logprob"][k - 1]))
            agree += int(row.argmax() == p["argmax"][k - 1])
            total += 1
    assert np.mean(diffs) <= 0.05 and agree >= total - 1, (diffs, agree, total)


def test_mean_over_chunks_equals_one_pass(smollm2_gguf, reference):
    model, ops = reference
    ids = [int(t) for t in np.random.default_rng(0).integers(10, 40000, 70)]
    want = ops.to_host(full_hidden(model, ops, ids)).astype(np.float64).mean(axis=0)
    chunked = Engine(smollm2_gguf, device="cpu", progress=False, max_num_batched_tokens=16)
    got = _vectors(chunked.embed([ids], PoolingParams("mean", normalize=False)))[0]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    unit = _vectors(chunked.embed([ids], PoolingParams("mean")))[0]
    np.testing.assert_allclose(unit, want / np.linalg.norm(want), atol=1e-5)


def test_normalized_last_token_and_text_prompts(engine):
    texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply today."]
    outs = engine.embed(texts)
    v = _vectors(outs)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    assert v.shape == (3, engine.config.hidden_size)
    assert outs[0].prompt_token_ids == engine.tokenizer.encode(texts[0])
    raw = _vectors(engine.embed(texts, RAW))
    np.testing.assert_allclose(v, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    sims = v @ v.T      # two sentences about a cat are nearer each other than either to the markets
    assert sims[0, 1] > max(sims[0, 2], sims[1, 2])


def test_prefix_cache_truncation_and_generation_alongside(smollm2_gguf, engine):
    """A prompt whose blocks the prefix cache holds (from a generation) is computed whole all the
    same (mean pooling needs every row); truncate_prompt_tokens keeps the last k tokens; a
    generation running in the same steps gets the tokens it gets alone."""
    ids = [int(t) for t in np.random.default_rng(1).integers(10, 40000, 50)]
    mean = PoolingParams("mean", normalize=False)
    cold = _vectors(engine.embed([ids], mean))[0]
    engine.generate([ids], SamplingParams(max_tokens=2, temperature=0))      # caches its blocks
    np.testing.assert_allclose(_vectors(engine.embed([ids], mean))[0], cold, rtol=1e-6, atol=1e-6)
    tail = _vectors(engine.embed([ids], PoolingParams("mean", normalize=False, truncate_prompt_tokens=20)))[0]
    np.testing.assert_allclose(tail, _vectors(engine.embed([ids[-20:]], mean))[0], rtol=1e-6, atol=1e-6)

    p = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = engine.generate([ids[:30]], p)[0].outputs[0].token_ids
    engine.add_request("gen-beside", ids[:30], p)
    got = engine.embed([ids, ids[:40]], mean)
    tokens = []
    while engine.has_unfinished_requests():
        tokens = [o.outputs[0].token_ids for o in engine.step() if o.request_id == "gen-beside"] or tokens
    assert tokens[0] == alone
    np.testing.assert_allclose(_vectors(got)[0], cold, rtol=1e-6, atol=1e-6)


def test_preempted_embeddings_equal_alone(smollm2_gguf, monkeypatch):
    """A pool too small for two growing generations and the prompts being embedded: the newest
    requests, the embeddings, are preempted mid-prompt and their pooled rows start again (a mean
    counted twice would differ)."""
    rng = np.random.default_rng(2)
    prompts = [[int(t) for t in rng.integers(10, 40000, n)] for n in (60, 45, 70, 52)]
    mean = PoolingParams("mean", normalize=False)
    small = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=12, max_num_batched_tokens=16)
    alone = np.concatenate([_vectors(small.embed([p], mean)) for p in prompts])
    for i in range(2):
        small.add_request(f"long-{i}", [int(t) for t in rng.integers(10, 40000, 62)],
                          SamplingParams(max_tokens=100, temperature=0, ignore_eos=True))
    preempted, schedule = [], small.scheduler.schedule

    def watched():
        out = schedule()
        preempted.extend(out.preempted_ids)
        return out
    monkeypatch.setattr(small.scheduler, "schedule", watched)
    together = _vectors(small.embed(prompts, mean))
    assert any(rid.startswith("embd-") for rid in preempted), preempted
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)
    small.abort_request(["long-0", "long-1"])


def test_gguf_pooling_type_is_the_default(smollm2_gguf, engine, monkeypatch):
    """An embedding GGUF's {arch}.pooling_type (llama.cpp's enum: 1 mean, 3 last) becomes the model's
    default pooling; none, or one we do not have (2 cls), leaves "last"."""
    from pocketcupy.loader import load_checkpoint
    from pocketcupy.loader.gguf import read_metadata
    from pocketcupy.loader.gguf_config import config_from_gguf

    meta, tensors = read_metadata(smollm2_gguf), load_checkpoint(smollm2_gguf).tensors
    for value, want in ((1, "mean"), (3, "last"), (2, None), (None, None)):
        m = dict(meta) if value is None else {**meta, "llama.pooling_type": value}
        assert config_from_gguf(m, tensors).pooling_type == want
    prompt = ["The cat sat on the mat."]
    monkeypatch.setattr(engine.config, "pooling_type", "mean")
    assert engine.embed(prompt)[0].outputs.embedding == engine.embed(prompt, PoolingParams("mean"))[0].outputs.embedding


@pytest.mark.parametrize("kwargs, field", [
    (dict(pooling_type="max"), "pooling_type"),
    (dict(normalize="yes"), "normalize"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
])
def test_bad_pooling_params(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        PoolingParams(**kwargs)


def test_input_may_fill_the_context(smollm2_gguf, engine):
    """An embedding's one sampled token is dropped and needs no K/V: a prompt of exactly max_model_len
    tokens is embedded (in a pool of exactly its blocks) as without the limit; one more is refused, or
    truncated to the context by truncate_prompt_tokens=-1."""
    ids = [int(t) for t in np.random.default_rng(3).integers(10, 40000, 49)]
    mean = PoolingParams("mean", normalize=False)
    tight = Engine(smollm2_gguf, device="cpu", progress=False, max_model_len=48, block_size=16, num_kv_blocks=4)
    np.testing.assert_allclose(_vectors(tight.embed([ids[:48]], mean)), _vectors(engine.embed([ids[:48]], mean)),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="^prompt: 49 tokens do not fit the context of 48"):
        tight.embed([ids], mean)
    last = PoolingParams("mean", normalize=False, truncate_prompt_tokens=-1)   # (-1: the last max_model_len)
    np.testing.assert_allclose(_vectors(tight.embed([ids], last)), _vectors(engine.embed([ids[1:]], mean)),
                               rtol=1e-6, atol=1e-6)


def test_bad_embed_arguments(engine):
    with pytest.raises(ValueError, match="^pooling: expected PoolingParams"):
        engine.embed(["hi"], pooling="mean")
    with pytest.raises(ValueError, match="^prompt"):
        engine.embed([[]])
    with pytest.raises(ValueError, match="^prompts: must not be empty"):
        engine.embed([])


@pytest.mark.gpu
def test_cuda_embeddings_match_cpu(tmp_path):
    """The CUDA backend's pooled states (eager prefill rows, never a decode graph) against the NumPy
    backend's, on a small random Q8_0 model, both poolings, a prompt prefilled in chunks among
    others."""
    from .helpers import load_script

    path = load_script("make_synthetic_model").main([
        "--out", str(tmp_path), "--vocab", "4096", "--hidden", "512", "--layers", "2", "--heads", "8",
        "--kv-heads", "2", "--intermediate", "1536", "--formats", "q8_0", "--tokenizer", "synthetic"])
    path = path["formats"]["q8_0"]["path"]
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(10, 4000, n)] for n in (9, 40, 300)]
    for pooling in (PoolingParams(), PoolingParams("mean")):
        cpu, gpu = ([o.outputs.embedding for o in Engine(path, device=d, progress=False, max_num_batched_tokens=128)
                     .embed(prompts, pooling)] for d in ("cpu", "cuda"))
        np.testing.assert_allclose(np.asarray(gpu), np.asarray(cpu), atol=5e-3)

import numpy as np
import pytest

from pocketcupy.sampler import (
    Logprob,
    Sampler,
    SamplingRow,
    apply_penalties,
    make_generator,
    prompt_logprobs,
)
from pocketcupy.sampling import SamplingParams

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
N = 20000


def ref_log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def sample_many(params, logits=LOGITS, n=N, seed=0, **row_kw):
    gen = make_generator(seed)  # shared by all rows: one stream of draws
    rows = [SamplingRow(params, generator=gen, **row_kw) for _ in range(n)]
    out = Sampler()(np.tile(logits, (n, 1)), rows)
    return np.bincount(out.token_ids, minlength=len(logits)) / n


def check_distribution(freq, support, logits=LOGITS, temperature=1.0):
    support = sorted(support)
    assert sorted(np.flatnonzero(freq).tolist()) == support
    p = np.exp(ref_log_softmax(np.asarray(logits)[support] / temperature))
    tol = 5 * np.sqrt(p * (1 - p) / N) + 1e-3
    np.testing.assert_array_less(np.abs(freq[support] - p), tol)


# ---- penalties ------------------------------------------------------------


def test_repetition_penalty_values():
    x = np.array([[2.0, -1.0, 0.5, -3.0, 4.0]], dtype=np.float32)
    row = SamplingRow(SamplingParams(repetition_penalty=2.0), prompt_ids=[0, 3], output_ids=[1, 1])
    apply_penalties(x, [row])
    np.testing.assert_allclose(x[0], [1.0, -2.0, 0.5, -6.0, 4.0])


def test_frequency_presence_penalty_values():
    x = np.array([[2.0, -1.0, 0.5, -3.0, 4.0]], dtype=np.float32)
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    row = SamplingRow(p, prompt_ids=[4], output_ids=[1, 1, 2])  # prompt tokens not counted
    apply_penalties(x, [row])
    np.testing.assert_allclose(x[0], [2.0, -1.0 - 1.0 - 0.25, 0.5 - 0.5 - 0.25, -3.0, 4.0])


def test_all_penalties_combined():
    x = np.array([[2.0, -1.0, 0.5, -3.0]], dtype=np.float32)
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    apply_penalties(x, [SamplingRow(p, prompt_ids=[0], output_ids=[1, 1, 2])])
    np.testing.assert_allclose(x[0], [1.0, -3.25, -0.5, -3.0])


def test_penalty_changes_greedy_choice():
    logits = np.array([[3.0, 2.9, 0.0]], dtype=np.float32)
    p = SamplingParams(temperature=0, repetition_penalty=1.2)
    assert Sampler()(logits, [SamplingRow(p, output_ids=[0])]).token_ids[0] == 1
    p = SamplingParams(temperature=0, presence_penalty=0.2)
    assert Sampler()(logits, [SamplingRow(p, output_ids=[0])]).token_ids[0] == 1
    assert Sampler()(logits, [SamplingRow(p, prompt_ids=[0])]).token_ids[0] == 0


# ---- greedy / temperature / truncation -------------------------------------


def test_greedy_is_argmax():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 50)).astype(np.float32)
    p = SamplingParams(temperature=0, top_k=3, top_p=0.1)
    out = Sampler()(logits, [SamplingRow(p) for _ in range(6)])
    assert out.token_ids.dtype == np.int64
    np.testing.assert_array_equal(out.token_ids, logits.argmax(1))


def test_plain_sampling_matches_softmax():
    check_distribution(sample_many(SamplingParams()), range(len(LOGITS)))


def test_temperature():
    check_distribution(sample_many(SamplingParams(temperature=0.5)), range(len(LOGITS)), temperature=0.5)


@pytest.mark.parametrize("k,support", [(1, [0]), (3, [0, 1, 2]), (7, range(7)), (100, range(8)), (-1, range(8))])
def test_top_k(k, support):
    check_distribution(sample_many(SamplingParams(top_k=k)), support)


def top_p_expected(p):
    probs = np.exp(ref_log_softmax(LOGITS))  # LOGITS is sorted descending
    before = np.cumsum(probs) - probs
    return [i for i in range(len(LOGITS)) if before[i] < p]


@pytest.mark.parametrize("p", [0.01, 0.3, 0.5, 0.8, 0.95, 0.99])
def test_top_p(p):
    support = top_p_expected(p)
    probs = np.exp(ref_log_softmax(LOGITS))
    assert probs[support].sum() >= p and probs[support[:-1]].sum() < p  # smallest such set
    check_distribution(sample_many(SamplingParams(top_p=p)), support)


@pytest.mark.parametrize("m", [0.1, 0.3, 0.7, 1.0])
def test_min_p(m):
    probs = np.exp(ref_log_softmax(LOGITS))
    support = np.flatnonzero(probs >= m * probs.max()).tolist()
    check_distribution(sample_many(SamplingParams(min_p=m)), support)


def test_top_k_then_top_p_with_temperature():
    # top-k 5 at T=2, then top-p 0.6 over the renormalised top-5 distribution
    x = LOGITS[:5] / 2
    probs = np.exp(ref_log_softmax(x))
    before = np.cumsum(probs) - probs
    support = np.flatnonzero(before < 0.6).tolist()
    freq = sample_many(SamplingParams(temperature=2.0, top_k=5, top_p=0.6))
    check_distribution(freq, support, logits=LOGITS, temperature=2.0)


@pytest.mark.parametrize("m, p", [(0.3, 0.5), (0.1, 0.7), (0.05, 0.9)])
def test_min_p_before_top_p(m, p):
    """vLLM v1's order: min_p cuts first (against the top token's probability), then top-p runs
    over the renormalised survivors (min_p after top-p kept tokens beyond that mass)."""
    probs = np.exp(ref_log_softmax(LOGITS))
    kept = probs * (probs >= m * probs.max())
    kept /= kept.sum()
    support = np.flatnonzero((kept > 0) & (np.cumsum(kept) - kept < p)).tolist()
    check_distribution(sample_many(SamplingParams(min_p=m, top_p=p)), support)


def test_mixed_batch_per_row_params():
    rows = [
        SamplingRow(SamplingParams(temperature=0)),
        SamplingRow(SamplingParams(top_k=1, seed=1)),
        SamplingRow(SamplingParams(top_p=0.01, seed=2)),
        SamplingRow(SamplingParams(seed=3)),
    ]
    logits = np.tile(LOGITS, (4, 1))
    logits[0] = LOGITS[::-1]
    out = Sampler()(logits, rows)
    assert out.token_ids[:3].tolist() == [7, 0, 0]


# ---- seeds ----------------------------------------------------------------


def run_steps(seed, steps=40, V=1000):
    row = SamplingRow(SamplingParams(seed=seed))
    s = Sampler()
    logits = np.zeros((1, V), dtype=np.float32)
    return [int(s(logits, [row]).token_ids[0]) for _ in range(steps)]


def test_same_seed_same_tokens_different_seed_different_tokens():
    assert run_steps(123) == run_steps(123)
    assert run_steps(123) != run_steps(124)
    assert run_steps(None) != run_steps(None)


def test_seeded_row_independent_of_batch_companions():
    logits = np.tile(LOGITS, (3, 1))
    a = Sampler()(logits[:1], [SamplingRow(SamplingParams(seed=9))]).token_ids[0]
    rows = [SamplingRow(SamplingParams()), SamplingRow(SamplingParams(seed=9)), SamplingRow(SamplingParams())]
    assert Sampler()(logits, rows).token_ids[1] == a


# ---- min_tokens / allowed_mask ----------------------------------------------


def test_min_tokens_suppresses_eos_and_stop_tokens():
    logits = np.array([[0.0, 1.0, 10.0, 9.0]], dtype=np.float32)  # eos=2, stop token 3
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3])
    s = Sampler(eos_token_ids=[2])
    assert s(logits, [SamplingRow(p, output_ids=[])]).token_ids[0] == 1
    assert s(logits, [SamplingRow(p, output_ids=[5])]).token_ids[0] == 1
    assert s(logits, [SamplingRow(p, output_ids=[5, 5])]).token_ids[0] == 2
    assert s(logits, [SamplingRow(p)], eos_token_ids=[]).token_ids[0] == 2  # per-call override
    q = p.clone(ignore_eos=True)  # eos is no stop then, so it is not suppressed either
    assert s(logits, [SamplingRow(q)]).token_ids[0] == 2


def test_min_tokens_random_never_samples_eos():
    logits = np.array([5.0, 0.0, 0.0], dtype=np.float32)
    gen = make_generator(0)
    rows = [SamplingRow(SamplingParams(min_tokens=1), generator=gen) for _ in range(2000)]
    out = Sampler(eos_token_ids=[0])(np.tile(logits, (2000, 1)), rows)
    assert 0 not in out.token_ids


def test_allowed_mask():
    mask = np.zeros(len(LOGITS), dtype=bool)
    mask[[2, 5, 6]] = True
    out = Sampler()(LOGITS[None], [SamplingRow(SamplingParams(temperature=0), allowed_mask=mask)])
    assert out.token_ids[0] == 2
    freq = sample_many(SamplingParams(), allowed_mask=mask)
    check_distribution(freq, [2, 5, 6])
    with pytest.raises(ValueError, match="allows no token"):
        Sampler()(LOGITS[None], [SamplingRow(SamplingParams(), allowed_mask=np.zeros(8, bool))])


# ---- logprobs ---------------------------------------------------------------


def check_position(d, lp_ref, token, k):
    order = np.argsort(-lp_ref, kind="stable")
    keys = list(d)
    assert keys[:k] == order[:k].tolist()
    assert [d[t].rank for t in keys[:k]] == list(range(1, k + 1))
    assert token in d
    assert len(d) == k + (token not in order[:k])
    assert d[token].rank == int((lp_ref > lp_ref[token]).sum()) + 1
    for t, v in d.items():
        assert isinstance(v, Logprob) and v.decoded_token is None
        assert v.logprob == pytest.approx(lp_ref[t], abs=1e-5)
    lps = [d[t].logprob for t in keys[:k]]
    assert lps == sorted(lps, reverse=True)


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_sample_logprobs_from_raw_logits(k):
    rng = np.random.default_rng(5)
    logits = (rng.normal(size=(4, 64)) * 3).astype(np.float32)
    logits[3, 7] = logits[3].max() + 1.0  # presence_penalty 2 pushes it below the runner-up
    params = [
        SamplingParams(logprobs=k, temperature=0.3, top_k=2, repetition_penalty=1.5),
        SamplingParams(logprobs=k, seed=1),
        SamplingParams(temperature=0),
        SamplingParams(logprobs=k, temperature=0, presence_penalty=2.0),
    ]
    rows = [SamplingRow(p, prompt_ids=[1, 2, 3], output_ids=[int(logits[i].argmax())]) for i, p in enumerate(params)]
    out = Sampler()(logits, rows)
    assert out.logprobs[2] is None
    for i in (0, 1, 3):
        check_position(out.logprobs[i], ref_log_softmax(logits[i]), int(out.token_ids[i]), k)
    assert out.logprobs[3][int(out.token_ids[3])].rank > 1  # penalised argmax was skipped


def test_sample_logprobs_respect_allowed_mask():
    mask = np.ones(len(LOGITS), dtype=bool)
    mask[0] = False
    out = Sampler()(LOGITS[None], [SamplingRow(SamplingParams(temperature=0, logprobs=2), allowed_mask=mask)])
    ref = ref_log_softmax(np.where(mask, LOGITS, -np.inf))
    d = out.logprobs[0]
    assert list(d) == [1, 2] and d[1].rank == 1
    assert d[1].logprob == pytest.approx(ref[1], abs=1e-5)


def test_prompt_logprobs():
    rng = np.random.default_rng(3)
    T, V, k = 6, 40, 3
    logits = rng.normal(size=(T, V)).astype(np.float32)
    ids = rng.integers(0, V, size=T).tolist()
    res = prompt_logprobs(logits, ids, k)
    assert len(res) == T and res[0] is None
    for i in range(1, T):
        check_position(res[i], ref_log_softmax(logits[i - 1]), ids[i], k)
    assert prompt_logprobs(logits[: T - 1], ids, 0)[1:] == [
        {ids[i]: res[i][ids[i]]} for i in range(1, T)
    ]
    assert prompt_logprobs(logits, [], 2) == []
    assert prompt_logprobs(logits, ids[:1], 2) == [None]
    with pytest.raises(ValueError):
        prompt_logprobs(logits[:2], ids, 2)


def test_logit_bias():
    """Added before everything else: +100 forces a token past a penalty, -100 removes the argmax,
    the returned logprobs are those of the biased logits; rows without a bias are untouched."""
    lp = SamplingParams(temperature=0, logprobs=1, logit_bias={6: 100.0}, repetition_penalty=2.0)
    rows = [SamplingRow(lp, output_ids=[6]), SamplingRow(SamplingParams(temperature=0, logit_bias={0: -100, 1: -1})),
            SamplingRow(SamplingParams(temperature=0)), SamplingRow(SamplingParams(seed=1, logit_bias={3: 100}))]
    out = Sampler()(np.tile(LOGITS, (4, 1)), rows)
    assert out.token_ids.tolist() == [6, 2, 0, 3]
    biased = LOGITS.copy()
    biased[6] += 100
    assert out.logprobs[0][6].logprob == pytest.approx(ref_log_softmax(biased)[6], abs=1e-5)
    mask = np.ones(len(LOGITS), bool)
    mask[6] = False   # a forbidden token stays forbidden however it is biased
    assert Sampler()(LOGITS[None], [SamplingRow(lp, allowed_mask=mask)]).token_ids[0] == 0
    with pytest.raises(ValueError, match="^logit_bias: token id 8 is outside"):
        Sampler()(LOGITS[None], [SamplingRow(SamplingParams(logit_bias={8: 1.0}))])


def test_banned_ids():
    """Forbidden like min_tokens' stop tokens: never sampled, yet the raw logprobs keep them."""
    rows = [SamplingRow(SamplingParams(temperature=0, logprobs=1), banned_ids=[0, 99]),
            SamplingRow(SamplingParams(seed=2, top_k=2), banned_ids=[0])]
    out = Sampler()(np.tile(LOGITS, (2, 1)), rows)
    assert out.token_ids[0] == 1 and out.token_ids[1] in (1, 2)
    assert 0 in out.logprobs[0] and out.logprobs[0][0].rank == 1
    freq = sample_many(SamplingParams(top_k=2), banned_ids=[0])
    assert set(np.flatnonzero(freq)) == {1, 2}


def test_logits_shape_checked():
    with pytest.raises(ValueError):
        Sampler()(np.zeros((2, 4), np.float32), [SamplingRow(SamplingParams())])


def test_input_logits_not_modified():
    logits = np.tile(LOGITS, (1, 1))
    before = logits.copy()
    row = SamplingRow(SamplingParams(repetition_penalty=2.0, top_k=2, logit_bias={1: 5.0}), output_ids=[0],
                      allowed_mask=LOGITS > 0)
    Sampler()(logits, [row])
    np.testing.assert_array_equal(logits, before)

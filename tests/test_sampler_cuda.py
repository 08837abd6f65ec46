"""The device sampler (pocketcupy/backend/sampler_cuda.py) against the NumPy Sampler: greedy tokens
equal, sampled distributions equal (many seeded rows of the same logits), seeds reproducible,
logprob dicts equal. The first tests need no GPU: the NumPy Philox reference against Random123's
known answers, and the host-side parameter layout against the kernel's #defines."""
import os
import re

import numpy as np
import pytest

from pocketcupy.backend import sampler_cuda as sc
from pocketcupy.backend.kernels import CUDA_SRC
from pocketcupy.sampler import (
    Sampler,
    SamplingRow,
    _position_logprobs,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    log_softmax,
    make_generator,
    prompt_logprobs,
    softmax,
)
from pocketcupy.sampling import SamplingParams
from tests.kernel_rows_sampling import greedy_rows, philox4x32_10, separated

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
N = 20000


# ---- no GPU needed ---------------------------------------------------------------------------

def test_philox_reference_known_answers():
    kat = [((0, 0, 0, 0), 0, (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
           ((0xFFFFFFFF,) * 4, 0xFFFFFFFFFFFFFFFF, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), 0x299F31D0A4093822,
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for ctr, key, want in kat:
        assert philox4x32_10(np.array([ctr], np.uint32), key)[0].tolist() == list(want)


def test_layout_constants_match_kernel():
    src = open(os.path.join(CUDA_SRC, "sampling.cu")).read()
    defs = {m[0]: int(m[1]) for m in re.findall(r"#define ((?:SP|SO|F)_[A-Z]+) (\d+)", src)}
    assert defs and all(getattr(sc, name) == v for name, v in defs.items()), defs
    head = open(os.path.join(CUDA_SRC, "sampling_select.cuh")).read()
    assert f"#define LP_MAX {sc.LP_MAX}" in head and f"#define SAMP_NT {sc.NT}" in head


def test_pack_mask_bit_order():
    m = np.zeros(70, bool)
    m[[0, 5, 31, 32, 69]] = True
    w = sc.pack_mask(m, 70)
    assert w.dtype == np.dtype("<u4") and w.tolist() == [(1 << 0) | (1 << 5) | (1 << 31), 1, 1 << 5]


def test_packed_batch_layout():
    V = 100
    rows = [
        SamplingRow(SamplingParams(temperature=0.0, logprobs=3)),
        SamplingRow(SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, seed=1, repetition_penalty=1.2,
                                   frequency_penalty=0.5, presence_penalty=0.25, min_tokens=3, stop_token_ids=[7, 200]),
                    prompt_ids=[1, 2, 3], output_ids=[4, 4], allowed_mask=np.arange(V) % 2 == 0),
        SamplingRow(SamplingParams(top_k=500, presence_penalty=1.0, seed=2), output_ids=[9]),
    ]
    b = sc.PackedBatch(rows, V, eos=[5])
    P = b.host[: 3 * sc.SP_WORDS].reshape(3, sc.SP_WORDS)
    f32 = lambda r, w: P[r, w:w + 1].view(np.float32)[0]  # noqa: E731
    f64 = lambda r, w: P[r, w:w + 2].copy().view(np.float64)[0]  # noqa: E731
    toks = b.host[3 * sc.SP_WORDS:]
    lst = lambda r, w: toks[P[r, w]:P[r, w] + P[r, w + 1]].tolist()  # noqa: E731

    assert P[0, sc.SP_FLAGS] == sc.F_GREEDY | sc.F_LOGPROBS and P[0, sc.SP_NLP] == 3 and P[0, sc.SP_MASK] == -1
    assert P[1, sc.SP_FLAGS] == sc.F_EDITS | sc.F_FREQPRES
    assert (P[1, sc.SP_TOPK], P[1, sc.SP_MASK], P[1, sc.SP_CNT]) == (5, 0, 0)
    assert f32(1, sc.SP_TEMP) == np.float32(0.7) and f32(1, sc.SP_REP) == np.float32(1.2)
    assert f32(1, sc.SP_FREQ) == np.float32(0.5) and f64(1, sc.SP_PRES) == 0.25
    assert f64(1, sc.SP_TOPP) == 0.9 and f64(1, sc.SP_MINP) == 0.05
    assert lst(1, sc.SP_PROMPT) == [1, 2, 3] and lst(1, sc.SP_OUTPUT) == [4, 4] and lst(1, sc.SP_SUPP) == [7, 5]
    seed = int(P[1, sc.SP_SEED:sc.SP_SEED + 2].copy().view(np.uint64)[0])
    assert seed == int(make_generator(1).integers(2**63))
    assert P[2, sc.SP_TOPK] == 0 and P[2, sc.SP_CNT] == 1 and lst(2, sc.SP_PROMPT) == []
    assert P[2, sc.SP_FLAGS] == sc.F_EDITS | sc.F_FREQPRES and lst(2, sc.SP_OUTPUT) == [9]
    assert b.n_cnt == 2 and b.n_masks == 1 and b.mask_words == 4
    masks = b.host[-4:].view(np.uint32)
    assert masks.tolist() == [0x55555555] * 3 + [0x5]


def test_no_token_left_is_a_value_error_naming_the_fields():
    """Masks and suppressed tokens (bad words, min_tokens' stops) that leave no token: both samplers (the
    device one's host side) raise a ValueError naming the fields, where they drew from NaN probabilities
    (the NumPy sampler: token 0, outside the mask). A row with one token left samples it."""
    V, eos = len(LOGITS), [4]
    mask = np.isin(np.arange(V), [2, 5])
    with_eos = sc.pack_mask(mask | (np.arange(V) == 4), V)
    cases = [
        (SamplingRow(SamplingParams(), allowed_mask=mask, banned_ids=[2, 5]), "bad_words: with allowed_token_ids,"),
        (SamplingRow(SamplingParams(min_tokens=2, stop_token_ids=[3]), packed_mask=sc.pack_mask(np.arange(V) == 3, V)),
         "min_tokens: with structured_outputs,"),
        (SamplingRow(SamplingParams(temperature=0, min_tokens=1), packed_mask=with_eos, banned_ids=[2, 5]),
         "bad_words: with min_tokens, structured_outputs,"),
    ]
    for row, message in cases:
        with pytest.raises(ValueError, match=f"^{message} it forbids every token after 0 generated tokens"):
            Sampler(eos)(LOGITS[None], [row])
        with pytest.raises(ValueError, match=f"^{message} it forbids every token"):
            sc.PackedBatch([row], V, eos)
    one_left = SamplingRow(SamplingParams(), allowed_mask=mask, banned_ids=[2])
    assert Sampler(eos)(LOGITS[None], [one_left]).token_ids.tolist() == [5]
    assert sc.PackedBatch([one_left], V, eos).n_masks == 1


def test_graph_params_only_for_rows_without_lists_masks_or_bias():
    """CudaSampler.graph_params: the decode graph's sampler takes greedy / filtered / logprob rows
    (their PackedBatch parameters, seeds drawn as launch() draws them) and nothing that needs token
    lists, masks or a logit bias."""
    V, smp = 100, sc.CudaSampler(eos_token_ids=[5])
    plain = [SamplingRow(SamplingParams(temperature=0.0, logprobs=2)),
             SamplingRow(SamplingParams(temperature=0.8, top_k=7, top_p=0.9, min_p=0.1, seed=3)),
             SamplingRow(SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[9]), output_ids=[1, 2])]
    got = smp.graph_params(plain, V)
    want = sc.PackedBatch([SamplingRow(r.params, output_ids=r.output_ids) for r in plain], V, [5])
    assert got.shape == (3, sc.SP_WORDS) and (got == want.host.reshape(3, sc.SP_WORDS)).all()
    needs_launch = [dict(logit_bias={3: 1.0}), dict(repetition_penalty=1.1), dict(frequency_penalty=0.5),
                    dict(presence_penalty=0.5), dict(min_tokens=5)]
    for kw in needs_launch:
        assert smp.graph_params([plain[0], SamplingRow(SamplingParams(**kw), output_ids=[1])], V) is None, kw
    for row_kw in [dict(allowed_mask=np.arange(V) < 50), dict(packed_mask=np.ones(4, np.uint32)), dict(banned_ids=[4])]:
        assert smp.graph_params([SamplingRow(SamplingParams(temperature=0.0), **row_kw)], V) is None, row_kw


# ---- GPU -------------------------------------------------------------------------------------

def _cp():
    import cupy

    return cupy


def sample_many(params, logits=LOGITS, n=N, seed=0, **row_kw):
    cp = _cp()
    gen = make_generator(seed)
    rows = [SamplingRow(params, generator=gen, **row_kw) for _ in range(n)]
    out = sc.CudaSampler()(cp.tile(cp.asarray(logits), (n, 1)), rows)
    return np.bincount(out.token_ids, minlength=len(logits)) / n


def expected_probs(logits, p: SamplingParams, mask=None):
    x = np.asarray(logits, np.float32)[None].copy()
    if mask is not None:
        x[0, ~mask] = -np.inf
    x = x / np.array([p.temperature], np.float32)[:, None]
    x = apply_min_p(x, np.array([p.min_p], np.float64))
    x = apply_top_k(x, np.array([p.top_k]))
    x = apply_top_p(x, np.array([p.top_p], np.float64))
    return softmax(x.astype(np.float64))[0]


def check_distribution(freq, probs, n=N):
    outside = np.flatnonzero((freq > 0) & (probs == 0))
    assert outside.size == 0, f"sampled outside the allowed set: {outside[:10]}"
    tol = 5 * np.sqrt(probs * (1 - probs) / n) + 1e-3
    worst = np.argmax(np.abs(freq - probs) - tol)
    assert np.all(np.abs(freq - probs) <= tol), (worst, freq[worst], probs[worst])
    big = probs * n >= 5  # chi-square over the well-populated bins plus one pooled bin
    obs = np.append(freq[big] * n, freq[~big].sum() * n)
    exp = np.append(probs[big] * n, probs[~big].sum() * n)
    keep = exp > 0
    df = max(int(keep.sum()) - 1, 1)
    chi2 = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    assert chi2 < df + 8 * np.sqrt(2 * df) + 10, (chi2, df)


SMALL = [
    SamplingParams(), SamplingParams(temperature=0.5), SamplingParams(top_k=1), SamplingParams(top_k=3),
    SamplingParams(top_k=7), SamplingParams(top_k=100), SamplingParams(top_p=0.01), SamplingParams(top_p=0.5),
    SamplingParams(top_p=0.8), SamplingParams(top_p=0.99), SamplingParams(min_p=0.1), SamplingParams(min_p=0.7),
    SamplingParams(min_p=1.0), SamplingParams(temperature=2.0, top_k=5, top_p=0.6),
    SamplingParams(min_p=0.3, top_p=0.5), SamplingParams(min_p=0.05, top_p=0.9),  # min-p first (vLLM v1)
]


@pytest.mark.gpu
@pytest.mark.parametrize("p", SMALL, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_distribution_small_vocab(p):
    check_distribution(sample_many(p), expected_probs(LOGITS, p))


@pytest.mark.gpu
def test_distribution_allowed_mask():
    mask = np.zeros(len(LOGITS), dtype=bool)
    mask[[2, 5, 6]] = True
    p = SamplingParams()
    check_distribution(sample_many(p, allowed_mask=mask), expected_probs(LOGITS, p, mask))


LARGE = [
    SamplingParams(top_k=50), SamplingParams(temperature=0.7, top_p=0.8), SamplingParams(temperature=1.2, min_p=0.02),
    SamplingParams(top_k=200, top_p=0.95, min_p=0.01), SamplingParams(temperature=0.6),
]


@pytest.mark.gpu
@pytest.mark.parametrize("p", LARGE, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_distribution_large_vocab(p):
    V = 32000
    logits = (np.random.default_rng(7).standard_normal(V) * 3).astype(np.float32)
    check_distribution(sample_many(p, logits=logits), expected_probs(logits, p))


@pytest.mark.gpu
@pytest.mark.parametrize("V", [1000, 49152, 128256])
def test_greedy_equals_numpy(V):
    rng = np.random.default_rng(V)
    B = 18
    x = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    rows = greedy_rows(rng, B, V)
    for b, r in enumerate(rows):
        x[b, r.output_ids[:3]] += 8.0
        x[b, r.params.stop_token_ids] += 9.0
    rows += [SamplingRow(SamplingParams(top_k=1, seed=3, repetition_penalty=1.5), output_ids=[int(x[0].argmax())])]
    x = np.concatenate([x, x[:1]])
    want = Sampler([7])(x, rows).token_ids
    got = sc.CudaSampler([7])(_cp().asarray(x), rows).token_ids
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_min_tokens_random_never_samples_eos():
    logits = np.array([5.0, 0.0, 0.0], dtype=np.float32)
    gen = make_generator(0)
    rows = [SamplingRow(SamplingParams(min_tokens=1), generator=gen) for _ in range(2000)]
    out = sc.CudaSampler(eos_token_ids=[0])(_cp().tile(_cp().asarray(logits), (2000, 1)), rows)
    assert 0 not in out.token_ids


def run_steps(seed, steps=40, V=1000):
    row = SamplingRow(SamplingParams(seed=seed, top_p=0.9))
    s = sc.CudaSampler()
    logits = _cp().asarray(np.random.default_rng(0).standard_normal((1, V)).astype(np.float32))
    return [int(s(logits, [row]).token_ids[0]) for _ in range(steps)]


@pytest.mark.gpu
def test_seeds_reproducible():
    assert run_steps(123) == run_steps(123)
    assert run_steps(123) != run_steps(124)
    assert run_steps(None) != run_steps(None)
    logits = _cp().tile(_cp().asarray(LOGITS), (3, 1))
    a = sc.CudaSampler()(logits[:1], [SamplingRow(SamplingParams(seed=9))]).token_ids[0]
    rows = [SamplingRow(SamplingParams()), SamplingRow(SamplingParams(seed=9)), SamplingRow(SamplingParams())]
    assert sc.CudaSampler()(logits, rows).token_ids[1] == a


def check_dicts(got, want, tol=1e-4):
    assert list(got) == list(want)
    for t in want:
        assert got[t].rank == want[t].rank, (t, got[t], want[t])
        assert got[t].logprob == pytest.approx(want[t].logprob, abs=tol) or got[t].logprob == want[t].logprob


@pytest.mark.gpu
@pytest.mark.parametrize("V", [64, 49152])
def test_logprobs_equal_numpy(V):
    rng = np.random.default_rng(5)
    x = separated(rng, 6, V)
    mask = rng.random(V) < 0.6
    params = [
        SamplingParams(logprobs=0, temperature=0), SamplingParams(logprobs=1, seed=1),
        SamplingParams(logprobs=5, temperature=0.3, top_k=2, repetition_penalty=1.5),
        SamplingParams(logprobs=20, temperature=0, presence_penalty=2.0), SamplingParams(temperature=0),
        SamplingParams(logprobs=20, top_p=0.9, seed=4),
    ]
    rows = [SamplingRow(p, prompt_ids=[1, 2, 3], output_ids=[int(x[i].argmax())], allowed_mask=mask if i == 5 else None)
            for i, p in enumerate(params)]
    out = sc.CudaSampler()(_cp().asarray(x), rows)
    assert out.logprobs[4] is None
    for i, p in enumerate(params):
        if p.logprobs is None:
            continue
        xi = np.where(mask, x[i], -np.inf) if i == 5 else x[i]
        want = _position_logprobs(log_softmax(xi[None])[0], int(out.token_ids[i]), p.logprobs)
        check_dicts(out.logprobs[i], want)
    ref = Sampler()(x, rows)  # greedy rows: the whole output equals NumPy's
    for i in (0, 3):
        assert out.token_ids[i] == ref.token_ids[i]
        check_dicts(out.logprobs[i], ref.logprobs[i])


@pytest.mark.gpu
def test_logit_bias_equals_numpy():
    """Biased rows (with a mask, a penalty, logprobs) next to unbiased ones: greedy tokens and
    logprobs equal the NumPy sampler's, a +100 bias wins a random row, the input is untouched."""
    cp = _cp()
    rng = np.random.default_rng(11)
    B, V = 5, 49152
    x = separated(rng, B, V)
    mask = rng.random(V) < 0.5
    top = [int(v) for v in x.argmax(1)]
    params = [SamplingParams(temperature=0, logprobs=3, logit_bias={top[0]: -100.0, 17: 2.5}),
              SamplingParams(temperature=0, logprobs=2, logit_bias={int(np.flatnonzero(mask)[3]): 100.0},
                             repetition_penalty=1.5),
              SamplingParams(temperature=0, logprobs=1), SamplingParams(seed=2, logit_bias={V - 1: 100.0}),
              SamplingParams(temperature=0, logit_bias={top[4]: -100.0})]
    rows = [SamplingRow(p, prompt_ids=[1, 2], output_ids=[top[i]], allowed_mask=mask if i == 1 else None)
            for i, p in enumerate(params)]
    dev = cp.asarray(x)
    got = sc.CudaSampler()(dev, rows)
    want = Sampler()(x, rows)
    assert bool((dev == cp.asarray(x)).all())
    assert got.token_ids[3] == V - 1
    for i in (0, 1, 2, 4):
        assert got.token_ids[i] == want.token_ids[i]
        if params[i].logprobs is not None:
            check_dicts(got.logprobs[i], want.logprobs[i])


@pytest.mark.gpu
def test_banned_ids_equal_numpy():
    """Rows' banned_ids (bad words) next to min_tokens' suppression: greedy tokens and raw logprobs
    equal the NumPy sampler's; a random row never samples a banned token."""
    rng = np.random.default_rng(12)
    B, V = 4, 49152
    x = separated(rng, B, V)
    top = [int(v) for v in x.argmax(1)]
    rows = [SamplingRow(SamplingParams(temperature=0, logprobs=2), banned_ids=[top[0], 5]),
            SamplingRow(SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[top[1]]), banned_ids=[7]),
            SamplingRow(SamplingParams(temperature=0), banned_ids=[V + 3]),
            SamplingRow(SamplingParams(seed=4, top_k=2), banned_ids=list(np.argsort(-x[3])[:1]))]
    got = sc.CudaSampler([0])(_cp().asarray(x), rows)
    want = Sampler([0])(x, rows)
    assert got.token_ids[:3].tolist() == want.token_ids[:3].tolist() and got.token_ids[0] != top[0]
    check_dicts(got.logprobs[0], want.logprobs[0])
    assert got.token_ids[3] in np.argsort(-x[3])[1:3]   # top-2 of what is left: the banned top-1 is out


@pytest.mark.gpu
def test_prompt_logprobs_equal_numpy():
    rng = np.random.default_rng(3)
    T, V, k = 9, 5000, 4
    logits = separated(rng, T, V)
    ids = rng.integers(0, V, size=T).tolist()
    got = sc.prompt_logprobs_cuda(_cp().asarray(logits), ids, k)
    want = prompt_logprobs(logits, ids, k)
    assert got[0] is None and len(got) == T
    for g, w in zip(got[1:], want[1:]):
        check_dicts(g, w)
    assert sc.prompt_logprobs_cuda(logits, [], 2) == [] and sc.prompt_logprobs_cuda(logits, ids[:1], 2) == [None]


@pytest.mark.gpu
def test_errors_and_input_untouched():
    cp = _cp()
    with pytest.raises(ValueError, match="allows no token"):
        sc.CudaSampler()(cp.asarray(LOGITS[None]), [SamplingRow(SamplingParams(), allowed_mask=np.zeros(8, bool))])
    with pytest.raises(ValueError):
        sc.CudaSampler()(cp.zeros((2, 4), cp.float32), [SamplingRow(SamplingParams())])
    x = cp.asarray(np.tile(LOGITS, (2, 1)))
    before = x.copy()
    rows = [SamplingRow(SamplingParams(repetition_penalty=2.0, top_k=2, frequency_penalty=1.0), output_ids=[0, 0],
                        allowed_mask=LOGITS > 0), SamplingRow(SamplingParams(temperature=0, min_tokens=2), output_ids=[])]
    sc.CudaSampler([0])(x, rows)
    assert bool((x == before).all())

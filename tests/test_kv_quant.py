"""8-bit KV cache pages (quant/kv_quant.py) on the NumPy backend: the E4M3 rounding against a
brute-force nearest-even search, the per-row error, and SmolLM2 end to end (log-probs next to the
float32 cache, pool size from the bytes, preemption and prefix caching giving the tokens a request
gets alone up to a near-tie)."""
import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.quant.kv_quant import (E4M3_VALUES, QuantKVCache, dequantize_kv, encode_e4m3, quantize_kv,
                                       round_e4m3)

PROMPT = "The three laws of motion formulated by Isaac Newton describe the relationship between"


def test_e4m3_rounding_is_nearest_even():
    vals = E4M3_VALUES[:0x7F].astype(np.float64)                  # codes 0..0x7E, increasing
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)        # exact ties
    rng = np.random.default_rng(0)
    y = np.concatenate([rng.uniform(-448, 448, 20000), rng.uniform(-0.03, 0.03, 20000), mids, -mids]).astype(np.float32)
    a = np.abs(y.astype(np.float64))
    hi = np.clip(np.searchsorted(vals, a), 0, len(vals) - 1)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - vals[lo], vals[hi] - a
    want = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    got = round_e4m3(y)
    assert np.array_equal(np.abs(got), vals[want].astype(np.float32))
    assert np.array_equal(np.signbit(got), np.signbit(y))
    codes = encode_e4m3(got)
    assert np.array_equal(E4M3_VALUES[codes], got)
    assert [int(c) for c in encode_e4m3(np.float32([448, 1, 2 ** -9, -2 ** -9, 0]))] == [0x7E, 0x38, 0x01, 0x81, 0]


@pytest.mark.parametrize("dtype, bound", [("int8", 0.5 / 127), ("fp8", 1 / 16)])
def test_quantize_kv_rows(dtype, bound):
    """Each (token, head) row keeps its amax exactly; every value is within half a code step
    (int8: amax / 254; fp8: 2^-4 of itself for normals, half the subnormal step below)."""
    x = np.random.default_rng(1).standard_normal((50, 3, 64)).astype(np.float32)
    x[0, 0] = 0.0
    codes, scales = quantize_kv(x, dtype)
    y = dequantize_kv(codes, scales, dtype)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    assert np.allclose(np.abs(y).max(axis=-1, keepdims=True), amax, rtol=1e-6)
    assert not y[0, 0].any() and scales[0, 0] == 0
    err = np.abs(y - x)
    if dtype == "int8":
        assert (err <= bound * amax * (1 + 1e-5)).all()
    else:
        assert (err <= np.maximum(bound * np.abs(x), 2.0 ** -10 * amax / 448) * (1 + 1e-5)).all()


def test_quant_cache_pages_store_and_read():
    cache = QuantKVCache.zeros((4, 8, 2, 64), "int8")
    x = np.random.default_rng(2).standard_normal((3, 2, 64)).astype(np.float32)
    cache.store([5, 17, 30], x)
    assert np.allclose(cache.rows([17]), dequantize_kv(*quantize_kv(x[1:2], "int8"), "int8"))
    assert cache.codes[0, 5].any() and cache.codes[2, 1].any() and not cache.codes[1, 0].any()


def _prompt_logprobs(engine):
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=0)
    out = engine.generate(PROMPT, p)[0]
    return out.outputs[0].token_ids, np.array([next(iter(d.values())).logprob for d in out.prompt_logprobs if d])


@pytest.fixture(scope="module")
def float_cache(smollm2_gguf):
    return _prompt_logprobs(Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=64))


@pytest.mark.parametrize("dtype, tol", [("int8", 0.15), ("fp8", 0.25)])
def test_smollm2_with_8bit_kv(smollm2_gguf, float_cache, dtype, tol):
    """Teacher-forced log-probs of the prompt's tokens within tol of the float32 cache's (measured:
    int8 0.061, fp8 0.087 at most), and the same 24 greedy tokens."""
    tokens, lp = _prompt_logprobs(Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=64,
                                         kv_cache_dtype=dtype))
    assert np.abs(lp - float_cache[1]).max() <= tol
    assert tokens == float_cache[0]


def test_pool_size_follows_the_bytes(smollm2_gguf):
    """SmolLM2 (30 layers, 3 KV heads of 64): a float32 row 256 bytes, an 8-bit one 64 + 4."""
    mem = 64 << 20
    blocks = {dt: Engine(smollm2_gguf, device="cpu", progress=False, kv_cache_memory=mem, max_model_len=512,
                         kv_cache_dtype=dt).stats()["kv_blocks_total"] for dt in ("auto", "int8")}
    per_block = 2 * 30 * 16 * 3
    assert blocks == {"auto": mem // (per_block * 256) - 1, "int8": mem // (per_block * 68) - 1}


def _settled(tokens, logprobs, min_gap=0.05):
    """tokens up to the first step whose top two log-probs lie within min_gap: float32 sums that
    differ in their last bits between batch shapes may round a K/V value to the next int8 code,
    and that can move such a near-tie either way."""
    for i, d in enumerate(logprobs):
        top = sorted((v.logprob for v in d.values()), reverse=True)
        if top[0] - top[1] < min_gap:
            return tokens[:i]
    return tokens


def test_preemption_and_prefix_cache_with_int8_kv(smollm2_gguf):
    """Eight requests in a pool too small for all of them (preempted and recomputed), then one of
    them again over its cached prefix, give the tokens each gets alone, up to a near-tie."""
    prompts = ["The history of Rome", "A haiku about snow:", "Dear diary,", "Water boils at",
               "My favourite food is", "In computer science, a linked list is", "Photosynthesis is", "Once upon"]
    p = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=2)
    alone = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=64, enable_prefix_caching=False,
                   kv_cache_dtype="int8")
    want = [_settled(o.token_ids, o.logprobs) for o in (alone.generate(q, p)[0].outputs[0] for q in prompts)]
    assert sum(map(len, want)) >= 30          # all but a few steps are clear of near-ties (37 of 40)
    tiny = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=12, block_size=4,
                  max_num_batched_tokens=48, kv_cache_dtype="int8")
    got = [o.outputs[0].token_ids for o in tiny.generate(prompts, p)]
    assert [g[:len(w)] for g, w in zip(got, want)] == want
    assert tiny.stats()["num_preemptions"] > 0
    again = tiny.generate(prompts[5], p)[0]
    assert again.outputs[0].token_ids[:len(want[5])] == want[5] and again.num_cached_tokens > 0

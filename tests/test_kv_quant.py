"""Quantized KV cache pages (quant/kv_quant.py) on the NumPy backend: the E4M3 rounding against a
brute-force nearest-even search, the per-row error, and SmolLM2 end to end (log-probs next to the
float32 cache, pool size from the bytes, preemption and prefix caching giving the tokens a request
gets alone up to a near-tie)."""
import numpy as np
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.quant.kv_quant import (E4M3_VALUES, QuantKVCache, check_kv_head_dim, dequantize_kv, encode_e4m3,
                                       quantize_kv, round_e4m3)

from .helpers import logprob_margin

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


@pytest.mark.parametrize("kind", ["int8", "fp8", "int4"])
def test_quantize_kv_rows(kind):
    """Every value within half a code step: int8 amax / 254 (the row's amax kept exactly), fp8 2^-4
    of itself for normals (half the subnormal step below), int4 (max - min) / 30 of its group of 32
    (its minimum kept exactly); a row of zeros stays zeros."""
    x = np.random.default_rng(1).standard_normal((50, 3, 64)).astype(np.float32)
    x[0, 0] = 0.0
    codes, params = quantize_kv(x, kind)
    assert codes.shape == ((50, 3, 32) if kind == "int4" else x.shape)
    assert params.shape == (50, 3, 4 if kind == "int4" else 1)
    y = dequantize_kv(codes, params, kind)
    assert not y[0, 0].any() and not params[0, 0].any()
    err = np.abs(y - x)
    if kind == "int4":
        g, gy = x.reshape(50, 3, 2, 32), y.reshape(50, 3, 2, 32)
        span = g.max(axis=-1, keepdims=True) - g.min(axis=-1, keepdims=True)
        assert (np.abs(gy - g) <= span / 30 * (1 + 1e-5) + 1e-7).all()
        assert np.allclose(gy.min(axis=-1), g.min(axis=-1), atol=1e-7)
        return
    amax = np.abs(x).max(axis=-1, keepdims=True)
    assert np.allclose(np.abs(y).max(axis=-1, keepdims=True), amax, rtol=1e-6)
    if kind == "fp8":
        assert (err <= np.maximum(np.abs(x) / 16, 2.0 ** -10 * amax / 448) * (1 + 1e-5)).all()
    else:
        assert (err <= amax / 254 * (1 + 1e-5)).all()


def test_int4_codes_are_packed_nibbles():
    """Group 0: -1 .. 14.5 in steps of 0.5 (span 15.5, codes round(0.5 i * 15 / 15.5)); group 1 zeros."""
    x = np.concatenate([np.arange(32, dtype=np.float32) * 0.5 - 1, np.zeros(32, np.float32)])
    codes, params = quantize_kv(x[None], "int4")
    n = np.rint(np.arange(32) * 0.5 * np.float32(15 / 15.5)).astype(np.uint8)
    assert codes[0, :16].tolist() == (n[0::2] | n[1::2] << 4).tolist() and not codes[0, 16:].any()
    assert np.allclose(params[0], [15.5 / 15, -1, 0, 0])


def test_k8v4_needs_whole_value_groups():
    check_kv_head_dim("k8v4", 64)
    check_kv_head_dim("int8", 80)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        check_kv_head_dim("k8v4", 80)


def test_quant_cache_pages_store_and_read():
    for kind in ("int8", "int4"):
        cache = QuantKVCache.zeros((4, 8, 2, 64), kind)
        assert cache.shape == (4, 8, 2, 64)
        x = np.random.default_rng(2).standard_normal((3, 2, 64)).astype(np.float32)
        cache.store([5, 17, 30], x)
        assert np.array_equal(cache.rows([17]), dequantize_kv(*quantize_kv(x[1:2], kind), kind))
        assert cache.codes[0, 5].any() and cache.codes[2, 1].any() and not cache.codes[1, 0].any()


def _prompt_logprobs(engine):
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=0)
    out = engine.generate(PROMPT, p)[0]
    return out.outputs[0].token_ids, np.array([next(iter(d.values())).logprob for d in out.prompt_logprobs if d])


@pytest.fixture(scope="module")
def float_cache(smollm2_gguf):
    return _prompt_logprobs(Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=64))


@pytest.mark.parametrize("dtype, tol, same", [("int8", 0.15, 24), ("fp8", 0.25, 24), ("k8v4", 0.25, 16)])
def test_smollm2_with_quantized_kv(smollm2_gguf, float_cache, dtype, tol, same):
    """Teacher-forced log-probs of the prompt's tokens within tol of the float32 cache's (measured:
    int8 0.061, fp8 0.087, k8v4 0.114 at most), and the first `same` of 24 greedy tokens equal
    (k8v4 parts at the 18th)."""
    tokens, lp = _prompt_logprobs(Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=64,
                                         kv_cache_dtype=dtype))
    assert np.abs(lp - float_cache[1]).max() <= tol
    assert tokens[:same] == float_cache[0][:same]


def test_pool_size_follows_the_bytes(smollm2_gguf):
    """SmolLM2 (30 layers, 3 KV heads of 64): a (token, head)'s K and V rows take 2 x 256 bytes in
    float32, 2 x (64 + 4) at 8 bits, (64 + 4) + (32 + 2 x 2 x 4) as k8v4."""
    mem = 64 << 20
    blocks = {dt: Engine(smollm2_gguf, device="cpu", progress=False, kv_cache_memory=mem, max_model_len=512,
                         kv_cache_dtype=dt).stats()["kv_blocks_total"] for dt in ("auto", "int8", "k8v4")}
    per_block = 30 * 16 * 3
    assert blocks == {"auto": mem // (per_block * 512) - 1, "int8": mem // (per_block * 136) - 1,
                      "k8v4": mem // (per_block * 116) - 1}


def _settled(tokens, logprobs, min_gap=0.05):
    """tokens up to the first step whose top two log-probs lie within min_gap: float32 sums that
    differ in their last bits between batch shapes may round a K/V value to the next int8 code,
    and that can move such a near-tie either way."""
    for i, d in enumerate(logprobs):
        if logprob_margin(d) < min_gap:
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

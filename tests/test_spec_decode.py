"""Speculative decoding (n-gram drafts) end to end on the CPU with SmolLM2-135M-Instruct: a
request draws exactly the tokens it draws without drafts (greedy, seeded sampling with penalties,
logprobs, bad words, stop strings, structured output, n > 1, batching with preemption, tensor
parallel), while the drafts it keeps are counted; with a quantized KV cache it agrees up to the
first near tie, as batching does."""
import pytest

from pocketcupy import Engine, SamplingParams

from .helpers import logprob_margin

CODE = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"
CHATS = [[{"role": "user", "content": "Copy this code exactly, then explain it:\n" + CODE}],
         [{"role": "user", "content": "Repeat this sentence three times: The cat sat on the mat and looked at the dog."}]]
SPEC = dict(speculative_method="ngram", num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=4)


def engine(path, **kw):
    return Engine(path, device="cpu", progress=False, **kw)


@pytest.fixture(scope="module")
def plain(smollm2_gguf):
    return engine(smollm2_gguf)


@pytest.fixture(scope="module")
def spec(smollm2_gguf):
    return engine(smollm2_gguf, **SPEC)


def accepted(e) -> tuple[int, int]:
    s = e.stats()
    return s["spec_num_draft_tokens"], s["spec_num_accepted_tokens"]


def assert_same(got, want, logprob_tol=1e-4):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g.outputs) == len(w.outputs)
        assert_same_logprobs(g.prompt_logprobs, w.prompt_logprobs, logprob_tol)
        for a, b in zip(g.outputs, w.outputs):
            assert a.token_ids == b.token_ids and a.text == b.text
            assert (a.finish_reason, a.stop_reason) == (b.finish_reason, b.stop_reason)
            assert_same_logprobs(a.logprobs, b.logprobs, logprob_tol)


def assert_same_logprobs(got, want, tol):
    """One entry a position in both, each with the same tokens in the same order, the same ranks, and
    logprobs within tol (drafts change the float rounding of a row, not which tokens lead)."""
    assert (got is None) == (want is None) and len(got or ()) == len(want or ())
    for x, y in zip(got or (), want or ()):
        assert (x is None) == (y is None)
        if x is not None:
            assert list(x) == list(y) and [v.rank for v in x.values()] == [v.rank for v in y.values()]
            assert all(abs(x[t].logprob - y[t].logprob) < tol for t in x)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=64, logprobs=3, prompt_logprobs=1),
    SamplingParams(temperature=0.8, top_p=0.9, seed=3, repetition_penalty=1.1, logprobs=2, max_tokens=48),
    SamplingParams(temperature=0.7, seed=11, presence_penalty=0.4, frequency_penalty=0.3, min_tokens=8,
                   bad_words=[" Fibonacci"], max_tokens=48),
    SamplingParams(temperature=0, stop=["fib(n - 2)"], include_stop_str_in_output=True, max_tokens=64),
], ids=["greedy", "seeded-top-p-repetition-logprobs", "seeded-penalties-bad-words", "stop-string"])
def test_same_tokens_as_without_drafts(plain, spec, params):
    before = accepted(spec)
    got, want = spec.chat(CHATS, params), plain.chat(CHATS, params)
    assert_same(got, want)
    drafted, kept = (a - b for a, b in zip(accepted(spec), before))
    assert drafted > 0 and 0 < kept <= drafted


def test_text_that_copies_the_prompt_keeps_drafting(spec):
    """Adaptive drafting (spec/adaptive.py) keeps drafting, every draft at once, while the text copies
    the prompt. (Sampled list text whose drafts keep only their first token or two stopped drafting
    here before: drafting there paid after all, 1.06 times as fast over 96 tokens, as every step's
    1.07; the policy stopping drafts is tested in test_spec_adaptive.py, and with a model that cannot
    pay in test_spec_draft_model.py.)"""
    before = accepted(spec)
    spec.chat(CHATS[:1], SamplingParams(temperature=0, max_tokens=24))
    drafted, kept = (a - b for a, b in zip(accepted(spec), before))
    assert kept >= 12 and kept >= drafted * 3 / 4


def test_n_sequences_with_seeds(plain, spec):
    p = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=32)
    assert_same(spec.chat(CHATS[:1], p), plain.chat(CHATS[:1], p))


def test_structured_output(plain, spec):
    schema = {"type": "object", "properties": {"code": {"type": "string"}, "lines": {"type": "integer"}},
              "required": ["code", "lines"]}
    p = SamplingParams(temperature=0, max_tokens=96, structured_outputs={"json": schema})
    msgs = [{"role": "user", "content": "Reply in JSON with this code and its line count:\n" + CODE}]
    got, want = spec.chat(msgs, p), plain.chat(msgs, p)
    assert_same(got, want)
    assert got[0].outputs[0].text.startswith("{")


def test_structured_output_drafts_cut_where_the_grammar_refuses(smollm2_gguf, plain):
    """A proposer that always drafts "7x" under the regex [0-9]{6}: only the "7" is verified."""
    class SevenX:
        def propose(self, reqs, ks):
            for r in reqs:
                r.draft_token_ids = list(seven_x)

    e = engine(smollm2_gguf, **SPEC)
    seven_x = e.tokenizer.encode("7x", add_special_tokens=False)
    assert len(seven_x) == 2
    e.proposer = SevenX()
    p = SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": "[0-9]{6}"})
    got = e.generate("My PIN is", p)
    assert_same(got, plain.generate("My PIN is", p))
    s = e.stats()
    assert len(got[0].outputs[0].text) == 6 and s["spec_num_drafts"] > 0
    assert s["spec_num_draft_tokens"] == s["spec_num_drafts"]


def test_structured_output_after_a_trigger(smollm2_gguf, plain):
    """A constraint that starts after a trigger (structured_outputs.start_after): a draft that runs
    through the trigger is cut only where the grammar refuses what follows it (the proposer drafts
    the trigger's tokens, then "7x": three kept, the "x" cut), and the tokens are those without drafts."""
    class TriggerThen7X:
        def propose(self, reqs, ks):
            for r in reqs:
                r.draft_token_ids = list(draft)

    free = plain.generate("My PIN is", SamplingParams(temperature=0, max_tokens=3))[0].outputs[0].token_ids
    e = engine(smollm2_gguf, **SPEC, speculative_adaptive=False)   # (drafts from the first decode step)
    trigger = free[1:3]
    draft = trigger + e.tokenizer.encode("7x", add_special_tokens=False)
    e.proposer = TriggerThen7X()
    p = SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": "[0-9]{6}", "start_after": trigger})
    got = e.generate("My PIN is", p)
    assert_same(got, plain.generate("My PIN is", p))
    assert got[0].outputs[0].token_ids[:3] == free and got[0].outputs[0].finish_reason == "stop"
    s = e.stats()
    assert s["spec_num_draft_tokens"] == 3 and s["spec_num_accepted_tokens"] >= 2   # the trigger's tokens kept


def test_thinking_budget_forces_through_drafts(plain, spec):
    """thinking_token_budget: drafts of the reply without a budget (a proposer that drafts it) are kept up to
    the budget, where the forced </think> rejects them; the tokens are those without drafts."""
    class Unforced:
        def propose(self, reqs, ks):
            for r, k in zip(reqs, ks):
                r.draft_token_ids = free[r.num_output_tokens:r.num_output_tokens + k]

    prompt = plain.render_chat([{"role": "user", "content": "Why is the sky blue?"}]) + "<think>\n"
    free = plain.generate(prompt, SamplingParams(temperature=0, max_tokens=10))[0].outputs[0].token_ids
    p = SamplingParams(temperature=0, max_tokens=10, thinking_token_budget=5)
    own, spec.proposer, before = spec.proposer, Unforced(), accepted(spec)
    try:
        got = spec.generate(prompt, p)
    finally:
        spec.proposer = own
    assert_same(got, plain.generate(prompt, p))
    ids = got[0].outputs[0].token_ids
    assert ids[:5] == free[:5] and ids[5:8] == plain.tokenizer.encode("</think>", add_special_tokens=False)
    drafted, kept = (a - b for a, b in zip(accepted(spec), before))
    assert 0 < kept < drafted   # (the draft across the budget is cut by the forced token)


def test_batched_with_preemption_equals_alone(smollm2_gguf, plain):
    """Six concurrent requests in a pool too small for all of them (KV blocks of 4 tokens)."""
    p = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    prompts = [CODE, "one two three one two three one two", "a b c d a b c d a b", CODE * 2,
               "The cat sat on the mat. The cat sat on the", "1, 2, 3, 4, 5, 6, 7, 8,"]
    alone = [plain.generate(x, p)[0].outputs[0].token_ids for x in prompts]
    tiny = engine(smollm2_gguf, num_kv_blocks=30, block_size=4, max_num_batched_tokens=64, **SPEC)
    outs = tiny.generate(prompts, p)
    assert [o.outputs[0].token_ids for o in outs] == alone
    s = tiny.stats()
    assert s["num_preemptions"] > 0 and s["spec_num_accepted_tokens"] > 0 and s["kv_blocks_used"] == 0


@pytest.mark.parametrize("kv", ["int8", "fp8", "k8v4"])
def test_quantized_kv_cache_agrees_until_a_near_tie(smollm2_gguf, kv):
    """A draft's K/V comes from a projection of several rows, whose float rounding can move a
    quantization code: tokens must agree up to the first position where the reference's top two
    differ by less than 0.3 (summed over two chats: the first may open with such a near tie, which
    rounding anywhere before it can bring or take away; the counting one has none in 32 tokens)."""
    p = SamplingParams(temperature=0, max_tokens=32, logprobs=2)
    ref, e = engine(smollm2_gguf, kv_cache_dtype=kv), engine(smollm2_gguf, kv_cache_dtype=kv, **SPEC)
    checked = 0
    for chat in (CHATS[0], [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]):
        want, got = ref.chat(chat, p)[0].outputs[0], e.chat(chat, p)[0].outputs[0]
        for i, (a, b) in enumerate(zip(got.token_ids, want.token_ids)):
            if logprob_margin(want.logprobs[i]) < 0.3:
                break
            assert a == b, f"position {i}"
            checked += 1
    assert checked >= 16 and e.stats()["spec_num_accepted_tokens"] > 0


def test_tensor_parallel(smollm2_gguf, plain):
    p = SamplingParams(temperature=0, max_tokens=32, logprobs=1)
    e = engine(smollm2_gguf, tensor_parallel_size=2, **SPEC)
    try:
        assert_same(e.chat(CHATS, p), plain.chat(CHATS, p), logprob_tol=1e-3)
        assert e.stats()["spec_num_accepted_tokens"] > 0
    finally:
        e.close()


def test_server_streams_the_same_text_and_exports_acceptance(smollm2_gguf, plain):
    """`serve.py --speculative-method ngram` through the official client, streaming: the text
    equals the engine's without drafts, and /metrics counts the drafts kept."""
    from openai import OpenAI

    from tests.test_server_harness import MODEL, ServerProcess, metric, metrics

    want = plain.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=40))[0].outputs[0].text
    srv = ServerProcess(smollm2_gguf, "--speculative-method", "ngram", "--num-speculative-tokens", "3")
    try:
        srv.wait_ready()
        client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        chunks = client.chat.completions.create(model=MODEL, messages=CHATS[0], max_tokens=40, temperature=0,
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
        m = metrics(srv)
        kept = metric(m, "pocketcupy_spec_decode_num_accepted_tokens_total")
        assert 0 < kept <= metric(m, "pocketcupy_spec_decode_num_draft_tokens_total")
        assert metric(m, "pocketcupy_spec_decode_num_drafts_total") > 0
    finally:
        srv.stop()


def test_bench_spec_compares_against_plain_decoding(smollm2_gguf):
    import argparse

    from .helpers import load_script

    bench = load_script("bench_spec")
    args = argparse.Namespace(device="cpu", max_tokens=24, max_model_len=2048, temperature=0.0, seed=0)
    plain = bench.run(smollm2_gguf, args, {}, None)
    got = bench.run(smollm2_gguf, args, SPEC, None, baseline=plain)
    for name in bench.PROMPTS:
        r = got[name]
        assert r["same_tokens"] and r["tokens"] == plain[name]["tokens"] and r["speedup"] > 0
        assert r["tokens_per_forward"] >= 1 and "weight_roofline_frac" not in r
    assert got["copy_code"]["kept_frac"] > 0 and got["steps_with_drafts"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_cuda_same_tokens_as_without_drafts(smollm2_gguf, graphs):
    """On CUDA a step with drafts replays the decode graph with a row per token (eagerly: the prefill
    kernels over the cached prefix): greedy and seeded tokens agree with plain decoding on the same
    GPU up to the first near tie. (SmolLM2's head dim 64 takes the tensor-core decode kernel that
    stores the new K/V itself: in a verification graph it must not, as a row reads the K/V of the
    rows before it. It did, and an H100 run parted from plain decoding at position 8.)"""
    p = SamplingParams(temperature=0, max_tokens=64, logprobs=2)
    kw = dict(device="cuda", progress=False, cuda_graphs=graphs, kv_cache_memory=256 << 20)  # two engines at once
    want = [o.outputs[0] for o in Engine(smollm2_gguf, **kw).chat(CHATS, p)]
    e = Engine(smollm2_gguf, **kw, **SPEC)
    got = [o.outputs[0] for o in e.chat(CHATS, p)]
    for g, w in zip(got, want):
        for i, (a, b) in enumerate(zip(g.token_ids, w.token_ids)):
            if logprob_margin(w.logprobs[i]) < 0.3:
                break
            assert a == b, f"position {i}"
    assert e.stats()["spec_num_accepted_tokens"] > 0
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=48, repetition_penalty=1.1)
    plain = Engine(smollm2_gguf, **kw)
    assert [o.outputs[0].token_ids[:8] for o in e.chat(CHATS, seeded)] == \
        [o.outputs[0].token_ids[:8] for o in plain.chat(CHATS, seeded)]


@pytest.mark.gpu
def test_cuda_verification_replays_the_decode_graph():
    """With CUDA graphs a step with drafts replays the decode graph of its 1 + k rows (a bucket past
    1 for a single request), and the tokens agree with plain decoding's up to the first near tie
    (tiny_llama, whose greedy output repeats itself, so n-gram drafts are kept)."""
    import os

    from .conftest import FIXTURES

    path = os.path.join(FIXTURES, "tiny_llama")
    prompt = [[5, 17, 42, 101, 7, 250, 33, 64] * 3]
    p = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, logprobs=2)
    kw = dict(device="cuda", progress=False, kv_cache_memory=64 << 20)
    want = Engine(path, **kw).generate(prompt, p)[0].outputs[0]
    e = Engine(path, **kw, **SPEC)
    got = e.generate(prompt, p)[0].outputs[0]
    assert e.stats()["spec_num_accepted_tokens"] > 0
    assert any(key.bucket > 1 and not key.sample and key.shared for key in e.runner.graphs.graphs)
    for i, (a, b) in enumerate(zip(got.token_ids, want.token_ids)):
        if logprob_margin(want.logprobs[i]) < 0.01:
            break
        assert a == b, f"position {i}"


def test_decode_graphs_hold_the_verification_rows():
    """The target's decode graphs go up to 1 + k rows a sequence where drafts are verified through
    them (n-gram, draft model); MTP drafts (NumPy only) and plain decoding keep one a sequence."""
    from pocketcupy import EngineArgs
    from pocketcupy.engine_build import decode_graph_rows

    assert decode_graph_rows(EngineArgs(max_num_seqs=16)) == 16
    assert decode_graph_rows(EngineArgs(max_num_seqs=16, **SPEC)) == 16 * 5
    assert decode_graph_rows(EngineArgs(max_num_seqs=8, speculative_method="draft_model", speculative_model="m",
                                        num_speculative_tokens=2)) == 24
    assert decode_graph_rows(EngineArgs(max_num_seqs=8, speculative_method="mtp")) == 8

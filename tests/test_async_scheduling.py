"""Async scheduling on the CPU with the real SmolLM2: step N+1 is scheduled and launched before
step N's tokens reach the host (a PENDING_TOKEN stands in for each), then N's tokens are
resolved. Every output must be what the synchronous engine gives: preemption, stops that leave
one step computed in vain, aborts while a step is in flight, prefix caching, and the rows whose
sampling needs the previous token on the host (penalties, structured output, bad words of several
tokens), whose next step is launched before it all the same (late binding)."""
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.sched.request import PENDING_TOKEN

from .test_spec_decode import assert_same
from .test_batching_smollm2 import LONG_PREFIX, MAX_TOKENS, PROMPTS, alone, greedy, reference, run  # noqa: F401


def engine(path, mode, **kw):
    return Engine(path, device="cpu", progress=False, async_scheduling=mode, **kw)


@pytest.fixture(scope="module")
def async_on(smollm2_gguf):
    """An async engine with the default settings, shared by the tests that leave it idle (the
    synchronous one: conftest's smollm2_engine)."""
    return engine(smollm2_gguf, "on")


def test_async_with_preemption_matches_alone(smollm2_gguf, alone):  # noqa: F811
    tiny = engine(smollm2_gguf, "on", num_kv_blocks=12, block_size=4, max_num_batched_tokens=48)
    final, _ = run(tiny, [(f"r{i}", p, greedy(m), 0) for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS))])
    assert [final[f"r{i}"].outputs[0].token_ids for i in range(len(PROMPTS))] == alone
    st = tiny.stats()
    assert st["num_preemptions"] > 0
    assert st["kv_blocks_used"] == 0 and st["num_running"] == 0 and st["num_waiting"] == 0
    assert not tiny.has_unfinished_requests()


MIXED = [  # stops by EOS / stop string / length, seeded sampling with logprobs, n = 2, penalties, JSON
    ("Name three colours:", SamplingParams(temperature=0, max_tokens=40, stop=[","])),
    ("Hello! How are you today?", SamplingParams(temperature=0, max_tokens=60)),
    ("Once upon a time", SamplingParams(temperature=0.9, seed=11, max_tokens=12, logprobs=3, ignore_eos=True)),
    ("A list of fruits:", SamplingParams(n=2, temperature=0.7, seed=5, max_tokens=9, ignore_eos=True)),
    ("Repeat after me: la la la", SamplingParams(temperature=0, max_tokens=10, repetition_penalty=1.3,
                                                 ignore_eos=True)),
    ("A person as JSON:", SamplingParams(temperature=0, max_tokens=20, structured_outputs={
        "json": {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}})),
]


def summary(outputs):
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason,
              None if c.logprobs is None else [{t: round(lp.logprob, 4) for t, lp in pos.items()} for pos in c.logprobs])
             for c in o.outputs] for o in outputs]


def test_async_outputs_equal_sync(smollm2_gguf):
    prompts, params = zip(*MIXED)
    sync = engine(smollm2_gguf, "off").generate(list(prompts), list(params))
    eng = engine(smollm2_gguf, "on")
    got = eng.generate(list(prompts), list(params))
    assert summary(got) == summary(sync)
    assert sync[0].outputs[0].finish_reason == "stop" and sync[2].outputs[0].finish_reason == "length"
    # a request that stopped early left at most one step in flight; the next call settles it
    eng.generate("Hi", greedy(2))
    assert not eng.has_unfinished_requests() and eng.stats()["kv_blocks_used"] == 0


STOPS = [("Name three colours:", SamplingParams(temperature=0, max_tokens=40, stop=[","])),
         ("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[28])),
         ("The capital of France is", SamplingParams(temperature=0, max_tokens=25, stop=["."]))]


def test_stops_leave_one_step_in_vain(smollm2_gguf):
    """Greedy only, so every step overlaps the next: a stop string or stop token is seen one step
    late, and the token computed meanwhile is dropped."""
    prompts, params = zip(*STOPS)
    sync_eng, async_eng = engine(smollm2_gguf, "off"), engine(smollm2_gguf, "on")
    want, got = (e.generate(list(prompts), list(params)) for e in (sync_eng, async_eng))
    assert summary(got) == summary(want)
    assert [o.outputs[0].finish_reason for o in want] == ["stop", "stop", "stop"]
    wasted = async_eng.stats()["num_computed_tokens_total"] - sync_eng.stats()["num_computed_tokens_total"]
    assert 0 < wasted <= len(STOPS)


def test_n_samples_and_logprobs(smollm2_engine, async_on):
    p = SamplingParams(n=3, temperature=0.8, seed=9, max_tokens=10, logprobs=2, ignore_eos=True)
    want = smollm2_engine.generate("A list of fruits:", p)
    assert summary(async_on.generate("A list of fruits:", p)) == summary(want)


def test_abort_while_a_step_is_in_flight(async_on, alone):  # noqa: F811
    eng = async_on
    eng.add_request("keep", PROMPTS[0], greedy(MAX_TOKENS[0]))
    eng.add_request("drop", PROMPTS[2], greedy(40))
    finals = {}
    while len(eng.scheduler.requests["drop"].output_token_ids) < 3:
        for out in eng.step():
            finals[out.request_id] = out
    assert eng._inflight is not None and eng.scheduler.requests["drop"].output_token_ids[-1] == PENDING_TOKEN
    eng.abort_request("drop")
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
    assert finals["drop"].outputs[0].finish_reason == "abort"
    assert PENDING_TOKEN not in finals["drop"].outputs[0].token_ids
    assert finals["keep"].outputs[0].token_ids == alone[0]
    assert eng.stats()["kv_blocks_used"] == 0


def test_prompt_prefilled_in_chunks_alone(smollm2_gguf):
    """Steps that sample nothing (prompt chunks) leave nothing in flight."""
    prompt, p = LONG_PREFIX + "Which planet is the largest?", greedy(5)
    want = engine(smollm2_gguf, "off", max_num_batched_tokens=32).generate(prompt, p)[0].outputs[0].token_ids
    assert engine(smollm2_gguf, "on", max_num_batched_tokens=32).generate(prompt, p)[0].outputs[0].token_ids == want


def test_async_prefix_cache_hit(smollm2_gguf, reference):  # noqa: F811
    first, second = LONG_PREFIX + "Which planet is the largest?", LONG_PREFIX + "Which planet is closest to the Sun?"
    want = reference.generate(second, greedy(4))[0].outputs[0].token_ids
    eng = engine(smollm2_gguf, "on", block_size=8)
    eng.generate(first, greedy(4))
    b = eng.generate(second, greedy(4))[0]
    assert b.outputs[0].token_ids == want and b.num_cached_tokens >= 48


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_cpu_engine_steps_synchronously_unless_asked(smollm2_gguf, mode):
    eng = engine(smollm2_gguf, mode)
    eng.add_request("a", "Hi", greedy(3))
    outs = eng.step()
    assert eng._inflight is None and outs and outs[0].outputs[0].token_ids


def test_async_scheduling_setting_is_checked():
    with pytest.raises(ValueError, match="async_scheduling"):
        Engine(device="cpu", async_scheduling="yes")
    with pytest.raises(ValueError, match="async_scheduling: 'on' needs one rank"):
        Engine(device="cpu", async_scheduling="on", tensor_parallel_size=2)


def steps_aborting(eng, requests, abort_id, abort_after):
    """Adds the (request_id, prompt, params) and steps to the end, aborting abort_id once it has
    abort_after tokens (on the host). Returns the final outputs in the order of requests, and the
    number of steps and of those that left the next step in flight."""
    for rid, prompt, params in requests:
        eng.add_request(rid, prompt, params)
    final, steps, in_flight = {}, 0, 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
        steps, in_flight = steps + 1, in_flight + (eng._inflight is not None)
        if abort_id not in final and len(eng._seqs[abort_id].output.token_ids) >= abort_after:
            eng.abort_request(abort_id)
    return [final[rid] for rid, _, _ in requests], steps, in_flight


def test_late_bound_rows_equal_sync(smollm2_engine, async_on):
    """Rows whose sampling needs the previous token on the host (a JSON schema, a strict tool call's
    grammar that starts after a trigger, penalties, a bad word of several tokens, a thinking budget) are
    launched a step ahead and masked once that token is in (late binding): greedy and seeded, with a
    stop string and an abort mid-way in the batch, every output is the synchronous engine's."""
    check_late_bound(smollm2_engine, async_on)


def check_late_bound(sync, eng) -> None:
    """The late-bound batch on engine `eng` (async) against `sync` (the same model, synchronous); the
    CUDA twin of the test above (test_structured_cuda.py) calls it too."""
    from pocketcupy.server import tool_grammar

    tok = sync.tokenizer
    close_ids = sync.thinking_markers[1]
    prompt = sync.chat_prompt_ids([{"role": "user", "content": "Why is the sky blue?"}])
    free = sync.generate(prompt, greedy(4))[0].outputs[0].token_ids
    word = tok.decode(free[1:3])   # two tokens of the free output, banned as one word
    call = tool_grammar.hermes({"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}})
    json = {"json": {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}
    requests = [
        ("json", "A person as JSON:", SamplingParams(temperature=0, max_tokens=16, structured_outputs=json)),
        ("json-seeded", "A person as JSON:", SamplingParams(temperature=0.9, seed=4, max_tokens=8,
                                                            structured_outputs=json)),
        ("tool", prompt, SamplingParams(temperature=0, max_tokens=10, structured_outputs={
            "grammar": call, "start_after": free[1:3], "repeat": True})),
        ("penalties", "Once upon a time", SamplingParams(temperature=0.8, seed=7, max_tokens=8, ignore_eos=True,
                                                         frequency_penalty=0.8, presence_penalty=0.4, logprobs=2)),
        ("bad-word", prompt, SamplingParams(temperature=0, max_tokens=5, bad_words=[word])),
        ("thinking", tok.decode(prompt) + "<think>\n", SamplingParams(temperature=0.8, seed=5, max_tokens=8,
                                                                     thinking_token_budget=2)),
        ("stop", "Name three colours:", SamplingParams(temperature=0, max_tokens=30, stop=[","],
                                                       repetition_penalty=1.2)),
        ("abort", "Repeat after me: la la la", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                              repetition_penalty=1.3)),
    ]
    want, _, _ = steps_aborting(sync, requests, "abort", 3)
    got, steps, in_flight = steps_aborting(eng, requests, "abort", 3)
    assert summary(got) == summary(want)
    assert in_flight == steps - 1   # every step overlapped the next but the last (nothing left to launch)
    by_id = {rid: out.outputs[0] for (rid, _, _), out in zip(requests, want)}
    assert by_id["tool"].token_ids[:3] == free[:3] and \
        by_id["tool"].text.replace(tok.decode(free[:3]), "").lstrip().startswith('{"name": "')
    assert by_id["bad-word"].token_ids[:2] == free[:2] and by_id["bad-word"].token_ids[2] != free[2]
    assert by_id["json"].finish_reason == "stop"   # the structure complete
    assert by_id["thinking"].token_ids[2:2 + len(close_ids)] == list(close_ids)   # the budget's forced end
    assert by_id["stop"].finish_reason == "stop" and by_id["stop"].stop_reason == ","
    assert by_id["abort"].finish_reason == "abort" and len(by_id["abort"].token_ids) == 3
    assert not eng.has_unfinished_requests() and eng.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, structured_outputs={"json": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}),
    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, presence_penalty=0.5),
    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, bad_words=["blue sky"]),
], ids=["structured", "penalties", "bad-words"])
def test_late_bound_step_stays_in_flight(async_on, params):
    """Such a row no longer turns async scheduling off: after each step() the next step is in flight,
    its token still PENDING_TOKEN on the host, while the engine resolved the one before it."""
    async_on.add_request("late", "The sky is blue because", params)
    for _ in range(3):
        async_on.step()
        pending = async_on.scheduler.requests["late"].output_token_ids[-1] == PENDING_TOKEN
        assert async_on._inflight is not None and pending
    while async_on.has_unfinished_requests():
        async_on.step()


def test_thinking_budget_alone_binds_late(smollm2_engine, async_on):
    """A row whose only host-side need is its thinking budget (the count advances as tokens reach the
    host) binds late too: the end marker is forced after exactly `budget` tokens, as without async."""
    prompt = smollm2_engine.render_chat([{"role": "user", "content": "Why is the sky blue?"}]) + "<think>\n"
    params = SamplingParams(temperature=0, max_tokens=8, thinking_token_budget=2)
    want = smollm2_engine.generate(prompt, params)[0].outputs[0].token_ids
    assert async_on.generate(prompt, params)[0].outputs[0].token_ids == want
    close = list(smollm2_engine.thinking_markers[1])
    assert want[2:2 + len(close)] == close


# --- with speculative decoding: a step stays in flight when no request drafts at the next one ----------
COUNT = "Count: 1, 2, 3, 4, 5, 6,"   # n-gram drafts that fail: adaptive drafting stops them, then probes


def trace_steps(eng, requests, abort_id=None, abort_after=0):
    """steps_aborting's run, traced: each step() as "D" (it verified drafts), "f" (it left the next step
    in flight) or "." (resolved at once). Returns the final outputs of requests and the trace."""
    for rid, prompt, params in requests:
        eng.add_request(rid, prompt, params)
    final, trace = {}, ""
    while eng.has_unfinished_requests():
        drafts = eng.stats()["spec_num_drafts"]
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
        trace += "D" if eng.stats()["spec_num_drafts"] > drafts else "f" if eng._inflight is not None else "."
        if abort_id in eng._seqs and len(eng._seqs[abort_id].output.token_ids) >= abort_after:
            eng.abort_request(abort_id)
    return [final[rid] for rid, _, _ in requests], trace


def assert_switched(trace: str) -> None:
    """Drafts verified, and steps left in flight after them (adaptive drafting stopped the drafts)."""
    assert "D" in trace and "f" in trace[trace.index("D"):], trace


def test_ngram_drafts_stop_and_steps_go_in_flight(smollm2_gguf, smollm2_engine):
    """n-gram drafts that fail, with adaptive drafting: once it stops them a step stays in flight (no
    request drafts at the next) as without a proposer; the steps before a draft or a probe are resolved
    at once to draft from their tokens; the tokens are plain decoding's (seeded: the mixed batch below)."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    eng = engine(smollm2_gguf, "on", speculative_method="ngram", num_speculative_tokens=3)
    got, trace = trace_steps(eng, [("count", COUNT, params)])
    assert_same(got, smollm2_engine.generate(COUNT, params))
    assert_switched(trace)
    assert not eng.has_unfinished_requests() and eng.stats()["kv_blocks_used"] == 0


def test_ngram_requests_whose_text_does_not_repeat_leave_steps_in_flight(smollm2_gguf, smollm2_engine):
    """Where the n-gram proposer finds nothing, the request rests before it is asked again, so most steps
    stay in flight (before: 6 and 1 of 33); the tokens are plain decoding's."""
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    eng = engine(smollm2_gguf, "on", speculative_method="ngram", num_speculative_tokens=3)
    for prompt in ("Why is the sky blue? Answer in a paragraph.", "Write a short poem about autumn leaves."):
        got, trace = trace_steps(eng, [("q", prompt, params)])
        assert_same(got, smollm2_engine.generate(prompt, params))
        assert trace.count("f") >= len(trace) // 2, trace


def test_ngram_mixed_batch_with_stops_and_an_abort(smollm2_gguf, smollm2_engine):
    """Requests that draft beside ones that do not, ending by stop string, stop token, max_tokens and an
    abort: every output is plain decoding's (the aborted one its first tokens)."""
    requests = [("stop", "Name three colours:", SamplingParams(temperature=0, max_tokens=30, stop=[","])),
                ("stop-id", "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[28])),
                ("seeded", "Once upon a time", SamplingParams(temperature=0.9, seed=11, max_tokens=10, logprobs=1,
                                                              ignore_eos=True)),
                ("abort", "Repeat after me: la la la", SamplingParams(temperature=0, max_tokens=12,
                                                                      ignore_eos=True))]
    want = smollm2_engine.generate([p for _, p, _ in requests], [sp for _, _, sp in requests])
    eng = engine(smollm2_gguf, "on", speculative_method="ngram", num_speculative_tokens=3)
    got, trace = trace_steps(eng, requests, "abort", 4)
    assert_same(got[:-1], want[:-1])
    assert [o.outputs[0].finish_reason for o in got] == ["stop", "stop", "length", "abort"]
    aborted, full = got[-1].outputs[0].token_ids, want[-1].outputs[0].token_ids
    assert len(aborted) >= 4 and aborted == full[:len(aborted)] and PENDING_TOKEN not in aborted
    assert "D" in trace and "f" in trace, trace
    assert not eng.has_unfinished_requests() and eng.stats()["kv_blocks_used"] == 0

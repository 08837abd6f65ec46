"""AsyncEngine: coroutines' requests batched by the step loop, with the real SmolLM2 on the CPU."""
import asyncio
import contextlib

import numpy as np
import pytest

from pocketcupy import AsyncEngine, PoolingParams, RequestOutputKind, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    return smollm2_engine


@pytest.fixture(scope="module")
def aengine(engine):
    a = AsyncEngine.from_engine(engine)
    yield a
    asyncio.run(a.shutdown(30))


async def _last(agen):
    outs = [out async for out in agen]
    return outs[-1], outs


def _idle(engine) -> bool:
    return not engine.has_unfinished_requests() and engine.scheduler.num_blocks_used == 0


async def _until_idle(engine, seconds: float = 30) -> bool:
    for _ in range(int(seconds / 0.05)):
        if _idle(engine):
            return True
        await asyncio.sleep(0.05)
    return False


def test_concurrent_requests_match_alone(engine, aengine):
    prompts = [f"Fact number {i} about the sea:" for i in range(6)]
    alone = [engine.generate(p, GREEDY)[0].outputs[0].token_ids for p in prompts]

    async def main():
        return await asyncio.gather(*(_last(aengine.generate(p, GREEDY)) for p in prompts))

    for (last, outs), ids in zip(asyncio.run(main()), alone):
        assert last.finished and last.outputs[0].token_ids == ids
        assert last.outputs[0].text == engine.tokenizer.decode(ids, skip_special_tokens=True)
        # every step's delta, in order, makes the whole: the outputs came as they were produced
        assert len(outs) > 1 and sum((o.outputs[0].delta_token_ids for o in outs), []) == ids
        assert not any(o.finished for o in outs[:-1])


def test_chat_stream_and_n(engine, aengine):
    messages = [{"role": "user", "content": "Name a colour."}]
    want = engine.chat(messages, GREEDY)[0].outputs[0]
    two = SamplingParams(n=2, temperature=0.8, seed=5, max_tokens=6)
    want_two = [c.token_ids for c in engine.generate("Once upon a time", two)[0].outputs]

    async def main():   # (by vLLM's keyword name too)
        chat, _ = await _last(aengine.chat(messages, GREEDY))
        text = "".join([d async for d in aengine.stream(messages, sampling_params=GREEDY)])
        pair, _ = await _last(aengine.generate("Once upon a time", sampling_params=two))
        return chat, text, pair

    chat, text, pair = asyncio.run(main())
    assert chat.outputs[0].token_ids == want.token_ids and text == want.text
    assert [c.token_ids for c in pair.outputs] == want_two


def test_output_kind(engine, aengine):
    """vLLM's output_kind for AsyncLLM: DELTA yields what each step added, FINAL_ONLY the finished output
    alone (a TypeError before)."""
    p = SamplingParams(temperature=0, max_tokens=10, logprobs=1)
    want = engine.generate("Once upon a time", p)[0].outputs[0]

    async def main():
        delta = [o async for o in aengine.generate("Once upon a time", p.clone(output_kind=RequestOutputKind.DELTA))]
        final = [o async for o in aengine.generate("Once upon a time",
                                                   p.clone(output_kind=RequestOutputKind.FINAL_ONLY))]
        return delta, final

    delta, final = asyncio.run(main())
    assert len(delta) > 1 and delta[-1].finished and "".join(o.outputs[0].text for o in delta) == want.text
    assert sum((o.outputs[0].token_ids for o in delta), []) == want.token_ids
    assert sum((o.outputs[0].logprobs for o in delta), []) == want.logprobs
    assert len(final) == 1 and final[0].finished and final[0].outputs[0].token_ids == want.token_ids
    assert final[0].outputs[0].text == want.text


def test_chat_template_argument(engine, aengine):
    """AsyncEngine.chat takes chat_template as Engine.chat (vLLM's LLM.chat) does."""
    template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    messages = [{"role": "user", "content": "Once upon a time"}]
    want = engine.chat(messages, GREEDY, chat_template=template)[0]
    last, _ = asyncio.run(_last(aengine.chat(messages, GREEDY, chat_template=template)))
    assert last.prompt_token_ids == want.prompt_token_ids == engine.tokenizer.encode("Once upon a time\n")
    assert last.outputs[0].token_ids == want.outputs[0].token_ids


def test_reset_prefix_cache(engine, aengine):
    """AsyncEngine.reset_prefix_cache(), a coroutine (vLLM's AsyncLLM's)."""
    prompt = "A long story about a dragon who guarded a mountain of gold for a thousand years. " * 3

    async def main():
        await _last(aengine.generate(prompt, GREEDY))
        hit, _ = await _last(aengine.generate(prompt, GREEDY))
        reset = await aengine.reset_prefix_cache()
        miss, _ = await _last(aengine.generate(prompt, GREEDY))
        return hit, reset, miss

    hit, reset, miss = asyncio.run(main())
    assert hit.num_cached_tokens > 0 and reset and miss.num_cached_tokens == 0


def test_get_tokenizer(engine, aengine):
    """vLLM's AsyncLLM.get_tokenizer(), a coroutine (an AttributeError before)."""
    tok = asyncio.run(aengine.get_tokenizer())
    assert tok is engine.tokenizer and tok.decode(tok.encode("Once upon a time")) == "Once upon a time"


def test_embed_equals_engine_embed(engine, aengine):
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    for pooling in (None, PoolingParams("mean", normalize=False)):
        want = engine.embed(texts, pooling)

        async def main():   # (by vLLM's keyword name too)
            return await asyncio.gather(*(aengine.embed(t, pooling_params=pooling) for t in texts))

        for got, w in zip(asyncio.run(main()), want):
            assert got.prompt_token_ids == w.prompt_token_ids
            np.testing.assert_allclose(got.outputs.embedding, w.outputs.embedding, rtol=1e-5, atol=1e-6)


def test_abort_by_id_ends_the_generator(engine, aengine):
    long = SamplingParams(max_tokens=3000, ignore_eos=True)

    async def main():
        outs = []
        async for out in aengine.generate("Tell a long story.", long, request_id="long-1"):
            outs.append(out)
            if len(outs) == 2:
                await aengine.abort("long-1")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert len(outs[-1].outputs[0].token_ids) < 3000


def test_abort_a_list_of_ids(engine, aengine):
    """abort() takes a list of ids, as its signature says (it raised AttributeError on the list)."""
    long = SamplingParams(max_tokens=3000, ignore_eos=True)

    async def main():
        async def reader(rid):
            return await _last(aengine.generate("Tell a long story.", long, request_id=rid))
        tasks = [asyncio.ensure_future(reader(rid)) for rid in ("many-1", "many-2")]
        while engine.stats()["num_running"] < 2:
            await asyncio.sleep(0.01)
        await aengine.abort(["many-1", "many-2"])
        return await asyncio.wait_for(asyncio.gather(*tasks), 60)

    finals = [last for last, _ in asyncio.run(main())]
    assert [f.outputs[0].finish_reason for f in finals] == ["abort", "abort"]
    assert asyncio.run(_last(aengine.generate("The sky is", GREEDY)))[0].outputs[0].token_ids == \
        engine.generate("The sky is", GREEDY)[0].outputs[0].token_ids


def test_caller_stopping_early_aborts(engine, aengine):
    long = SamplingParams(max_tokens=3000, ignore_eos=True)

    async def broken_off():
        async with contextlib.aclosing(aengine.generate("Count to a thousand:", long, request_id="gone")) as agen:
            async for _ in agen:
                break
        return await _until_idle(engine)

    async def cancelled():
        async def reader():
            async for _ in aengine.generate("Count to a thousand:", long, request_id="gone"):
                pass
        task = asyncio.ensure_future(reader())
        while not engine.has_unfinished_requests():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await _until_idle(engine)

    assert asyncio.run(broken_off())
    assert asyncio.run(cancelled())   # and the id "gone" was free again


def test_event_loop_gone_mid_request_leaves_the_engine_serving(engine, aengine, caplog):
    """A request's event loop ends while it runs: asyncio.run's clean-up closes its generator, which
    aborts it; an event loop closed without that clean-up makes the step loop's next output for it
    undeliverable, and the request is aborted then. Either way the step loop must not fail (it
    serves everyone else) and the next event loop's requests run."""
    long = SamplingParams(max_tokens=3000, ignore_eos=True)

    async def leave():
        agen = aengine.generate("Write a poem about rain.", long)
        await agen.__anext__()   # running; the generator is left to asyncio.run's clean-up

    with caplog.at_level("ERROR", logger="pocketcupy"):
        asyncio.run(leave())
        assert asyncio.run(_until_idle(engine))
        bare = asyncio.new_event_loop()
        agen = aengine.generate("Write a poem about snow.", long)
        first = bare.run_until_complete(agen.__anext__())
        bare.close()   # no shutdown_asyncgens: the generator stays open
        assert not first.finished and asyncio.run(_until_idle(engine))
        asyncio.run(agen.aclose())
    assert not [r for r in caplog.records if "step failed" in r.getMessage()]

    async def after():
        last, _ = await _last(aengine.generate("Hello", GREEDY))
        return last, await _until_idle(engine)

    last, idle = asyncio.run(after())
    assert last.outputs[0].token_ids == engine.generate("Hello", GREEDY)[0].outputs[0].token_ids
    assert idle


def test_bad_arguments_raise_and_the_engine_goes_on(engine, aengine):
    async def main():
        with pytest.raises(ValueError, match="max_tokens"):
            await _last(aengine.generate("hi", SamplingParams(max_tokens=10**7)))
        with pytest.raises(ValueError, match="n: stream"):
            [d async for d in aengine.stream("hi", SamplingParams(n=2))]
        with pytest.raises(ValueError, match="pooling"):
            await aengine.embed("hi", "mean")
        with pytest.raises(ValueError, match="^sampling_params: given together with params"):
            await _last(aengine.generate("hi", GREEDY, sampling_params=GREEDY))
        with pytest.raises(ValueError, match="^priority: .*not enabled"):   # the engine's policy is fcfs
            await _last(aengine.generate("hi", GREEDY, priority=2))
        with pytest.raises(ValueError, match="^priority: .*not enabled"):
            await aengine.embed("hi", priority=-1)
        last, _ = await _last(aengine.generate("hi", SamplingParams(max_tokens=2)))
        return last

    last = asyncio.run(main())
    assert last.finished and len(last.outputs[0].token_ids) == 2
    stats = asyncio.run(aengine.stats())
    assert stats["num_running"] == 0


def test_score_equals_engine_score(engine, aengine, smollm2_gguf):
    docs = ["Paris is in France.", "Cats eat fish.", "The sea is blue."]
    want = [o.outputs.score for o in engine.score("Where is Paris?", docs)]
    got = asyncio.run(aengine.score("Where is Paris?", docs))
    np.testing.assert_allclose([o.outputs.score for o in got], want, atol=1e-6)
    reranker = AsyncEngine(smollm2_gguf, device="cpu", progress=False, score_tokens="no,yes")
    try:
        want = [o.outputs.score for o in reranker.engine.score("Where is Paris?", docs)]
        got = asyncio.run(reranker.score("Where is Paris?", docs))
        np.testing.assert_allclose([o.outputs.score for o in got], want, atol=1e-6)
        assert [o.prompt_token_ids for o in got] == [reranker.engine.pair_ids("Where is Paris?", d) for d in docs]
    finally:
        asyncio.run(reranker.shutdown(30))

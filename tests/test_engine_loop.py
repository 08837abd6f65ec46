"""The background step loop: concurrent submission from threads, abort, failures surface."""
import threading

import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.engine_loop import EngineLoop


@pytest.fixture(scope="module")
def engine(smollm2_gguf):
    return Engine(smollm2_gguf, device="cpu", progress=False)


def test_concurrent_threads_match_alone(engine):
    prompts = [f"Fact number {i} about the moon:" for i in range(6)]
    p = SamplingParams(temperature=0, max_tokens=10)
    alone = [o.outputs[0].token_ids for o in (engine.generate(x, p)[0] for x in prompts)]
    loop = EngineLoop(engine)
    results = [None] * len(prompts)

    def client(i):
        stream = loop.submit(prompts[i], p)
        text = "".join(o.outputs[0].delta_text for o in stream)
        results[i] = (stream.request_id, text)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in results)
    for (rid, text), ids in zip(results, alone):
        assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    loop.shutdown(10)
    assert loop.num_open_streams == 0


def test_abort_from_client(engine):
    loop = EngineLoop(engine)
    # far more tokens than the loop makes while the client thread waits for the GIL (200 could all
    # be made before the abort arrived on a loaded 2-core machine)
    stream = loop.submit("Write a long story about a dragon.", SamplingParams(max_tokens=3000, ignore_eos=True))
    first = stream.get(timeout=30)
    assert not first.finished
    stream.abort()
    last = stream.result()
    assert last.finished and last.outputs[0].finish_reason == "abort"
    loop.shutdown(10)
    assert engine.scheduler.num_blocks_used == 0


def test_bad_submission_raises_in_caller(engine):
    loop = EngineLoop(engine)
    with pytest.raises(ValueError, match="max_tokens"):
        loop.submit("hi", SamplingParams(max_tokens=10**7))
    ok = loop.submit("hi", SamplingParams(max_tokens=2)).result()
    assert ok.finished and len(ok.outputs[0].token_ids) == 2
    loop.shutdown(10)

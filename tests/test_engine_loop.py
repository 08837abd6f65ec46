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


def drain(stream, timeout=60):
    """The stream's outputs to the last (queue.Empty if one does not come in time, not a hang)."""
    outs = []
    while not stream.finished:
        outs.append(stream.get(timeout=timeout))
    return outs


def test_request_id_reused_right_after_abort(engine):
    """A request id is free as soon as its request is aborted; the old request's last output goes to
    its own stream, never to the new request's (the loop used to route outputs by id)."""
    p = SamplingParams(temperature=0, max_tokens=8)
    alone = engine.generate("The capital of France is", p)[0].outputs[0].token_ids
    loop = EngineLoop(engine)
    old = loop.submit("Write a long story about a dragon.", SamplingParams(max_tokens=3000, ignore_eos=True),
                      request_id="same")
    assert not old.get(timeout=30).finished
    with pytest.raises(ValueError, match="^request_id: 'same' is already in use"):
        loop.submit("hi", p, request_id="same")
    old.abort()
    new = loop.submit("The capital of France is", p, request_id="same")
    assert drain(old)[-1].outputs[0].finish_reason == "abort"
    outs = drain(new)
    assert [t for o in outs for t in o.outputs[0].delta_token_ids] == alone == outs[-1].outputs[0].token_ids
    assert outs[-1].outputs[0].finish_reason == "length"
    again = drain(loop.submit("The capital of France is", p, request_id="same"))   # after it finished
    assert again[-1].outputs[0].token_ids == alone
    loop.shutdown(10)
    assert loop.num_open_streams == 0 and engine.scheduler.num_blocks_used == 0

"""The background step loop: concurrent submission from threads, abort, failures surface."""
import threading
import time

import numpy as np
import pytest

from pocketcupy import SamplingParams
from pocketcupy.engine_loop import EngineLoop


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    return smollm2_engine


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


def test_shutdown_delivers_an_abort_still_owed(engine):
    """A request aborted just before shutdown() still gets its final output (the loop used to stop
    once no request was running, and the stream's reader waited forever)."""
    loop = EngineLoop(engine)
    with loop._wake:   # the loop thread cannot step before shutdown() is called
        stream = loop.submit("Write a long story.", SamplingParams(max_tokens=3000, ignore_eos=True))
        stream.abort()
        loop.shutdown(0)
    loop._thread.join(30)
    assert not loop._thread.is_alive()
    last = stream.get(timeout=5)
    assert last.finished and last.outputs[0].finish_reason == "abort"
    assert not engine.has_pending_outputs()


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


def long_stream(loop, request_id):
    """A stream that runs until it is aborted or fails, past its first output."""
    stream = loop.submit("Write a long story about a dragon.", SamplingParams(max_tokens=3000, ignore_eos=True),
                         request_id=request_id)
    assert not stream.get(timeout=30).finished
    return stream


def test_request_id_reused_right_after_abort(engine):
    """A request id is free as soon as its request is aborted; the old request's last output goes to
    its own stream, never to the new request's (the loop used to route outputs by id)."""
    p = SamplingParams(temperature=0, max_tokens=8)
    alone = engine.generate("The capital of France is", p)[0].outputs[0].token_ids
    loop = EngineLoop(engine)
    old = long_stream(loop, "same")
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


def fail_detokenizer(engine, request_id):
    """Makes the live request's own detokenizer raise from its next token on: the one fault injected
    here (an attribute of that request's SequenceState, nothing shared), as no input makes the real
    engine's per-request code fail (grammars, stop strings, logprobs and the rest are checked first)."""
    with engine._lock:
        seq = engine._seqs[request_id]

        def push(token_id):
            raise RuntimeError(f"detokenizer of {request_id} failed at token {token_id}")
        seq.detok.push = push


def test_one_request_failing_leaves_the_others(engine):
    """An error of one request's own (here its detokenizer) ends that request alone, with finish_reason
    "error"; the request beside it in the same steps runs on as if alone (it got the error too)."""
    p = SamplingParams(temperature=0, max_tokens=10)
    alone = engine.generate("The capital of France is", p)[0].outputs[0].token_ids
    engine.add_request("good", "The capital of France is", p)
    engine.add_request("bad", "Write a long story about a dragon.", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    fail_detokenizer(engine, "bad")
    finals = {}
    while engine.has_unfinished_requests():
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
    assert finals["bad"].outputs[0].finish_reason == "error" and len(finals["bad"].outputs[0].token_ids) == 2
    assert finals["good"].outputs[0].token_ids == alone and finals["good"].outputs[0].finish_reason == "length"
    assert engine.scheduler.num_blocks_used == 0
    assert engine.generate("The capital of France is", p)[0].outputs[0].token_ids == alone


def test_input_errors_are_logged_without_a_traceback(engine, caplog):
    """A request failed for its input (a ValueError naming the field: the client's mistake, a 400 through the
    server; here a choice of "yes" with bad_words ["yes"]) is logged at INFO without a traceback (was an ERROR
    with one, as for a bug); an internal error (its detokenizer failing) is still an ERROR with its traceback."""
    bad_input = SamplingParams(temperature=0, max_tokens=4, structured_outputs={"choice": ["yes"]}, bad_words=["yes"])
    with caplog.at_level("INFO", logger="pocketcupy"):
        with pytest.raises(ValueError, match="^bad_words: "):
            engine.generate("Say yes", bad_input)
        engine.add_request("internal", "Write a long story.", SamplingParams(max_tokens=20, ignore_eos=True))
        engine.step()
        fail_detokenizer(engine, "internal")
        while engine.has_unfinished_requests():
            engine.step()
    failed = [(r.levelname, r.exc_info is not None, "bad_words: " in r.getMessage())
              for r in caplog.records if r.getMessage().startswith("request ")]
    assert failed == [("INFO", False, True), ("ERROR", True, False)]


def test_one_sampling_row_failing_leaves_the_others(engine):
    """A batch whose sampling raises because of one row (here a request's allowed-token mask emptied
    in its own SamplingRow, which the sampler refuses) is sampled again row by row: that request
    fails, the others keep their tokens (seeded sampling included)."""
    greedy = SamplingParams(temperature=0, max_tokens=8)
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=8)
    alone = [engine.generate("The capital of France is", greedy)[0].outputs[0].token_ids,
             engine.generate("My favourite animal is", seeded)[0].outputs[0].token_ids]
    engine.add_request("greedy", "The capital of France is", greedy)
    engine.add_request("bad", "Write a long story about a dragon.", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("seeded", "My favourite animal is", seeded)
    engine.step()
    with engine._lock:
        engine._seqs["bad"].row.allowed_mask = np.zeros(engine.config.vocab_size, bool)
    finals = {}
    while engine.has_unfinished_requests():
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
    assert finals["bad"].outputs[0].finish_reason == "error"
    assert [finals[r].outputs[0].token_ids for r in ("greedy", "seeded")] == alone
    assert engine.scheduler.num_blocks_used == 0


def test_one_stream_failing_leaves_the_others(engine):
    """Through the step loop (as the server uses it): the failed request's stream raises its error,
    a concurrent stream finishes as if alone, and new requests are served."""
    p = SamplingParams(temperature=0, max_tokens=12)
    alone = engine.generate("The capital of France is", p)[0].outputs[0].token_ids
    loop = EngineLoop(engine)
    bad = long_stream(loop, "bad")
    good = loop.submit("The capital of France is", p)
    fail_detokenizer(engine, "bad")
    with pytest.raises(RuntimeError, match="detokenizer of bad failed"):
        drain(bad)
    outs = drain(good)
    assert outs[-1].outputs[0].token_ids == alone and outs[-1].outputs[0].finish_reason == "length"
    assert drain(loop.submit("The capital of France is", p))[-1].outputs[0].token_ids == alone
    loop.shutdown(10)
    assert loop.num_open_streams == 0 and engine.scheduler.num_blocks_used == 0


def test_failed_forward_ends_every_request_and_the_engine_goes_on(engine, monkeypatch):
    """An error no request owns (the batch's forward; injected by making the runner raise once) ends
    every request with finish_reason "error" and step() returns; nothing is left half-stepped (a
    request whose step raised used to stay scheduled with no token, and never progressed)."""
    execute = engine.runner.execute
    calls = []

    def fail_once(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("forward failed")
        return execute(*a, **kw)
    monkeypatch.setattr(engine.runner, "execute", fail_once)
    engine.add_request("x", "Once upon a time", SamplingParams(max_tokens=20))
    engine.add_request("y", "The sky is", SamplingParams(max_tokens=20))
    finals = {}
    for _ in range(5):
        finals.update((o.request_id, o) for o in engine.step() if o.finished)
    assert {r: o.outputs[0].finish_reason for r, o in finals.items()} == {"x": "error", "y": "error"}
    assert not engine.has_unfinished_requests() and engine.scheduler.num_blocks_used == 0
    p = SamplingParams(temperature=0, max_tokens=4)
    assert engine.generate("hi", p)[0].outputs[0].finish_reason == "length"
    loop = EngineLoop(engine)   # a stream gets the error, no hang
    calls.clear()
    calls.append(1)
    with pytest.raises(RuntimeError, match="forward failed"):
        drain(loop.submit("hi", p))
    assert drain(loop.submit("hi", p))[-1].outputs[0].finish_reason == "length"
    loop.shutdown(10)


def test_failed_forward_leaves_no_uncomputed_block_in_the_prefix_cache(engine, monkeypatch):
    """Blocks enter the prefix cache when their tokens are scheduled: those of a step whose forward
    failed held no K/V, yet the same prompt again hit them (its first block) and came out wrong."""
    prompt = "The history of the Roman empire begins with the founding of the city of Rome, which legend says"
    p = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    alone = engine.generate(prompt, p)[0].outputs[0].token_ids
    assert engine.reset_prefix_cache()
    execute = engine.runner.execute

    def fail(*a, **kw):
        raise RuntimeError("forward failed")
    monkeypatch.setattr(engine.runner, "execute", fail)
    with pytest.raises(RuntimeError, match="forward failed"):
        engine.generate(prompt, p)
    monkeypatch.setattr(engine.runner, "execute", execute)
    again = engine.generate(prompt, p)[0]
    assert again.outputs[0].token_ids == alone and again.num_cached_tokens == 0


def test_keyboard_interrupt_mid_step_ends_every_request(engine, monkeypatch):
    """A Ctrl-C landing inside a step (here between the forward and the sampling) raises from
    generate(); the request beside it, whose tokens that step had computed but not sampled, used to
    stay running with nothing to schedule, never finishing. Now every request ends with "error" (the
    step is half done), add_request's gets its final output from step(), and the engine goes on."""
    p = SamplingParams(temperature=0, max_tokens=3)
    engine.add_request("bystander", "Once upon a time", SamplingParams(max_tokens=20))
    engine.step()
    launch = engine.sampler.launch

    def interrupt(*a, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(engine.sampler, "launch", interrupt)
    with pytest.raises(KeyboardInterrupt):
        engine.generate("The sky is", p)
    monkeypatch.setattr(engine.sampler, "launch", launch)
    finals = {}
    for _ in range(3):
        finals.update((o.request_id, o.outputs[0].finish_reason) for o in engine.step() if o.finished)
    assert finals == {"bystander": "error"}
    assert not engine.has_unfinished_requests() and not engine.has_pending_outputs()
    assert engine.scheduler.num_blocks_used == 0
    assert engine.generate("The sky is", p)[0].outputs[0].finish_reason == "length"


def test_stats_without_waiting(engine):
    """stats(wait=False) (a /metrics scrape) answers during a step with the counters as it began, but
    waits for anything short that holds the engine (a request added): its counters are current then."""
    got, held, release = [], threading.Event(), threading.Event()

    def hold():
        with engine._lock:
            held.set()
            release.wait(5)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    got.append(engine.stats(wait=False))
    assert time.monotonic() - t0 >= 0.25 and got[0]["num_waiting"] == 0   # not a step: waited
    t.join()
    engine._step_stats = {"num_waiting": 7}   # what a step in progress left
    try:
        with engine._lock:   # (the step's, as seen from another thread)
            th = threading.Thread(target=lambda: got.append(engine.stats(wait=False)))
            th.start()
            th.join(5)
        assert got[1] == {"num_waiting": 7}
    finally:
        engine._step_stats = None
    assert engine.stats(wait=False)["num_waiting"] == 0

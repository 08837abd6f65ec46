"""The Engine API end to end on the CPU with the real SmolLM2-135M-Instruct."""
import argparse
import copy
import dataclasses
import pathlib

import numpy as np
import pytest

from pocketcupy import Engine, EngineArgs, RequestOutputKind, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    return smollm2_engine


def text_of(engine, prompt, params):
    return engine.generate(prompt, params)[0].outputs[0]


def test_capital_of_france(engine):
    out = engine.chat([{"role": "user", "content": "What is the capital of France?"}],
                      SamplingParams(temperature=0, max_tokens=24))[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"
    assert out.finished and out.prompt_token_ids[0] == 1  # <|im_start|>


def test_request_output_fields(engine):
    out = engine.generate("The sky is", GREEDY)[0]
    assert out.prompt == "The sky is" and out.prompt_token_ids == engine.tokenizer.encode("The sky is")
    c = out.outputs[0]
    assert c.index == 0 and len(c.token_ids) == 12 and c.finish_reason == "length"
    assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert c.logprobs is None and out.prompt_logprobs is None


def test_finished_as_in_vllm(engine):
    """vLLM's RequestOutput.finished is an attribute, its CompletionOutput.finished() a method (here it was a
    property: vLLM-style out.outputs[0].finished() raised "'bool' object is not callable")."""
    engine.add_request("fin", "The sky is", SamplingParams(max_tokens=2, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == "fin"]
    assert [(o.finished, o.outputs[0].finished()) for o in outs] == [(False, False), (True, True)]


def test_token_id_prompt_equals_text_prompt(engine):
    ids = engine.tokenizer.encode("Water boils at")
    a = text_of(engine, "Water boils at", GREEDY)
    b = engine.generate(ids, GREEDY)[0]
    assert b.prompt is None and a.token_ids == b.outputs[0].token_ids


def test_prompt_dicts(engine):
    """vLLM's TextPrompt / TokensPrompt dicts, alone or in a list, in generate, stream and embed (a
    ValueError before); a "prompt" beside the ids is echoed back."""
    ids = engine.tokenizer.encode("Water boils at")
    want = text_of(engine, "Water boils at", GREEDY)
    outs = engine.generate([{"prompt_token_ids": ids}, {"prompt": "Water boils at"},
                            {"prompt": "echoed", "prompt_token_ids": ids}], GREEDY)
    assert all(o.outputs[0].token_ids == want.token_ids and o.prompt_token_ids == ids for o in outs)
    assert [o.prompt for o in outs] == [None, "Water boils at", "echoed"]
    assert engine.generate({"prompt_token_ids": ids}, GREEDY)[0].outputs[0].token_ids == want.token_ids
    assert "".join(engine.stream({"prompt_token_ids": ids}, GREEDY)) == want.text
    assert engine.embed({"prompt_token_ids": ids})[0].outputs.embedding == engine.embed(ids)[0].outputs.embedding
    for bad, field in [({}, "prompt"), ({"prompt": "x", "multi_modal_data": {}}, "prompt"),
                       ({"prompt_token_ids": [10**9]}, "prompt_token_ids"),
                       ({"prompt_token_ids": ids, "prompt": 5}, "prompt")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            engine.generate([bad], GREEDY)
    assert not engine.has_unfinished_requests()


def test_batch_equals_alone(engine):
    prompts = ["One, two, three,", "The best way to learn Python is", "def fibonacci(n):", "Roses are red"]
    alone = [text_of(engine, p, GREEDY).token_ids for p in prompts]
    together = engine.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in together] == alone
    assert [o.prompt for o in together] == prompts


def test_params_per_prompt(engine):
    outs = engine.generate(["a", "b"], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=5)])
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 5]
    with pytest.raises(ValueError, match="params"):
        engine.generate(["a", "b"], [SamplingParams()])


def test_params_changed_after_construction(engine):
    """A field set after SamplingParams was built is checked when the request is submitted (max_tokens=0
    gave a token, or an IndexError mid-step, a str logit_bias key TypeError, n=0 hung generate(): no sequence to
    finish; bad_words=None, which construction takes, raised TypeError); and the request keeps its own
    copy, which later changes to the caller's do not reach."""
    for field, value in [("max_tokens", 0), ("logit_bias", {"5": 1.0}), ("n", 0)]:
        p = SamplingParams(temperature=0, max_tokens=2)
        setattr(p, field, value)
        with pytest.raises(ValueError, match=f"^{field}:"):
            engine.generate("hi", p)
        assert not engine.has_unfinished_requests()
    p = SamplingParams(temperature=0, max_tokens=2)
    p.bad_words = None
    engine.add_request("mutated", "hi", p)
    p.max_tokens = 6
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert len(outs[-1].outputs[0].token_ids) == 2


def test_seed_reproducible(engine):
    p = SamplingParams(temperature=1.0, max_tokens=12, seed=1234)
    a = text_of(engine, "My favourite animal is", p)
    b = text_of(engine, "My favourite animal is", p)
    c = text_of(engine, "My favourite animal is", p.clone(seed=99))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_any_int_seed(engine):
    """Negative and huge seeds work, as in vLLM: NumPy gets the seed mod 2**64 (a negative seed
    used to fail inside NumPy after the request was queued, and every later step raised KeyError)."""
    p = SamplingParams(temperature=1.0, max_tokens=6, seed=-2)
    a = text_of(engine, "My favourite animal is", p)
    assert a.token_ids == text_of(engine, "My favourite animal is", p.clone(seed=2**64 - 2)).token_ids
    assert len(text_of(engine, "My favourite animal is", p.clone(seed=2**80)).token_ids) == 6
    assert not engine.has_unfinished_requests()


def test_seed_minus_one_is_no_seed(engine):
    """seed=-1 means no seed, as in vLLM (it was a fixed seed: every such request drew the same tokens)."""
    p = SamplingParams(temperature=1.0, max_tokens=8, seed=-1)
    assert p.seed is None and p.clone().seed is None
    outs = engine.generate(["My favourite animal is"] * 4, p)
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) > 1


def test_failed_add_request_leaves_nothing(engine, monkeypatch):
    """A request that fails while its sequences are built is not left in the scheduler (where the
    next step would find no sequence for it), and a sequence id already in use is refused first."""
    engine.add_request("x#1", "hi", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="^request_id: 'x#1' is already in use"):
        engine.add_request("x", "hi", SamplingParams(n=2, max_tokens=2))
    engine.abort_request("x#1")
    engine.step()
    new_sequence = engine._new_sequence

    def fail_second(group, index, req):
        if index == 1:
            raise ValueError("boom")
        return new_sequence(group, index, req)

    monkeypatch.setattr(engine, "_new_sequence", fail_second)
    with pytest.raises(ValueError, match="boom"):
        engine.add_request("y", "hi", SamplingParams(n=2, max_tokens=2))
    monkeypatch.undo()
    assert not engine.has_unfinished_requests() and not engine.scheduler.requests
    assert engine.generate("hi", SamplingParams(temperature=0, max_tokens=2))[0].outputs[0].finish_reason == "length"


def test_n_samples(engine):
    out = engine.generate("Tell me a colour:", SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    again = engine.generate("Tell me a colour:", SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=1, max_tokens=10, seed=3),
    SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=10, seed=3),
    SamplingParams(temperature=1.0, min_p=1.0, max_tokens=10, seed=3),
], ids=["top_k=1", "top_p~0", "min_p=1"])
def test_truncation_to_one_token_is_greedy(engine, params):
    greedy = text_of(engine, "The capital of Italy is", SamplingParams(temperature=0, max_tokens=10))
    assert text_of(engine, "The capital of Italy is", params).token_ids == greedy.token_ids


def test_top_k_limits_choices(engine):
    """With top_k=2 every sampled token is one of the two most likely (checked with logprobs)."""
    out = text_of(engine, "I like", SamplingParams(temperature=1.5, top_k=2, max_tokens=10, seed=5, logprobs=2))
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp[tok].rank <= 2


def test_penalties_change_repetition(engine):
    def repeats(ids):
        return len(ids) - len(set(ids))

    prompt = "apple apple apple apple apple apple"
    base = text_of(engine, prompt, SamplingParams(temperature=0, max_tokens=12))
    rep = text_of(engine, prompt, SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.8))
    freq = text_of(engine, prompt, SamplingParams(temperature=0, max_tokens=12, frequency_penalty=2.0))
    pres = text_of(engine, prompt, SamplingParams(temperature=0, max_tokens=12, presence_penalty=2.0))
    assert repeats(base.token_ids) > repeats(rep.token_ids)
    assert repeats(base.token_ids) > repeats(freq.token_ids)
    assert pres.token_ids != base.token_ids


def test_max_tokens_and_ignore_eos(engine):
    msgs = [{"role": "user", "content": "Say hi."}]
    short = engine.chat(msgs, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert short.finish_reason == "stop" and short.token_ids[-1] in engine.tokenizer.eos_token_ids
    long = engine.chat(msgs, SamplingParams(temperature=0, max_tokens=len(short.token_ids) + 4,
                                            ignore_eos=True))[0].outputs[0]
    assert long.finish_reason == "length" and len(long.token_ids) == len(short.token_ids) + 4
    assert long.token_ids[: len(short.token_ids)] == short.token_ids


def test_stop_token_ids(engine):
    base = text_of(engine, "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=10))
    stop_id = base.token_ids[3]
    out = text_of(engine, "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_id]))
    first = base.token_ids.index(stop_id)
    assert out.token_ids == base.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    # an id outside the vocabulary could never match (vLLM refuses it too, vllm#54196): was accepted
    with pytest.raises(ValueError, match="^stop_token_ids: token id 49152 is outside the vocabulary"):
        engine.generate("Hi", SamplingParams(max_tokens=2, stop_token_ids=[2, 49152]))
    assert not engine.has_unfinished_requests()


def test_logit_bias(engine):
    """-100 on each greedy token in turn steers the text away from it; an id past the vocabulary
    is a ValueError naming the field, before anything is queued."""
    base = text_of(engine, "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=6))
    banned = SamplingParams(temperature=0, max_tokens=6, logit_bias={t: -100 for t in base.token_ids})
    out = text_of(engine, "Count: 1, 2, 3,", banned)
    assert not set(out.token_ids) & set(base.token_ids)
    forced = text_of(engine, "Count: 1, 2, 3,", SamplingParams(max_tokens=3, seed=5, logit_bias={base.token_ids[2]: 100}))
    assert forced.token_ids == [base.token_ids[2]] * 3
    with pytest.raises(ValueError, match="^logit_bias: token id 49152 is outside the vocabulary"):
        engine.generate("hi", SamplingParams(logit_bias={49152: 1.0}))
    assert not engine.has_unfinished_requests()


def test_allowed_token_ids(engine):
    """Only the listed tokens are sampled, greedy and random; ids past the vocabulary, the
    combination with structured outputs and a list of only stop tokens under min_tokens are
    ValueErrors naming the field."""
    ids = engine.tokenizer.encode(" yes no maybe", add_special_tokens=False)
    for params in (SamplingParams(temperature=0, max_tokens=8, allowed_token_ids=ids, ignore_eos=True),
                   SamplingParams(temperature=1.5, seed=3, n=3, max_tokens=8, allowed_token_ids=ids, ignore_eos=True)):
        for o in engine.generate("The answer is", params)[0].outputs:
            assert len(o.token_ids) == 8 and set(o.token_ids) <= set(ids)
    with pytest.raises(ValueError, match="^allowed_token_ids: token id 49152 is outside"):
        engine.generate("hi", SamplingParams(allowed_token_ids=[1, 49152]))
    with pytest.raises(ValueError, match="^allowed_token_ids: cannot be combined"):
        engine.generate("hi", SamplingParams(allowed_token_ids=ids, structured_outputs={"choice": ["a", "b"]}))
    eos = sorted(engine.tokenizer.eos_token_ids)
    with pytest.raises(ValueError, match="^min_tokens: allowed_token_ids hold only stop tokens"):
        engine.generate("hi", SamplingParams(allowed_token_ids=eos + ids[:1], stop_token_ids=ids[:1], min_tokens=2))
    got = engine.generate("hi", SamplingParams(allowed_token_ids=eos, min_tokens=2, max_tokens=3, ignore_eos=True))
    toks = got[0].outputs[0].token_ids
    assert len(toks) == 3 and set(toks) <= set(eos)   # (ignore_eos: EOS is no stop token)
    assert not engine.has_unfinished_requests()


def test_preserved_token_ids(engine):
    """preserved_token_ids: those special tokens are written into the text although
    skip_special_tokens drops the others (the server keeps tool-call markers so), in the whole
    output and the stream alike."""
    tok = engine.tokenizer
    start, repo = tok.encode("<|im_start|><repo_name>", add_special_tokens=False)  # both dropped by default
    base = SamplingParams(temperature=1.0, seed=0, n=3, max_tokens=8, allowed_token_ids=[start, repo], ignore_eos=True)
    kept = base.clone(preserved_token_ids=[start])
    outs = engine.generate("Hi", kept)[0].outputs
    assert {start, repo} <= {t for o in outs for t in o.token_ids}
    for o, plain in zip(outs, engine.generate("Hi", base)[0].outputs):
        assert o.token_ids == plain.token_ids and plain.text == ""
        assert o.text == "<|im_start|>" * o.token_ids.count(start)
    assert "".join(engine.stream("Hi", kept.clone(n=1))) == outs[0].text
    with pytest.raises(ValueError, match="^preserved_token_ids: "):
        SamplingParams(preserved_token_ids=[-1])
    with pytest.raises(ValueError, match=r"^preserved_token_ids: token id \d+ is outside the vocabulary"):
        engine.generate("Hi", kept.clone(preserved_token_ids=[start, engine.config.vocab_size]))
    assert not engine.has_unfinished_requests()


def test_bad_words(engine):
    """A word of the greedy text, banned: none of its token sequences (as written, after a space)
    appears in the new output; a one-token word is never sampled."""
    from pocketcupy.bad_words import bad_words_token_ids

    prompt, p = "The capital of France is", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    base = text_of(engine, prompt, p)
    word = max(base.text.split(), key=len)
    out = text_of(engine, prompt, p.clone(bad_words=[word, "the"]))
    assert out.token_ids != base.token_ids
    for seq in bad_words_token_ids(engine.tokenizer, [word, "the"]):
        ids = out.token_ids
        assert not any(tuple(ids[i:i + len(seq)]) == seq for i in range(len(ids) - len(seq) + 1)), (seq, out.text)


def test_truncate_prompt_tokens(engine):
    """The prompt's last k tokens, as if they were the prompt; -1 keeps up to the context length."""
    prompt = "Once upon a time, in a land far away, there lived a"
    ids = engine.tokenizer.encode(prompt)
    p = SamplingParams(temperature=0, max_tokens=6, truncate_prompt_tokens=5)
    out = engine.generate(prompt, p)[0]
    alone = engine.generate(ids[-5:], p.clone(truncate_prompt_tokens=None))[0]
    assert out.prompt_token_ids == ids[-5:] and out.prompt == engine.tokenizer.decode(ids[-5:])
    assert out.outputs[0].token_ids == alone.outputs[0].token_ids
    assert engine.generate(ids, p.clone(truncate_prompt_tokens=-1))[0].prompt_token_ids == ids


def test_truncate_prompt_tokens_beyond_the_context(engine):
    """truncate_prompt_tokens over max_model_len is a ValueError naming it, as in vLLM (generation and
    embeddings); it was taken, and a long prompt was then refused naming the prompt."""
    from pocketcupy import PoolingParams

    C = engine.max_model_len
    p = SamplingParams(temperature=0, max_tokens=2, truncate_prompt_tokens=C)
    assert len(engine.generate("Hi", p)[0].outputs[0].token_ids) == 2
    for call in (lambda: engine.generate("Hi", p.clone(truncate_prompt_tokens=C + 1)),
                 lambda: engine.generate([5] * (C + 10), p.clone(truncate_prompt_tokens=C + 1)),
                 lambda: engine.embed(["Hi"], PoolingParams(truncate_prompt_tokens=C + 1))):
        with pytest.raises(ValueError, match="^truncate_prompt_tokens:"):
            call()
    assert not engine.has_unfinished_requests()


def test_stop_strings_never_emitted(engine):
    base = text_of(engine, "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=16))
    stop = base.text[5:8]
    params = SamplingParams(temperature=0, max_tokens=16, stop=[stop, "zzz"])
    out = text_of(engine, "Count: 1, 2, 3,", params)
    assert out.text == base.text[: base.text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    deltas = list(engine.stream("Count: 1, 2, 3,", params))
    assert "".join(deltas) == out.text
    inc = text_of(engine, "Count: 1, 2, 3,", params.clone(include_stop_str_in_output=True))
    assert inc.text == base.text[: base.text.index(stop) + len(stop)]


def test_min_tokens(engine):
    msgs = [{"role": "user", "content": "Say hi."}]
    short = engine.chat(msgs, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    n = len(short.token_ids) + 3
    out = engine.chat(msgs, SamplingParams(temperature=0, max_tokens=n + 20, min_tokens=n))[0].outputs[0]
    assert len(out.token_ids) >= n
    assert not set(out.token_ids[: n]) & set(engine.tokenizer.eos_token_ids)


def test_min_tokens_holds_off_stop_strings(engine):
    """As in vLLM, a stop string ends the output only once it has min_tokens tokens (it used to
    end it at the first comma, 3 tokens in)."""
    base = text_of(engine, "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=16))
    assert base.text.startswith(" 4, 5, 6, 7,")
    out = text_of(engine, "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=16, stop=[","], min_tokens=5))
    assert out.text == " 4, 5" and out.stop_reason == "," and len(out.token_ids) == 6  # " 4, 5,"
    # the 6th token's comma is still within min_tokens 6 (vLLM checks stop strings from token min_tokens + 1 on,
    # where EOS and stop_token_ids can first end the output too): the next comma ends it
    out = text_of(engine, "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=16, stop=[","], min_tokens=6))
    assert out.text == " 4, 5, 6" and out.stop_reason == "," and len(out.token_ids) == 9


def test_logprobs(engine):
    out = text_of(engine, "The cat sat on the", SamplingParams(temperature=0, max_tokens=6, logprobs=3))
    assert len(out.logprobs) == 6
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert tok in lp and lp[tok].rank == 1  # greedy picks the top token
        assert len(lp) == 3
        vals = [v.logprob for v in lp.values()]
        assert vals == sorted(vals, reverse=True) and all(v <= 0 for v in vals)
        assert lp[tok].decoded_token == engine.tokenizer.decode([tok])


def test_logprobs_true_means_one(engine):
    """logprobs=True / prompt_logprobs=True are 1, as in vLLM (a ValueError before)."""
    one = engine.generate("The cat sat on the", SamplingParams(temperature=0, max_tokens=4, logprobs=1,
                                                               prompt_logprobs=1))[0]
    true = engine.generate("The cat sat on the", SamplingParams(temperature=0, max_tokens=4, logprobs=True,
                                                                prompt_logprobs=True))[0]
    assert true.outputs[0].logprobs == one.outputs[0].logprobs and true.prompt_logprobs == one.prompt_logprobs
    assert all(len(lp) == 1 for lp in true.outputs[0].logprobs)   # greedy: the sampled token is the top one


def test_detokenize_false(engine):
    """vLLM's detokenize=False (a TypeError before): the same tokens and logprobs, no text, no decoded_token;
    stop strings need the text."""
    p = SamplingParams(temperature=0, max_tokens=6, logprobs=1, prompt_logprobs=1)
    want = engine.generate("The cat sat on the", p)[0]
    out = engine.generate("The cat sat on the", p.clone(detokenize=False))[0]
    c, w = out.outputs[0], want.outputs[0]
    assert c.token_ids == w.token_ids and w.text and c.text == ""
    assert [{t: lp.logprob for t, lp in pos.items()} for pos in c.logprobs] == \
        [{t: lp.logprob for t, lp in pos.items()} for pos in w.logprobs]
    assert all(lp.decoded_token is None for pos in c.logprobs + out.prompt_logprobs[1:] for lp in pos.values())
    with pytest.raises(ValueError, match="^stop:"):
        SamplingParams(stop=["."], detokenize=False)


def test_cumulative_logprob(engine):
    """vLLM's CompletionOutput.cumulative_logprob: the sum of the sampled tokens' logprobs, None
    unless logprobs are asked for (logprobs=0: the sampled token's alone)."""
    outs = engine.generate("The cat sat on the", SamplingParams(n=2, seed=5, max_tokens=5, logprobs=0))[0].outputs
    for c in outs:
        assert c.cumulative_logprob == pytest.approx(sum(lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)))
        assert c.cumulative_logprob < 0
    assert text_of(engine, "The cat sat on the", GREEDY).cumulative_logprob is None


def test_prompt_logprobs(engine):
    ids = engine.tokenizer.encode("The cat sat on the mat")
    out = engine.generate("The cat sat on the mat", SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    pl = out.prompt_logprobs
    assert len(pl) == len(ids) and pl[0] is None
    for tok, pos in zip(ids[1:], pl[1:]):
        assert tok in pos and pos[tok].rank >= 1
        assert 2 <= len(pos) <= 3
    # the prompt logprob of a token equals its logprob when it was generated after the same text
    gen = text_of(engine, ids, SamplingParams(temperature=0, max_tokens=1, logprobs=1))
    tok = gen.token_ids[0]
    again = engine.generate(ids + [tok], SamplingParams(max_tokens=1, prompt_logprobs=0))[0].prompt_logprobs
    # (a prompt row comes from a matmul over several rows, the generated one from a one-row GEMV:
    # float32 sums in another order)
    assert abs(again[-1][tok].logprob - gen.logprobs[0][tok].logprob) < 1e-3 and again[-1][tok].rank == 1


def test_prompt_logprobs_match_chunked_prefill(smollm2_gguf, engine):
    """Chunked prefill (8 tokens a step) gives the same prompt logprobs and tokens."""
    small = Engine(smollm2_gguf, device="cpu", progress=False, max_num_batched_tokens=8)
    prompt = "In a hole in the ground there lived a hobbit, not a nasty dirty wet hole"
    p = SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=1)
    a, b = engine.generate(prompt, p)[0], small.generate(prompt, p)[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
        assert x.keys() == y.keys()
        assert all(abs(x[k].logprob - y[k].logprob) < 1e-4 for k in x)


def test_preemption_keeps_tokens(smollm2_gguf, engine):
    """A KV pool too small for all requests at once forces preemption; tokens stay the same.
    (12 tokens each: 3 of the pool's 5 blocks a request, 4 preemptions.)"""
    prompts = ["The history of Rome", "Photosynthesis is", "A haiku about snow:", "The GPU is", "Dear diary,"]
    p = SamplingParams(temperature=0, max_tokens=12)
    alone = [text_of(engine, x, p).token_ids for x in prompts]
    tiny = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=6, block_size=8, max_model_len=40)
    outs = tiny.generate(prompts, p)
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert tiny.scheduler.num_preemptions > 0


def test_max_tokens_none_fills_a_kv_pool_smaller_than_the_context(smollm2_gguf):
    """max_tokens=None means up to the context; a num_kv_blocks pool smaller than max_model_len
    (8192 here) caps it at what the pool holds (24 tokens' K/V) instead of refusing every such request."""
    tiny = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=4, block_size=8)  # 24 tokens
    out = tiny.generate("The history of Rome", SamplingParams(temperature=0, max_tokens=None, ignore_eos=True))[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 25   # the last token needs no K/V
    assert out.outputs[0].finish_reason == "length" and tiny.stats()["kv_blocks_used"] == 0


def test_stream_matches_generate(engine):
    msgs = [{"role": "user", "content": "Name three fruits."}]
    p = SamplingParams(temperature=0, max_tokens=20)
    deltas = list(engine.stream(msgs, p))
    assert len(deltas) > 3
    assert "".join(deltas) == engine.chat(msgs, p)[0].outputs[0].text


def test_stream_interleaved_with_generate(engine):
    """A generate() run while a stream is open steps the stream's request too; its deltas still
    reach the stream (they went to generate(), which dropped them)."""
    p = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = text_of(engine, "Once upon a time", p).text
    it = engine.stream("Once upon a time", p)
    first = next(it)
    other = engine.generate("The sky is", GREEDY)[0].outputs[0]
    assert first + "".join(it) == full
    assert other.token_ids == text_of(engine, "The sky is", GREEDY).token_ids


def test_generate_from_two_threads(engine):
    """Concurrent generate() calls each get their own outputs (each used to drop the other's final
    output and both hung)."""
    import threading

    prompts = ["The sky is", "Roses are red", "def fibonacci(n):"]
    alone = {x: text_of(engine, x, GREEDY).token_ids for x in prompts}
    got = {}
    threads = [threading.Thread(target=lambda x=x: got.update({x: text_of(engine, x, GREEDY).token_ids}),
                                daemon=True) for x in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "generate() hung"
    assert got == alone
    assert not engine.has_unfinished_requests() and engine.scheduler.num_blocks_used == 0


def test_stream_closed_early_frees_blocks(engine):
    it = engine.stream("Once upon a time", SamplingParams(max_tokens=50, ignore_eos=True))
    next(it)
    assert engine.scheduler.num_blocks_used > 0
    it.close()
    assert not engine.has_unfinished_requests() and engine.scheduler.num_blocks_used == 0


def test_bad_prompt_token_ids_refused(engine):
    """add_request's prompt_token_ids must be token ids: a string was tokenized as text and the
    request ran on it; errors name prompt_token_ids, not prompt."""
    for bad, msg in (("abc", "must be a list of token ids"), ([], "must not be empty"),
                     ([1, 10**9], "token id 1000000000 is outside the vocabulary"), ([1.5], "must be a list")):
        with pytest.raises(ValueError, match=f"^prompt_token_ids: {msg}"):
            engine.add_request("ptids", "hi", SamplingParams(max_tokens=2), prompt_token_ids=bad)
    assert not engine.has_unfinished_requests()
    engine.add_request("ptids", "hi", SamplingParams(max_tokens=2), prompt_token_ids=[1, 2])
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert outs[0].prompt == "hi" and outs[0].prompt_token_ids == [1, 2]


def test_abort(engine):
    engine.add_request("abort-me", "Once upon a time", SamplingParams(max_tokens=50))
    engine.step()
    engine.abort_request("abort-me")
    outs = {o.request_id: o for o in engine.step()}
    assert outs["abort-me"].finished and outs["abort-me"].outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.num_blocks_used == 0


def test_abort_many(engine):
    """abort_request takes an iterable of ids too (vLLM's signature; a tuple was looked up as one
    id and nothing was aborted, a list raised TypeError); unknown ids are ignored."""
    for rid in ("a1", "a2", "a3"):
        engine.add_request(rid, "Once upon a time", SamplingParams(max_tokens=50))
    engine.step()
    engine.abort_request(("a1", "a2", "unknown"))
    engine.abort_request(x for x in ["a3"])
    outs = {o.request_id: o.outputs[0].finish_reason for o in engine.step()}
    assert outs == {"a1": "abort", "a2": "abort", "a3": "abort"}
    assert not engine.has_unfinished_requests() and engine.scheduler.num_blocks_used == 0


def test_abort_bad_id_refused(engine):
    """abort_request with an id that is neither a string nor an iterable of strings raised
    TypeError ('int' object is not iterable) or, for [5], silently ignored it."""
    for bad in (5, None, [5], ["ok", None]):
        with pytest.raises(ValueError, match="^request_id: "):
            engine.abort_request(bad)


def test_many_chats(engine):
    convs = [[{"role": "user", "content": q}] for q in ("Hi!", "What is 2+2?")]
    outs = engine.chat(convs, SamplingParams(temperature=0, max_tokens=8))
    assert len(outs) == 2 and all(o.outputs[0].text for o in outs)


def test_chat_template_argument(engine):
    """vLLM's LLM.chat(chat_template=...): the template's text, used instead of the model's, tools or not
    (a TypeError before); a bad one is a ValueError naming chat_template, and chat_template_kwargs cannot set it."""
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    convs = [[{"role": "user", "content": "Name a fruit."}], [{"role": "user", "content": "Name a colour."}]]
    p = SamplingParams(temperature=0, max_tokens=6)
    outs = engine.chat(convs, p, chat_template=template)
    for conv, out in zip(convs, outs):
        text = f"user: {conv[0]['content']}\nassistant:"
        assert out.prompt_token_ids == engine.tokenizer.encode(text, add_special_tokens=False)
        assert out.outputs[0].token_ids == engine.generate(out.prompt_token_ids, p)[0].outputs[0].token_ids
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert engine.chat(convs[0], p, tools=tools, chat_template=template)[0].prompt_token_ids == outs[0].prompt_token_ids
    for bad in (5, "", "{% for m in messages %}", "templates/chat.jinja"):
        with pytest.raises(ValueError, match="^chat_template:"):
            engine.chat(convs[0], p, chat_template=bad)
    with pytest.raises(ValueError, match="^chat_template_kwargs:"):
        engine.chat(convs[0], p, chat_template_kwargs={"chat_template": template})
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("call, field", [
    (lambda e: e.generate("", SamplingParams()), "prompt"),
    (lambda e: e.generate([10**6], SamplingParams()), "prompt"),
    (lambda e: e.generate([], SamplingParams()), "prompts"),
    (lambda e: e.generate(3.5, SamplingParams()), "prompts"),
    (lambda e: e.generate("hi", SamplingParams(max_tokens=10**6)), "max_tokens"),
    (lambda e: e.generate([1] * 9000, SamplingParams()), "prompt"),
    (lambda e: e.generate("hi", {"max_tokens": 3}), "params"),
    (lambda e: e.add_request("", "hi"), "request_id"),
    (lambda e: e.add_request("x", "hi", priority="high"), "priority"),
    (lambda e: e.stream("hi", SamplingParams(n=2)).__next__(), "n"),
    (lambda e: e.chat([{"role": 3, "content": "x"}]), "role"),
    (lambda e: e.chat([]), "^messages"),
    (lambda e: e.chat(None), "^messages"),
    (lambda e: e.chat("hi"), "^messages"),
    # a truthy non-bool was taken as true: "false" added the generation prompt
    (lambda e: e.chat([{"role": "user", "content": "x"}], add_generation_prompt="false"), "^add_generation_prompt:"),
    (lambda e: e.chat([{"role": "user", "content": "x"}], add_generation_prompt=False, continue_final_message=1),
     "^continue_final_message:"),
])
def test_bad_requests(engine, call, field):
    with pytest.raises(ValueError, match=field):
        call(engine)
    assert not engine.has_unfinished_requests()


def test_priority_needs_the_priority_policy(engine):
    """Under fcfs a nonzero priority is refused (as vLLM's ValueError), not silently ignored; 0 is the default."""
    for priority in (1, -1, np.int64(3)):
        with pytest.raises(ValueError, match="^priority: got .* scheduling_policy='priority'"):
            engine.add_request("prio", "hi", SamplingParams(max_tokens=1), priority=priority)
    assert not engine.has_unfinished_requests()
    engine.add_request("prio", "hi", SamplingParams(max_tokens=1), priority=0)
    while engine.has_unfinished_requests():
        engine.step()


def test_duplicate_request_id(engine):
    engine.add_request("dup", "hello", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("dup", "hello", SamplingParams(max_tokens=2))
    engine.abort_request("dup")
    engine.step()


def test_engine_named_requests_pass_over_add_request_ids(engine):
    """generate() names its requests gen-N (stream() stream-N, a step loop req-N): an add_request id of
    that form, the next one, made generate() fail with "request_id: 'gen-N' is already in use", an id
    its caller never gave. The engine takes the next free name instead (of the request and its samples)."""
    from pocketcupy.engine_loop import EngineLoop

    def take_next(prefix, suffix=""):
        rid = f"{prefix}-{next(copy.copy(engine._ids))}{suffix}"
        engine.add_request(rid, "hi", SamplingParams(max_tokens=1))
        return rid
    p = SamplingParams(temperature=0, max_tokens=1)
    taken = [take_next("gen"), take_next("gen", "#0")]   # gen-N, then gen-N#0 (N's next try, for n=2)
    outs = engine.generate(["The sky is", "Roses are"], [p.clone(n=2), p])
    assert [o.finished for o in outs] == [True, True] and not {o.request_id for o in outs} & set(taken)
    taken.append(take_next("stream"))
    assert len("".join(engine.stream("hi", p))) > 0
    finals = {}
    while engine.has_unfinished_requests():
        finals.update((o.request_id, o.outputs[0].finish_reason) for o in engine.step() if o.finished)
    assert finals == dict.fromkeys(taken, "length")
    loop = EngineLoop(engine)   # (its steps are step()'s: they take add_request's outputs)
    with engine._lock:
        taken = take_next("req")
        stream = loop.submit("hi", p)
    assert stream.result().finished and stream.request_id != taken
    loop.shutdown(10)
    assert not engine.has_unfinished_requests() and engine.scheduler.num_blocks_used == 0


def test_request_id_reusable_at_once_after_abort(engine):
    """An aborted request's id is free at once, as in vLLM (it was refused until the step that emitted
    the abort's output); that output still comes, apart from the new request's. A live id is refused."""
    alone = text_of(engine, "The capital of France is", GREEDY)
    engine.add_request("again", "Once upon a time", SamplingParams(max_tokens=50))
    engine.add_request("pair", "Once upon a time", SamplingParams(max_tokens=50, n=2))
    engine.step()
    with pytest.raises(ValueError, match="^request_id: 'again' is already in use"):
        engine.add_request("again", "hi", GREEDY)
    engine.abort_request(["again", "pair"])
    engine.add_request("again", "The capital of France is", GREEDY)
    engine.add_request("pair", "hi", SamplingParams(max_tokens=2, n=2))
    outs = {"again": [], "pair": []}
    while engine.has_unfinished_requests() or engine.has_pending_outputs():
        for o in engine.step():
            outs[o.request_id].append(o)
    old, *new = outs["again"]
    assert old.finished and old.outputs[0].finish_reason == "abort" and len(old.outputs[0].token_ids) == 1
    assert [o.finished for o in new] == [False] * (len(new) - 1) + [True]
    assert new[-1].outputs[0].token_ids == alone.token_ids
    assert [t for o in new for t in o.outputs[0].delta_token_ids] == alone.token_ids
    assert [o.outputs[0].finish_reason for o in outs["pair"] if o.finished] == ["abort", "length"]
    assert engine.scheduler.num_blocks_used == 0


def test_add_request_outputs_kept_across_generate(engine):
    """generate() steps the shared engine: its steps' outputs of add_request's requests (one that finishes
    meanwhile, one that goes on, one aborted) wait for the caller's next step(), their deltas added up.
    They were dropped: a step() loop missed tokens, and never saw the first one finish."""
    short, long = SamplingParams(temperature=0, max_tokens=3), SamplingParams(temperature=0, max_tokens=30)
    want = {"short": text_of(engine, "The sky is", short), "long": text_of(engine, "Once upon a time", long)}
    engine.add_request("short", "The sky is", short)
    engine.add_request("long", "Once upon a time", long)
    engine.add_request("gone", "hi", SamplingParams(max_tokens=50))
    outs = {"short": [], "long": [], "gone": []}
    for o in engine.step():
        outs[o.request_id].append(o)
    engine.abort_request("gone")
    engine.generate("Water boils at", SamplingParams(temperature=0, max_tokens=8))
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id].append(o)
    for rid in ("short", "long"):
        assert [o.finished for o in outs[rid]] == [False] * (len(outs[rid]) - 1) + [True]
        assert outs[rid][-1].outputs[0].token_ids == want[rid].token_ids
        assert [t for o in outs[rid] for t in o.outputs[0].delta_token_ids] == want[rid].token_ids
        assert "".join(o.outputs[0].delta_text for o in outs[rid]) == want[rid].text
    assert len(outs["short"]) == 2   # its first token, then the rest and its finish after generate()
    assert [o.outputs[0].finish_reason for o in outs["gone"]] == [None, "abort"]
    # a request that generate() saw to its end still counts as unfinished until step() returned its output
    engine.add_request("solo", "hi", SamplingParams(max_tokens=2))
    engine.generate("Water boils at", SamplingParams(temperature=0, max_tokens=8))
    assert engine.has_unfinished_requests()
    (out,) = engine.step()
    assert out.request_id == "solo" and out.finished and len(out.outputs[0].delta_token_ids) == 2
    assert not engine.has_unfinished_requests() and not engine.has_pending_outputs()


def _step_all(engine, request_id, prompt, params) -> list:
    engine.add_request(request_id, prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs


def test_output_kind(engine):
    """vLLM's output_kind (a TypeError before): step() gives a DELTA request only what each step added (its
    prompt logprobs in the first output), a FINAL_ONLY request one output once it finished; generate()
    returns whole outputs whatever the kind."""
    p = SamplingParams(temperature=0, max_tokens=8, logprobs=1, prompt_logprobs=1)
    want = engine.generate("Once upon a time", p)[0]
    w = want.outputs[0]
    delta = _step_all(engine, "delta", "Once upon a time", p.clone(output_kind=RequestOutputKind.DELTA))
    assert len(delta) > 1 and [o.finished for o in delta] == [False] * (len(delta) - 1) + [True]
    assert sum((o.outputs[0].token_ids for o in delta), []) == w.token_ids
    assert "".join(o.outputs[0].text for o in delta) == w.text
    assert sum((o.outputs[0].logprobs for o in delta), []) == w.logprobs
    assert delta[0].prompt_logprobs == want.prompt_logprobs and all(o.prompt_logprobs is None for o in delta[1:])
    assert delta[-1].outputs[0].cumulative_logprob == w.cumulative_logprob
    (final,) = _step_all(engine, "final", "Once upon a time", p.clone(output_kind=RequestOutputKind.FINAL_ONLY))
    assert final.finished and final.outputs[0].text == w.text and final.outputs[0].logprobs == w.logprobs
    for kind in RequestOutputKind:
        out = engine.generate("Once upon a time", p.clone(output_kind=kind))[0]
        assert out.outputs[0].token_ids == w.token_ids and out.outputs[0].text == w.text
    with pytest.raises(ValueError, match="^output_kind:"):
        SamplingParams(output_kind=1)


def test_request_id_reusable_after_it_finished(engine):
    engine.add_request("done", "hi", SamplingParams(max_tokens=1))
    assert engine.step()[0].finished
    engine.add_request("done", "hi", SamplingParams(max_tokens=1))
    assert engine.step()[0].finished and not engine.has_unfinished_requests()


@pytest.mark.parametrize("kwargs, field", [
    (dict(device="tpu"), "device"),
    (dict(model="/nonexistent/model.gguf"), "model"),
    (dict(block_size=0), "block_size"),
    (dict(max_num_seqs=-1), "max_num_seqs"),
    (dict(max_model_len=10**6), "max_model_len"),
    (dict(kv_cache_memory=1000), "kv_cache_memory"),
    (dict(kv_cache_dtype="fp16"), "kv_cache_dtype"),
    (dict(max_num_seq=8), "^max_num_seq: not an engine argument"),  # a misspelt name: was a TypeError
])
def test_bad_engine_args(smollm2_gguf, kwargs, field):
    kwargs.setdefault("model", smollm2_gguf)
    with pytest.raises(ValueError, match=field):
        Engine(device=kwargs.pop("device", "cpu"), progress=False, **kwargs)


def test_corrupt_model_file(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 40)
    with pytest.raises(ValueError, match="model"):
        Engine(str(p), device="cpu", progress=False)


def test_engine_args_bridges(smollm2_gguf):
    args = EngineArgs.from_env({"POCKETCUPY_MAX_NUM_SEQS": "7", "POCKETCUPY_DEVICE": "cpu"})
    assert args.max_num_seqs == 7 and args.device == "cpu"
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineArgs.from_env({"POCKETCUPY_MAX_NUM_SEQS": "many"})
    e = Engine.from_args(EngineArgs(model=pathlib.Path(smollm2_gguf), device="cpu", progress=False,
                                    max_model_len=256, scheduling_policy="priority"))   # a path object too
    assert e.max_model_len == 256 and e.args.model == smollm2_gguf
    assert EngineArgs(cache_dir=pathlib.Path("/tmp/models")).cache_dir == "/tmp/models"
    e.add_request("np-priority", "hi", SamplingParams(max_tokens=1), priority=np.int64(2))   # a NumPy integer
    assert e.scheduler.requests["np-priority"].priority == 2
    with pytest.raises(ValueError, match="args"):
        Engine.from_args({"model": smollm2_gguf})


@pytest.mark.parametrize("kwargs, field", [
    (dict(cuda_graphs="no"), "cuda_graphs"),
    (dict(progress="false"), "progress"),
    (dict(enable_prefix_caching=1), "enable_prefix_caching"),
    (dict(gpu_memory_utilization=True), "gpu_memory_utilization"),
    (dict(model=b"model.gguf"), "model"),
    (dict(cache_dir=5), "cache_dir"),   # was a TypeError from os.path.join at load
])
def test_engine_args_types(kwargs, field):
    """Every bool setting must be a bool ("no" was taken as true); environment booleans must be a
    known word ("maybe" was taken as false)."""
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        EngineArgs(**kwargs)


def test_engine_args_env_bools():
    env = {"POCKETCUPY_PROGRESS": "Off", "POCKETCUPY_CUDA_GRAPHS": " yes "}
    assert (EngineArgs.from_env(env).progress, EngineArgs.from_env(env).cuda_graphs) == (False, True)
    with pytest.raises(ValueError, match="^enable_prefix_caching: POCKETCUPY_ENABLE_PREFIX_CACHING='maybe'"):
        EngineArgs.from_env({"POCKETCUPY_ENABLE_PREFIX_CACHING": "maybe"})


@pytest.mark.parametrize("text, size", [("1073741824", 1 << 30), ("512MiB", 512 << 20), ("1.5GiB", 3 << 29),
                                         ("4g", 4 << 30), ("2GB", 2 * 10**9), ("100 KB", 10**5), ("64B", 64)])
def test_engine_args_sizes(text, size):
    """kv_cache_memory in the environment and on the command line takes a unit, as vLLM's and
    llama.cpp's users write sizes, and so does EngineArgs; a bad one is an error naming the setting."""
    assert EngineArgs.from_env({"POCKETCUPY_KV_CACHE_MEMORY": text}).kv_cache_memory == size
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    assert EngineArgs.from_cli(parser.parse_args(["--kv-cache-memory", text])).kv_cache_memory == size
    assert EngineArgs(kv_cache_memory=text).kv_cache_memory == size   # (the library takes the text too)


def test_engine_args_bad_sizes(capsys):
    with pytest.raises(ValueError, match="^kv_cache_memory: POCKETCUPY_KV_CACHE_MEMORY='4GX' is not a size in bytes"):
        EngineArgs.from_env({"POCKETCUPY_KV_CACHE_MEMORY": "4GX"})
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        EngineArgs.from_env({"POCKETCUPY_KV_CACHE_MEMORY": "1.3B"})
    with pytest.raises(ValueError, match="^kv_cache_memory: '4GX' is not a size in bytes"):
        EngineArgs(kv_cache_memory="4GX")
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-memory", "lots"])
    assert "--kv-cache-memory: 'lots' is not a size in bytes" in capsys.readouterr().err


def test_cli_help_documents_every_engine_flag():
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    helps = {a.dest: a.help for a in parser._actions if a.dest != "help"}
    for f in dataclasses.fields(EngineArgs):
        assert f.metadata["help"] in helps[f.name] and f"POCKETCUPY_{f.name.upper()}" in helps[f.name]
        assert "(default" in helps[f.name], helps[f.name]  # generation_config's "sampling defaults" hid its own
    assert "(default 16; env POCKETCUPY_BLOCK_SIZE)" in helps["block_size"]
    assert "(default 'auto'; env POCKETCUPY_GENERATION_CONFIG)" in helps["generation_config"]


def test_tokenizer_via_engine(engine):
    ids = engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert engine.tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>"
    assert np.all(np.asarray(ids) < engine.config.vocab_size)


def test_use_tqdm(engine, capsys):
    """vLLM's use_tqdm keyword (a TypeError before): False draws nothing, True a bar of the finished
    prompts on stderr; the outputs are the same."""
    p = SamplingParams(temperature=0, max_tokens=4)
    want = [o.outputs[0].token_ids for o in engine.generate(["Hi", "The sky"], p)]
    capsys.readouterr()
    assert [o.outputs[0].token_ids for o in engine.generate(["Hi", "The sky"], p, use_tqdm=False)] == want
    engine.chat([{"role": "user", "content": "Hi"}], p, use_tqdm=False)
    engine.embed(["Hi"], use_tqdm=False)
    engine.score("Hi", ["Hello"], use_tqdm=False)
    assert capsys.readouterr().err == ""
    assert [o.outputs[0].token_ids for o in engine.generate(["Hi", "The sky"], p, use_tqdm=True)] == want
    assert "2/2" in capsys.readouterr().err
    engine.score("Hi", ["Hello", "Bye"], use_tqdm=True)
    assert "3/3" in capsys.readouterr().err   # (the three texts' embeddings)


def test_reset_prefix_cache(engine):
    """vLLM's LLM.reset_prefix_cache() (an AttributeError before): a repeated prompt hits the cache until it
    is reset; refused (False) while a request holds blocks."""
    prompt = "The history of the Roman Empire spans many centuries, from its founding to its fall, " * 3
    p = SamplingParams(temperature=0, max_tokens=2)
    first = engine.generate(prompt, p)[0]
    assert engine.generate(prompt, p)[0].num_cached_tokens > 0
    assert engine.reset_prefix_cache()
    again = engine.generate(prompt, p)[0]
    assert again.num_cached_tokens == 0 and again.outputs[0].token_ids == first.outputs[0].token_ids
    engine.add_request("holding", prompt, p)
    engine.step()
    assert not engine.reset_prefix_cache()
    engine.abort_request("holding")
    engine.step()
    assert engine.reset_prefix_cache() and not engine.has_unfinished_requests()


def test_get_tokenizer(engine):
    """vLLM's LLM.get_tokenizer() (an AttributeError before)."""
    tok = engine.get_tokenizer()
    assert tok is engine.tokenizer and tok.decode(tok.encode("The sky is blue.")) == "The sky is blue."


def test_vllm_argument_names(engine):
    """vLLM's LLM names the params sampling_params (generate, chat) and pooling_params (embed, score):
    by either name the same outputs; both at once is a ValueError naming vLLM's."""
    from pocketcupy import PoolingParams

    p = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ids = lambda outs: [o.outputs[0].token_ids for o in outs]   # noqa: E731
    assert ids(engine.generate(["Hi", "The sky"], sampling_params=p)) == ids(engine.generate(["Hi", "The sky"], p))
    msgs = [{"role": "user", "content": "Name a fruit."}]
    assert ids(engine.chat(msgs, sampling_params=p)) == ids(engine.chat(msgs, p))
    assert "".join(engine.stream("Hi", sampling_params=p)) == engine.generate("Hi", p)[0].outputs[0].text
    mean = PoolingParams("mean", normalize=False)
    assert engine.embed(["Hi"], pooling_params=mean)[0].outputs.embedding == \
        engine.embed(["Hi"], mean)[0].outputs.embedding
    assert engine.score("Hi", ["Hello"], pooling_params=mean)[0].outputs.score == \
        engine.score("Hi", ["Hello"], mean)[0].outputs.score
    with pytest.raises(ValueError, match="^sampling_params: given together with params"):
        engine.generate("Hi", p, sampling_params=p)
    with pytest.raises(ValueError, match="^pooling_params: given together with pooling"):
        engine.embed(["Hi"], mean, pooling_params=mean)
    assert not engine.has_unfinished_requests()

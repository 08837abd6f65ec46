"""The OpenAI-compatible server through the official `openai` client and raw HTTP: chat and
completions, streaming and not, n, logprobs, stop, seeds, usage, concurrency, disconnects, metrics."""
import http.client
import json
import threading
import time

import openai
import pytest

import pocketcupy

from tests.test_server_harness import (MODEL, client, metric, metrics, openai_client, request, server,  # noqa: F401
                                       serving, sse_events)
from tests.test_server_tools import prompt_sizes

Q = [{"role": "user", "content": "What is the capital of France?"}]


def chat(client, **kw):
    return client.chat.completions.create(model=MODEL, **{"messages": Q, "max_tokens": 8, "temperature": 0, **kw})


def counts(usage) -> tuple:
    """A usage's token counts (its cached tokens depend on what ran before)."""
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


def test_models_and_probes(client, server, smollm2_gguf):
    assert [m.id for m in client.models.list().data] == [MODEL]
    for path in ("/health", "/alive", "/ready"):
        assert request(server, "GET", path)[0] == 200
    status, body, _ = request(server, "GET", f"/v1/models/{MODEL}")
    assert status == 200 and body["max_model_len"] > 0
    # vLLM's ModelCard: its fields, a base model's parent null, one model_permission
    assert set(body) == {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
    assert body["parent"] is None and body["root"] == smollm2_gguf
    [perm] = body["permission"]
    assert perm["object"] == "model_permission" and perm["id"].startswith("modelperm-")
    assert perm["allow_sampling"] and perm["allow_logprobs"] and perm["organization"] == "*" and perm["group"] is None
    assert request(server, "GET", "/v1/models")[1]["data"][0]["permission"][0]["object"] == "model_permission"
    assert request(server, "GET", "/version")[:2] == (200, {"version": pocketcupy.__version__})


@pytest.fixture(scope="module")
def path_named(smollm2_gguf):
    """A server whose second served name is the model's absolute path (the default name without
    --served-model-name), and which leaves tools out of the prompt under tool_choice "none" (vLLM's flag)."""
    yield from serving(smollm2_gguf, "--served-model-name", MODEL, smollm2_gguf,
                       "--exclude-tools-when-tool-choice-none")


def test_exclude_tools_when_tool_choice_none(path_named):
    """With vLLM's --exclude-tools-when-tool-choice-none a tool_choice "none" request's prompt is the one without
    tools, on the chat, Responses and Anthropic routes ("auto" keeps them)."""
    bare, auto, none = (prompt_sizes(path_named, c) for c in (None, "auto", "none"))
    assert none == bare and all(a > b + 50 for a, b in zip(auto, bare)), (bare, auto, none)


def test_models_retrieve_by_a_path_name(path_named, smollm2_gguf):
    """The openai client asks for /v1/models/%2Fabs%2Fpath.gguf: the id, leading slash and all, is
    found (it was a 404: werkzeug's path converter refused the leading slash)."""
    c = openai_client(path_named)
    assert [m.id for m in c.models.list().data] == [MODEL, smollm2_gguf]
    assert c.models.retrieve(smollm2_gguf).id == smollm2_gguf and c.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("/" + MODEL)
    assert e.value.code == "model_not_found"
    assert request(path_named, "GET", "/v1/models/org/name")[1]["error"]["code"] == "model_not_found"


def test_openai_hint_fields_accepted(client):
    """Fields of OpenAI's chat API that change no output here (cache key, safety id, verbosity, text
    modality, a predicted output, reasoning_effort for a template that does not read it) are
    accepted, as vLLM accepts them, instead of a 400 'Unrecognized request argument'."""
    hints = {"prompt_cache_key": "session-1", "safety_identifier": "user-42", "verbosity": "low",
             "modalities": ["text"], "prediction": {"type": "content", "content": "Paris"},
             "reasoning_effort": "low", "audio": None}
    assert chat(client, **hints).choices[0].message.content == chat(client).choices[0].message.content


def test_chat_stream_equals_non_stream(client):
    whole = chat(client, max_tokens=12)
    c = whole.choices[0]
    assert whole.object == "chat.completion" and c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert 0 < whole.usage.completion_tokens <= 12
    chunks = list(chat(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [c.finish_reason]
    assert chunks[-1].choices == [] and counts(chunks[-1].usage) == counts(whole.usage)
    assert all(ch.usage is None for ch in chunks[:-1])


def test_continuous_usage_stats(client):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far (counts
    never falling), the last one the request's usage; both endpoints."""
    opts = {"include_usage": True, "continuous_usage_stats": True}
    whole = chat(client, max_tokens=12)
    chunks = list(chat(client, max_tokens=12, stream=True, stream_options=opts))
    comp = [ch.usage.completion_tokens for ch in chunks]
    assert all(ch.usage.prompt_tokens == whole.usage.prompt_tokens for ch in chunks)
    assert comp == sorted(comp) and comp[0] == 0 and counts(chunks[-1].usage) == counts(whole.usage)
    kw = dict(model=MODEL, prompt="The three primary colors are", max_tokens=10, temperature=0)
    c = list(client.completions.create(**kw, stream=True, stream_options=opts))
    made = [ch.usage.completion_tokens for ch in c]
    assert made == sorted(made) and made[-1] == client.completions.create(**kw).usage.completion_tokens


def test_stream_options_include_obfuscation_accepted(client, server):
    """OpenAI's stream_options.include_obfuscation (random padding of chunks, which this server does not
    add) is accepted on both routes, as on the Responses API, and changes nothing; it was a 400."""
    opts = {"include_usage": True, "include_obfuscation": False}
    whole = chat(client, max_tokens=6)
    chunks = list(chat(client, max_tokens=6, stream=True, stream_options=opts))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole.choices[0].message.content
    assert counts(chunks[-1].usage) == counts(whole.usage)
    kw = dict(model=MODEL, prompt="The three primary colors are", max_tokens=6, temperature=0)
    text = "".join(ch.choices[0].text for ch in client.completions.create(**kw, stream=True, stream_options=opts)
                   if ch.choices)
    assert text == client.completions.create(**kw).choices[0].text
    status, resp, _ = request(server, "POST", "/v1/completions",
                              dict(kw, stream=True, stream_options={"include_obfuscation": "no"}))
    assert status == 400 and resp["error"]["param"] == "stream_options.include_obfuscation"


def test_completions_stream_equals_non_stream(client):
    kw = dict(model=MODEL, prompt="The three primary colors are", max_tokens=10, temperature=0)
    whole = client.completions.create(**kw)
    assert whole.object == "text_completion" and whole.choices[0].text
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert counts(chunks[-1].usage) == counts(whole.usage)
    echo = client.completions.create(**kw, echo=True, logprobs=2)
    ch = echo.choices[0]
    assert ch.text == kw["prompt"] + whole.choices[0].text
    n_prompt, n_gen = echo.usage.prompt_tokens, echo.usage.completion_tokens
    lp = ch.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == n_prompt + n_gen
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) >= 2 for t in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)


def test_completions_text_offset_past_split_characters(client):
    """text_offset is where each token's text starts in the choice's text, also after tokens that hold
    part of a character (日 and 国 are split over three tokens here, each shown as U+FFFD): the offsets
    were counted by those strings' lengths and ran past the text; echoed and generated, streamed too."""
    kw = dict(model=MODEL, prompt="Japan in Japanese is 日本. China in Japanese is", max_tokens=10, temperature=0,
              logprobs=0)

    def check(text, tokens, offsets):
        assert offsets == sorted(offsets) and offsets[-1] < len(text)
        whole = [(t, o) for t, o in zip(tokens, offsets) if "\ufffd" not in t]
        assert [text[o:o + len(t)] for t, o in whole] == [t for t, _ in whole]
        return len(whole) < len(tokens)    # some token held part of a character

    echo = client.completions.create(**kw, echo=True).choices[0]
    assert check(echo.text, echo.logprobs.tokens, echo.logprobs.text_offset)
    generated = echo.text[len(kw["prompt"]):]
    chunks = [ch.choices[0] for ch in client.completions.create(**kw, stream=True)]
    assert "".join(c.text for c in chunks) == generated and "中" in generated
    assert check(generated, [t for c in chunks for t in c.logprobs.tokens],
                 [o for c in chunks for o in c.logprobs.text_offset])


def test_echo_with_max_tokens_0_scores_the_prompt(client, server):
    """echo with max_tokens 0 (lm-eval's loglikelihood requests): each prompt and its logprobs come
    back, nothing generated (nor counted in the metrics); the logprobs are those of the same prompt
    echoed with a token after it; streamed alike. Without echo, max_tokens 0 stays a 400."""
    prompts = ["The capital of France is Paris", "Hello there"]
    m0 = metrics(server)
    r = client.completions.create(model=MODEL, prompt=prompts, echo=True, max_tokens=0, logprobs=2)
    m1 = metrics(server)
    assert [c.text for c in r.choices] == prompts and {c.finish_reason for c in r.choices} == {"length"}
    assert r.usage.completion_tokens == 0
    for name, delta in [("prompt_tokens_total", r.usage.prompt_tokens), ("generation_tokens_total", 0),
                        ("time_to_first_token_seconds_count", 0), ("e2e_request_latency_seconds_count", 2)]:
        assert metric(m1, "pocketcupy_" + name) - metric(m0, "pocketcupy_" + name) == delta, name
    one = client.completions.create(model=MODEL, prompt=prompts[0], echo=True, max_tokens=1, logprobs=2, temperature=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == one.usage.prompt_tokens and lp.tokens == one.choices[0].logprobs.tokens[:-1]
    assert lp.token_logprobs == one.choices[0].logprobs.token_logprobs[:-1]
    chunks = list(client.completions.create(model=MODEL, prompt=prompts[1], echo=True, max_tokens=0, logprobs=1,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == prompts[1]
    assert chunks[-1].usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=prompts[1], max_tokens=0)


def test_prompt_logprobs(client, server):
    """vLLM's prompt_logprobs on /v1/completions: per prompt token null (the first) or the k most
    likely tokens and the prompt's own, with ranks, the same values the echoed logprobs carry; with
    a larger echo k the entries still stop at k; not with stream."""
    text = "The capital of France is"
    body = {"model": MODEL, "prompt": text, "max_tokens": 1, "prompt_logprobs": 1}
    status, resp, _ = request(server, "POST", "/v1/completions", body)
    assert status == 200
    pl = resp["choices"][0]["prompt_logprobs"]
    ids = request(server, "POST", "/tokenize", {"prompt": text})[1]["tokens"]
    assert len(pl) == len(ids) and pl[0] is None
    echo = client.completions.create(model=MODEL, prompt=text, max_tokens=1, echo=True, logprobs=3).choices[0].logprobs
    for i, (tid, pos) in enumerate(zip(ids[1:], pl[1:]), 1):
        assert str(tid) in pos and pos[str(tid)]["logprob"] == echo.token_logprobs[i]
        assert [e["rank"] for t, e in pos.items() if t != str(tid)] in ([], [1]) and len(pos) <= 2
    status, resp, _ = request(server, "POST", "/v1/completions", dict(body, echo=True, logprobs=3))
    assert resp["choices"][0]["prompt_logprobs"] == pl
    status, resp, _ = request(server, "POST", "/v1/completions", dict(body, stream=True))
    assert status == 400 and resp["error"]["param"] == "prompt_logprobs"


def test_chat_prompt_logprobs(server):
    """vLLM's prompt_logprobs on chat (a 400 'Unrecognized request argument' before): the response's
    prompt_logprobs are those completions give the rendered prompt's token ids; not with stream."""
    body = {"model": MODEL, "messages": Q, "max_tokens": 1, "prompt_logprobs": 2, "return_token_ids": True}
    status, resp, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200, resp
    ids = resp["prompt_token_ids"]
    comp = {"model": MODEL, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 2}
    expected = request(server, "POST", "/v1/completions", comp)[1]["choices"][0]["prompt_logprobs"]
    assert resp["prompt_logprobs"] == expected and expected[0] is None and len(expected) == len(ids)
    status, resp, _ = request(server, "POST", "/v1/chat/completions", dict(body, stream=True))
    assert status == 400 and resp["error"]["param"] == "prompt_logprobs"


def test_completions_several_prompts_and_token_ids(client):
    out = client.completions.create(model=MODEL, prompt=["Hello, my name is", "The weather today"], max_tokens=4,
                                    temperature=0, n=2)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    by = {c.index: c.text for c in out.choices}
    assert by[0] == by[1] and by[2] == by[3] and by[0] != by[2]  # greedy: both samples of a prompt agree
    assert out.usage.completion_tokens <= 16
    ids = client.completions.create(model=MODEL, prompt=[[19556, 28, 957, 1462, 314]], max_tokens=4, temperature=0,
                                    echo=True)
    assert ids.usage.prompt_tokens == 5 and ids.choices[0].text.startswith("Hello, my name is")


def test_completions_best_of(client):
    """OpenAI's best_of: best_of samples a prompt, the n of the highest mean log-probability per token
    come back (best first, indexes per prompt), and usage counts every sample; it was a 400."""
    kw = dict(model=MODEL, prompt=["Once upon a time", "The best fruit is"], max_tokens=6, temperature=1.2, seed=4)
    every = client.completions.create(**kw, n=4, logprobs=0)   # the same seeds: the same samples

    def mean(c):
        return sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs)
    best = [sorted(every.choices[4 * p:4 * p + 4], key=mean, reverse=True) for p in (0, 1)]
    r = client.completions.create(**kw, best_of=4, n=2)
    assert [(c.index, c.text, c.logprobs) for c in r.choices] == \
        [(i, c.text, None) for i, c in enumerate(best[0][:2] + best[1][:2])]
    assert r.usage.completion_tokens == every.usage.completion_tokens
    one = client.completions.create(**kw, best_of=3, logprobs=1)
    assert [c.text for c in one.choices] == [max(every.choices[4 * p:4 * p + 3], key=mean).text for p in (0, 1)]
    assert all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) > 0 for c in one.choices)


def test_completions_stream_of_several_prompts_interleaves(client):
    """The prompts of one streamed completion run together, and their chunks come as they are made
    (the second prompt's once waited for the first's to finish); each choice's text is the one the
    non-streamed request gives."""
    kw = dict(model=MODEL, prompt=["Hello, my name is", "The weather today"], max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    whole = {c.index: c.text for c in client.completions.create(**kw).choices}
    order = [(ch.choices[0].index, ch.choices[0].text, ch.choices[0].finish_reason)
             for ch in client.completions.create(**kw, stream=True)]
    assert {i: "".join(t for j, t, _ in order if j == i) for i in (0, 1)} == whole
    first_end = next(k for k, (_, _, fr) in enumerate(order) if fr)
    assert {i for i, _, _ in order[:first_end]} == {0, 1}


def test_completions_stream_n_finishes_each_choice_once(server):
    """With n > 1 a choice that ends first gets one finish chunk and no chunks after it (every later
    step of the other choice repeated its finish_reason chunk); the texts equal the non-streamed."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "n": 2, "stop": [","]}
    lengths = set()
    for seed in range(8):   # until one choice ended before the other (which seed does is the backend's)
        if any(a != b for a, b in lengths):
            break
        status, events = sse_events(server, "/v1/completions", dict(body, seed=seed, stream=True))
        assert status == 200 and events[-1] == "DONE"
        choices = [e["choices"][0] for e in events[:-1]]
        for i in (0, 1):
            mine = [c for c in choices if c["index"] == i]
            assert [c["finish_reason"] is not None for c in mine] == [False] * (len(mine) - 1) + [True]
        status, whole, _ = request(server, "POST", "/v1/completions", dict(body, seed=seed))
        assert ["".join(c["text"] for c in choices if c["index"] == i) for i in (0, 1)] == \
            [c["text"] for c in whole["choices"]]
        lengths.add(tuple(len(c["text"]) for c in whole["choices"]))
    assert any(a != b for a, b in lengths)  # one choice did end before the other


def test_n_and_usage(client):
    r = chat(client, n=2, temperature=1.0, seed=3, max_tokens=6, logprobs=True)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    streamed = list(chat(client, n=2, temperature=1.0, seed=3, max_tokens=6, stream=True))
    texts = ["".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices and ch.choices[0].index == i)
             for i in (0, 1)]
    assert texts == [c.message.content for c in r.choices]  # the same seed gives the same samples


def test_cached_tokens_in_usage(client):
    """usage.prompt_tokens_details.cached_tokens (OpenAI's): the prompt tokens found in the prefix
    cache, in whole and streamed responses of both endpoints; whole blocks of a prompt sent again."""
    system = {"role": "system", "content": "You answer in one word. " + "Be brief and exact. " * 12}
    msgs = [system, {"role": "user", "content": "Name a fruit."}]
    cold = chat(client, messages=msgs)
    warm = chat(client, messages=msgs)
    streamed = list(chat(client, messages=msgs, stream=True, stream_options={"include_usage": True}))
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    hit = warm.usage.prompt_tokens_details.cached_tokens
    assert 0 < hit < warm.usage.prompt_tokens and hit % 16 == 0
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == hit
    prompts = ["Once upon a time in a quiet village by the sea, " * 4 + end for end in ("a", "the")]
    kw = dict(model=MODEL, prompt=prompts, max_tokens=2, temperature=0)
    first = client.completions.create(**kw).usage.prompt_tokens_details.cached_tokens
    again = client.completions.create(**kw)
    both = again.usage.prompt_tokens_details.cached_tokens
    assert first < both and both >= 2 * (again.usage.prompt_tokens // 2 // 16 - 1) * 16
    tail = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))[-1]
    assert tail.usage.prompt_tokens_details.cached_tokens == both


def test_seed_reproducible(client):
    kw = dict(temperature=1.0, top_p=0.95, max_tokens=6, extra_body={"top_k": 50})
    a = chat(client, seed=1234, **kw).choices[0].message.content
    assert chat(client, seed=1234, **kw).choices[0].message.content == a
    others = {chat(client, seed=s, **kw).choices[0].message.content for s in (1, 2)}
    assert others != {a}


def test_top_p_0_is_the_most_likely_token(client):
    """OpenAI takes top_p 0 (some clients send it by default): the nucleus is the most likely token
    alone, so any temperature and seed give the greedy output; it was a 400."""
    greedy = chat(client, max_tokens=10).choices[0].message.content
    assert {chat(client, max_tokens=10, temperature=1.5, top_p=0, seed=s).choices[0].message.content
            for s in (1, 2)} == {greedy}
    kw = dict(model=MODEL, prompt="The three primary colors are", max_tokens=6)
    assert client.completions.create(**kw, temperature=2, top_p=0).choices[0].text == \
        client.completions.create(**kw, temperature=0).choices[0].text
    assert client.responses.create(model=MODEL, input="hi", max_output_tokens=2, top_p=0).top_p == 0


def test_logprobs_chat(client):
    r = chat(client, logprobs=True, top_logprobs=3, max_tokens=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3 and bytes(e.bytes).decode("utf-8", "replace")
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert e.top_logprobs[0].token == e.token  # greedy picks the most likely token
    text = "".join(bytes(b for e in content for b in e.bytes).decode("utf-8", "replace"))
    assert text.startswith(r.choices[0].message.content)
    streamed = [ch for ch in chat(client, logprobs=True, top_logprobs=3, max_tokens=5, stream=True) if ch.choices]
    assert [e.token for ch in streamed if ch.choices[0].logprobs for e in ch.choices[0].logprobs.content] == \
        [e.token for e in content]


def test_logit_bias(client):
    """+100 on one token makes it every output token (its logprob ~0), on both endpoints; the
    biases' effects on the sampler are tests/test_sampler.py's."""
    r = chat(client, max_tokens=4, logprobs=True, logit_bias={"330": 100}, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and len({e.token for e in content}) == 1 and all(e.logprob > -1e-3 for e in content)
    c = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=3, temperature=0.7, seed=1,
                                  logit_bias={"330": 100})
    assert c.choices[0].text == content[0].token * 3
    plain = chat(client, max_tokens=4)
    assert plain.choices[0].message.content != content[0].token * 4


def test_assistant_refusal_parts(client):
    """An assistant turn's content may hold OpenAI's refusal parts (a refused reply sent back in the
    conversation): they read as its text, as vLLM reads them; it was a 400. Elsewhere, and for
    non-text parts such as images, a 400 naming the part and saying the model reads text only."""
    def turns(content, role="assistant"):
        return Q + [{"role": role, "content": content}, {"role": "user", "content": "Why not?"}]
    refusal = "I can't help with that."
    parts = chat(client, messages=turns([{"type": "refusal", "refusal": refusal}, {"type": "text", "text": "Sorry."}]))
    plain = chat(client, messages=turns(refusal + "\nSorry."))
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens
    for content, role in [([{"type": "refusal", "refusal": refusal}], "user"),
                          ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], "user")]:
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, messages=turns(content, role))
        assert e.value.body["param"] == "messages[1].content[0]" and "text only" in e.value.body["message"]


def test_continue_final_message(client):
    """An assistant reply begun by the caller is continued (vLLM's extension): the same tokens as
    the completions endpoint on the template's text cut after that reply."""
    prefix = "The capital of France is"
    msgs = Q + [{"role": "assistant", "content": prefix}]
    r = chat(client, messages=msgs, extra_body={"continue_final_message": True, "add_generation_prompt": False})
    system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    text = system + f"<|im_start|>user\n{Q[0]['content']}<|im_end|>\n<|im_start|>assistant\n{prefix}"
    c = client.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == c.choices[0].text and "Paris" in c.choices[0].text
    assert r.usage.prompt_tokens == c.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, messages=msgs, extra_body={"continue_final_message": True})
    assert e.value.body["param"] == "continue_final_message"


def test_allowed_token_ids(client, server):
    """vLLM's allowed_token_ids through the openai client: the text is made of the allowed tokens only."""
    ids = request(server, "POST", "/tokenize", {"prompt": " yes no", "add_special_tokens": False})[1]["tokens"]
    r = chat(client, max_tokens=6, extra_body={"allowed_token_ids": ids, "ignore_eos": True})
    c = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=6, temperature=0.9, seed=2,
                                  extra_body={"allowed_token_ids": ids, "ignore_eos": True})
    for text in (r.choices[0].message.content, c.choices[0].text):
        assert text and text.replace(" yes", "").replace(" no", "") == "", text


def test_bad_words(client):
    """vLLM's bad_words through the openai client: a word of the greedy answer no longer appears."""
    base = chat(client, max_tokens=12).choices[0].message.content
    word = max(base.split(), key=len).strip(".,!?")
    r = chat(client, max_tokens=12, extra_body={"bad_words": [word]})
    assert word in base and word not in r.choices[0].message.content, (word, r.choices[0].message.content)


def test_truncate_prompt_tokens(client, server):
    """vLLM's truncate_prompt_tokens: the prompt's last k tokens on both endpoints (usage, echo, and the
    same completion as those tokens sent alone)."""
    text = "Once upon a time, in a land far away, there lived a"
    ids = request(server, "POST", "/tokenize", {"prompt": text})[1]["tokens"]
    c = client.completions.create(model=MODEL, prompt=text, max_tokens=5, temperature=0, echo=True,
                                  extra_body={"truncate_prompt_tokens": 4})
    alone = client.completions.create(model=MODEL, prompt=ids[-4:], max_tokens=5, temperature=0, echo=True)
    assert c.usage.prompt_tokens == 4 and c.choices[0].text == alone.choices[0].text
    r = chat(client, max_tokens=3, extra_body={"truncate_prompt_tokens": 6})
    assert r.usage.prompt_tokens == 6


def test_tokenize_and_detokenize(client, server):
    """vLLM's /tokenize and /detokenize: a prompt's count is the completions endpoint's prompt_tokens,
    a conversation's (with tools) the chat endpoint's; detokenize inverts tokenize."""
    text = "One, two, three,"
    status, t, _ = request(server, "POST", "/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True})
    c = client.completions.create(model=MODEL, prompt=text, max_tokens=1)
    assert status == 200 and t["count"] == len(t["tokens"]) == c.usage.prompt_tokens and t["max_model_len"] == 8192
    assert len(t["token_strs"]) == t["count"] and all(isinstance(s, str) and s for s in t["token_strs"])
    assert request(server, "POST", "/detokenize", {"tokens": t["tokens"]})[1] == {"prompt": text}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    status, m, _ = request(server, "POST", "/tokenize", {"messages": Q, "tools": tools})
    r = chat(client, max_tokens=1, tools=tools)
    assert status == 200 and m["count"] == r.usage.prompt_tokens and m["token_strs"] is None
    for path, body, param in (("/tokenize", {"prompt": "x", "messages": Q}, "prompt"), ("/tokenize", {}, "prompt"),
                              ("/tokenize", {"prompt": "x", "foo": 1}, "foo"),
                              ("/tokenize", {"messages": Q, "continue_final_message": True}, "continue_final_message"),
                              ("/detokenize", {"tokens": [10**9]}, "tokens"), ("/detokenize", {"tokens": "a"}, "tokens")):
        status, body, _ = request(server, "POST", path, body)
        assert status == 400 and body["error"]["param"] == param, body
    assert request(server, "POST", "/detokenize", {"model": "nope", "tokens": [1]})[0] == 404


def test_return_token_ids(client, server):
    """vLLM's return_token_ids: chat gives the prompt's ids (those /tokenize counts) and each choice's
    generated ids; streamed, the first chunk has the prompt's and each chunk the ids since the
    last, joining to the whole response's. Completions give both per choice."""
    extra = {"return_token_ids": True}
    whole = chat(client, max_tokens=10, n=2, temperature=1.0, seed=3, extra_body=extra).model_dump()
    tokenized = request(server, "POST", "/tokenize", {"messages": Q})[1]["tokens"]
    assert whole["prompt_token_ids"] == tokenized and len(tokenized) == whole["usage"]["prompt_tokens"]
    for c in whole["choices"]:
        ids = c["token_ids"]
        assert request(server, "POST", "/detokenize", {"tokens": ids})[1]["prompt"].startswith(c["message"]["content"])
    assert sum(len(c["token_ids"]) for c in whole["choices"]) == whole["usage"]["completion_tokens"]
    chunks = [ch.model_dump() for ch in chat(client, max_tokens=10, n=2, temperature=1.0, seed=3, stream=True,
                                             extra_body=extra)]
    assert chunks[0]["prompt_token_ids"] == tokenized and all("prompt_token_ids" not in ch for ch in chunks[2:])
    for i, c in enumerate(whole["choices"]):
        streamed = [t for ch in chunks for d in ch["choices"] if d["index"] == i for t in d.get("token_ids") or []]
        assert streamed == c["token_ids"]
    assert "prompt_token_ids" not in chat(client, max_tokens=2).model_dump()
    comp = client.completions.create(model=MODEL, prompt=["One, two,", "Hello"], max_tokens=4, temperature=0,
                                     extra_body=extra)
    for c, p in zip(comp.model_dump()["choices"], ["One, two,", "Hello"]):
        assert c["prompt_token_ids"] == request(server, "POST", "/tokenize", {"prompt": p})[1]["tokens"]
        assert len(c["token_ids"]) == 4
    chunks = [ch.model_dump() for ch in client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4,
                                                                  temperature=0, stream=True, extra_body=extra)]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == comp.model_dump()["choices"][0]["prompt_token_ids"]
    assert [t for ch in chunks for t in ch["choices"][0]["token_ids"]] == comp.model_dump()["choices"][0]["token_ids"]


def test_stop_strings(client):
    base = chat(client, max_tokens=12).choices[0].message.content
    word = base.split()[2]
    r = chat(client, max_tokens=12, stop=[word, "zzzz"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == base[: base.index(word)]
    assert r.choices[0].model_extra["stop_reason"] == word
    s = list(chat(client, max_tokens=12, stop=word, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in s) == base[: base.index(word)]
    c = client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=12, temperature=0,
                                  stop=[" six"])
    assert " six" not in c.choices[0].text and c.choices[0].finish_reason == "stop"


def test_max_tokens_fields_and_extensions(client):
    r = chat(client, max_completion_tokens=5, extra_body={"ignore_eos": True, "priority": 0, "min_p": 0.05},
             user="tester", presence_penalty=0.5, frequency_penalty=0.5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    # vLLM's beam-search fields at their defaults (no beam search) are taken; use_beam_search true is a 400
    r = chat(client, max_tokens=3, extra_body={"ignore_eos": True, "repetition_penalty": 1.3,
                                               "use_beam_search": False, "length_penalty": 1.0})
    assert r.usage.completion_tokens == 3
    # as vLLM, temperature goes past OpenAI's 2 and repetition_penalty past 10 (up to SamplingParams' 1e6)
    r = chat(client, max_tokens=1, temperature=2.5, seed=1, extra_body={"repetition_penalty": 12.0})
    assert r.usage.completion_tokens == 1


def test_completions_max_tokens_null_is_up_to_the_context(client, server):
    """As vLLM's: completions' max_tokens left out is OpenAI's 16, null is up to the context (it was 16 too, so
    min_tokens 17 was a 400). One allowed token and a stop string on it end the output right after min_tokens."""
    a = request(server, "POST", "/tokenize", {"prompt": " a", "add_special_tokens": False})[1]["tokens"]
    body = {"model": MODEL, "prompt": "a", "temperature": 0, "stop": [" a"], "allowed_token_ids": a, "min_tokens": 17}
    status, r, _ = request(server, "POST", "/v1/completions", body)
    assert status == 400 and r["error"]["param"] == "min_tokens"
    c = client.completions.create(model=MODEL, prompt="a", max_tokens=None, temperature=0, stop=[" a"],
                                  extra_body={"allowed_token_ids": a, "min_tokens": 17})
    assert c.choices[0].text == " a" * 17 and c.usage.completion_tokens == 18 and c.choices[0].finish_reason == "stop"


def test_spaces_between_special_tokens_accepted(server):
    """vLLM's spaces_between_special_tokens (a 400 'Unrecognized request argument' before) is taken on
    both endpoints; tokens are joined as their bytes, as vLLM's fast detokenizer does, so the text
    with special tokens shown is the same either way (and a non-boolean is a 400)."""
    ids = [1, 9690, 198, 2, 1, 4093, 198, 19556, 2, 1]   # <|im_start|>system\n<|im_end|><|im_start|>user...
    base = {"model": MODEL, "prompt": ids, "max_tokens": 4, "temperature": 0, "echo": True,
            "skip_special_tokens": False, "ignore_eos": True}
    texts = []
    for v in (True, False):
        status, r, _ = request(server, "POST", "/v1/completions", dict(base, spaces_between_special_tokens=v))
        assert status == 200, r
        texts.append(r["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0].startswith("<|im_start|>system\n<|im_end|><|im_start|>user")
    chat = {"model": MODEL, "messages": Q, "max_tokens": 3, "temperature": 0, "spaces_between_special_tokens": False}
    assert request(server, "POST", "/v1/chat/completions", chat)[0] == 200
    status, r, _ = request(server, "POST", "/v1/chat/completions", dict(chat, spaces_between_special_tokens=1))
    assert status == 400 and r["error"]["param"] == "spaces_between_special_tokens"


def test_top_k_past_the_vocabulary_is_no_top_k(client):
    """A top_k too large for an int64 once failed the engine step of every request in the batch."""
    r = chat(client, temperature=1, seed=3, extra_body={"top_k": 10**20})
    assert r.choices[0].message.content == chat(client, temperature=1, seed=3).choices[0].message.content


def _stream_text(client, prompt, out, i):
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=8, temperature=0, stream=True)
    out[i] = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)


def test_32_concurrent_streams_match_alone(client, server):
    prompts = [f"Give me one fact about the number {k}." for k in range(8)]
    alone = {}
    for k, p in enumerate(prompts):
        _stream_text(client, p, alone, k)
    assert len(set(alone.values())) > 1
    out = [None] * 32
    threads = [threading.Thread(target=_stream_text, args=(client, prompts[i % 8], out, i)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [o for o in out if o is None] == []  # none lost
    assert out == [alone[i % 8] for i in range(32)]
    m = metrics(server)
    assert metric(m, "pocketcupy_requests_in_flight") == 0 and metric(m, "pocketcupy_kv_blocks_used") == 0


def _wait_idle(server, timeout=20.0) -> dict:
    """Until the engine holds no blocks and the HTTP side has closed its request (a scrape is not atomic:
    counters are read before the engine's gauges)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(server)
        if metric(m, "pocketcupy_kv_blocks_used") == 0 and metric(m, "pocketcupy_num_requests_running") == 0 \
                and metric(m, "pocketcupy_requests_in_flight") == 0:
            return m
        time.sleep(0.1)
    pytest.fail(f"KV blocks not freed: {metric(m, 'pocketcupy_kv_blocks_used')}")


STORY = [{"role": "user", "content": "Write a long story."}]
# long enough that a GPU (~1 ms a token) is still generating when the server notices the client gone
GONE_ROUTES = {"/v1/chat/completions": {"messages": STORY, "max_tokens": 4000},
               "/v1/responses": {"input": STORY, "max_output_tokens": 4000},
               "/v1/messages": {"messages": STORY, "max_tokens": 4000}}


@pytest.mark.parametrize("path,stream", [("/v1/chat/completions", True), ("/v1/chat/completions", False),
                                         ("/v1/responses", True), ("/v1/messages", True)])
def test_client_gone_frees_kv_blocks(server, path, stream):
    before = metric(metrics(server), "pocketcupy_request_finished_total", finish_reason="abort")
    body = dict(GONE_ROUTES[path], model=MODEL, ignore_eos=True, stream=stream)
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    if stream:
        r = c.getresponse()
        assert r.status == 200
        lines = []
        while len(lines) < 3 and (line := r.readline()):
            if line.startswith(b"data:"):
                lines.append(line)
        assert len(lines) == 3, lines
        ended = (b'data: {"error"', b'data: {"type":"error"', b"data: [DONE]")   # (the last: the Responses')
        assert not any(x.startswith(ended) for x in lines), lines
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # generating: it holds KV blocks
        m = metrics(server)
        if metric(m, "pocketcupy_kv_blocks_used") > 0 and metric(m, "pocketcupy_num_requests_running") == 1:
            break
        time.sleep(0.05)
    else:
        seen = {k: metric(m, "pocketcupy_" + k) for k in ("model_ready", "num_requests_running",
                                                          "num_requests_waiting", "kv_blocks_used",
                                                          "requests_in_flight")}
        pytest.fail(f"the request never ran: {seen}\n{server.output()[-3000:]}")
    if stream:
        r.close()
    c.close()  # the client goes away mid-request
    m = _wait_idle(server)
    assert metric(m, "pocketcupy_request_finished_total", finish_reason="abort") == before + 1
    assert metric(m, "pocketcupy_requests_in_flight") == 0


def test_metrics_move(client, server):
    m0 = metrics(server)
    r = chat(client, max_tokens=4, extra_body={"ignore_eos": True})
    m1 = metrics(server)
    route = dict(route="/v1/chat/completions", status="200")
    assert metric(m1, "pocketcupy_http_requests_total", **route) == metric(m0, "pocketcupy_http_requests_total",
                                                                         **route) + 1
    assert metric(m1, "pocketcupy_prompt_tokens_total") - metric(m0, "pocketcupy_prompt_tokens_total") == \
        r.usage.prompt_tokens
    assert metric(m1, "pocketcupy_generation_tokens_total") - metric(m0, "pocketcupy_generation_tokens_total") == 4
    for h in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
              "request_inference_time_seconds"):
        assert metric(m1, f"pocketcupy_{h}_count") == metric(m0, f"pocketcupy_{h}_count") + 1
    for h, total in [("request_prompt_tokens", r.usage.prompt_tokens), ("request_generation_tokens", 4),
                     ("request_params_max_tokens", 4), ("request_params_n", 1)]:   # vLLM's per-request histograms
        assert [metric(m1, f"pocketcupy_{h}_{s}") - metric(m0, f"pocketcupy_{h}_{s}") for s in ("count", "sum")] \
            == [1, total], h
    assert 1 <= metric(m1, "pocketcupy_inter_token_latency_seconds_count") - \
        metric(m0, "pocketcupy_inter_token_latency_seconds_count") <= 3   # (an output a step: 3 gaps at most)
    assert metric(m1, "pocketcupy_kv_blocks_total") > 0 and metric(m1, "pocketcupy_model_ready") == 1
    assert metric(m1, "pocketcupy_cache_config_info", block_size="16", cache_dtype="auto",
                  num_blocks=str(int(metric(m1, "pocketcupy_kv_blocks_total")))) == 1
    assert metric(m1, "pocketcupy_recurrent_state_bytes") == 0       # SmolLM2 has no recurrent layers
    for name in ("pocketcupy_num_requests_waiting", "pocketcupy_num_preemptions_total",
                 "pocketcupy_prefix_cache_hit_rate"):
        assert (name, frozenset()) in m1

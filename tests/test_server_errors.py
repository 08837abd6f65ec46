"""Malformed requests: each gets a 4xx with OpenAI's error body naming the right `param`, none is
a 500, and the server keeps serving afterwards."""
import http.client
import json
import socket

import pytest

from tests.test_server_harness import MODEL, metric, metrics, request, server, serving  # noqa: F401

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw):
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 2}
    body.update(kw)
    return {k: v for k, v in body.items() if v is not ...}


def comp(**kw):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    body.update(kw)
    return {k: v for k, v in body.items() if v is not ...}


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]

TABLE = [  # (path, body, status, param)
    (CHAT, chat(model=...), 400, "model"),
    (CHAT, chat(model="gpt-17"), 404, "model"),
    (CHAT, chat(model=5), 400, "model"),
    (CHAT, chat(messages=...), 400, "messages"),
    (CHAT, chat(messages=[]), 400, "messages"),
    (CHAT, chat(messages="hi"), 400, "messages"),
    (CHAT, chat(messages=[{"content": "hi"}]), 400, "messages[0].role"),
    (CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content[0]"),
    (CHAT, chat(messages=[{"role": "user", "content": None}]), 400, "messages[0].content"),
    (CHAT, chat(messages=MSGS + [{"role": "tool", "content": "18C"}]), 400, "messages[1].tool_call_id"),
    (CHAT, chat(messages=[{"role": "user", "content": "hi", "name": 5}]), 400, "messages[0].name"),
    (CHAT, chat(temperature=-1), 400, "temperature"),
    (CHAT, chat(temperature="hot"), 400, "temperature"),
    (CHAT, chat(temperature=1e39), 400, "temperature"),
    (COMP, comp(repetition_penalty=1e39), 400, "repetition_penalty"),
    (CHAT, chat(top_p=-0.1), 400, "top_p"),
    (CHAT, chat(top_p=1.5), 400, "top_p"),
    (CHAT, chat(top_k=-2), 400, "top_k"),
    (CHAT, chat(min_p=2), 400, "min_p"),
    (CHAT, chat(n=0), 400, "n"),
    (CHAT, chat(n=1000), 400, "n"),
    (CHAT, chat(max_tokens=0), 400, "max_tokens"),
    (CHAT, chat(max_tokens="ten"), 400, "max_tokens"),
    (CHAT, chat(max_completion_tokens=-1), 400, "max_completion_tokens"),
    (CHAT, chat(max_tokens=10**6), 400, "max_tokens"),
    (CHAT, chat(messages=[{"role": "user", "content": "hello " * 9000}]), 400, "messages"),
    (CHAT, chat(min_tokens=5), 400, "min_tokens"),
    (CHAT, chat(presence_penalty=3), 400, "presence_penalty"),
    (CHAT, chat(frequency_penalty=-2.5), 400, "frequency_penalty"),
    (CHAT, chat(repetition_penalty=0), 400, "repetition_penalty"),
    (CHAT, chat(seed="x"), 400, "seed"),
    (CHAT, chat(seed=2**70), 400, "seed"),
    (CHAT, chat(stop=5), 400, "stop"),
    (CHAT, chat(stop=[""]), 400, "stop"),
    (CHAT, chat(stop=["x"] * 40), 400, "stop"),
    (CHAT, chat(stop_token_ids=[-1]), 400, "stop_token_ids"),
    (CHAT, chat(logprobs="yes"), 400, "logprobs"),
    (CHAT, chat(logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    (CHAT, chat(top_logprobs=2), 400, "top_logprobs"),
    (CHAT, chat(stream="yes"), 400, "stream"),
    (CHAT, chat(stream_options={"include_usage": True}), 400, "stream_options"),
    (CHAT, chat(stream=True, stream_options={"include_usage": "x"}), 400, "stream_options.include_usage"),
    (CHAT, chat(best_of=3), 400, "best_of"),
    (CHAT, chat(use_beam_search=True), 400, "use_beam_search"),
    (COMP, comp(use_beam_search=True), 400, "use_beam_search"),
    (COMP, comp(length_penalty="long"), 400, "length_penalty"),
    (CHAT, chat(tools="x"), 400, "tools"),
    (CHAT, chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]), 400, "tools[0].function.name"),
    (CHAT, chat(tools=WEATHER, tool_choice="sometimes"), 400, "tool_choice"),
    (CHAT, chat(tool_choice="auto"), 400, "tool_choice"),
    (CHAT, chat(tools=WEATHER, tool_choice={"type": "function", "function": {"name": "nope"}}), 400, "tool_choice"),
    (CHAT, chat(tools=WEATHER, tool_choice={"type": "function", "function": {"name": ["get_weather"]}}), 400,
     "tool_choice"),
    (CHAT, chat(tools=WEATHER + [{"type": "function", "function": {"name": "f", "description": "\ud800"}}],
                tool_choice="required"), 400, "messages"),
    (CHAT, chat(response_format={"type": "xml"}), 400, "response_format.type"),
    (CHAT, chat(logit_bias=[1]), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"x": 5}), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"-1": 5}), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"49152": 5}), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"1" * 5000: 5}), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"1": 101}), 400, "logit_bias"),
    (CHAT, chat(logit_bias={"1": "5"}), 400, "logit_bias"),
    (COMP, comp(logit_bias={"1": True}), 400, "logit_bias"),
    (CHAT, chat(allowed_token_ids=[]), 400, "allowed_token_ids"),
    (CHAT, chat(bad_words="x"), 400, "bad_words"),
    (CHAT, chat(truncate_prompt_tokens=0), 400, "truncate_prompt_tokens"),
    (COMP, comp(truncate_prompt_tokens=-3), 400, "truncate_prompt_tokens"),
    (COMP, comp(bad_words=[""]), 400, "bad_words"),
    (COMP, comp(bad_words=["a\ud800"]), 400, "bad_words"),
    (COMP, comp(allowed_token_ids=[10**9]), 400, "allowed_token_ids"),
    (CHAT, chat(allowed_token_ids=[5], response_format={"type": "json_object"}), 400, "allowed_token_ids"),
    (CHAT, chat(user=5), 400, "user"),
    (CHAT, chat(priority="high"), 400, "priority"),
    (CHAT, chat(chat_template_kwargs="x"), 400, "chat_template_kwargs"),
    (CHAT, chat(reasoning_effort="extreme"), 400, "reasoning_effort"),
    (CHAT, chat(verbosity=3), 400, "verbosity"),
    (CHAT, chat(prompt_cache_key=["k"]), 400, "prompt_cache_key"),
    (CHAT, chat(modalities=["text", "audio"]), 400, "modalities"),
    (CHAT, chat(audio={"voice": "alloy", "format": "wav"}), 400, "audio"),
    (CHAT, chat(prediction={"type": "image"}), 400, "prediction"),
    (CHAT, chat(web_search_options={}), 400, "web_search_options"),
    (CHAT, chat(functions=[{"name": "f", "parameters": {"type": "object"}}]), 400, "functions"),
    (CHAT, chat(function_call="auto"), 400, "function_call"),
    (CHAT, chat(foo=1), 400, "foo"),
    (COMP, comp(prompt=...), 400, "prompt"),
    (COMP, comp(prompt=[]), 400, "prompt"),
    (COMP, comp(prompt=[[1, 2], "a"]), 400, "prompt"),
    (COMP, comp(prompt=[10**9]), 400, "prompt"),
    (COMP, comp(echo="yes"), 400, "echo"),
    (COMP, comp(logprobs=50), 400, "logprobs"),
    (COMP, comp(suffix="x"), 400, "suffix"),
    (COMP, comp(max_tokens=10**6), 400, "max_tokens"),
    (COMP, comp(best_of=1, n=2), 400, "best_of"),
    (COMP, comp(best_of=3, stream=True), 400, "best_of"),
    (COMP, comp(model="nope"), 404, "model"),
]


def _check_body(body, status, param):
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["param"] == param and body["error"]["message"], body


@pytest.mark.parametrize("path,body,status,param", TABLE, ids=[f"{t[3]}-{i}" for i, t in enumerate(TABLE)])
def test_malformed_request(server, path, body, status, param):
    got, resp, headers = request(server, "POST", path, body)
    assert got == status, resp
    assert headers["Content-Type"].startswith("application/json")
    _check_body(resp, status, param)


PRIORITY = [(CHAT, chat(priority=1)), (CHAT, chat(priority=-2, stream=True)), (COMP, comp(priority=3)),
            ("/v1/embeddings", {"model": MODEL, "input": "hi", "priority": 1}),
            ("/v1/score", {"model": MODEL, "text_1": "a", "text_2": "b", "priority": 1}),
            ("/v1/rerank", {"model": MODEL, "query": "a", "documents": ["b"], "priority": 1}),
            ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2, "priority": 1}),
            ("/v1/messages", {"model": MODEL, "messages": MSGS, "max_tokens": 2, "priority": 1})]


@pytest.mark.parametrize("path,body", PRIORITY, ids=[p for p, _ in PRIORITY])
def test_priority_refused_under_fcfs(server, path, body):
    """The server schedules fcfs: a nonzero priority is a 400 naming it (vLLM's), not silently ignored; 0 is fine."""
    status, resp, _ = request(server, "POST", path, body)
    assert status == 400, resp
    if path == "/v1/messages":   # the Anthropic error body (no param)
        assert resp["error"]["message"].startswith("priority:"), resp
    else:
        _check_body(resp, 400, "priority")
    assert "scheduling_policy" in json.dumps(resp), resp
    assert request(server, "POST", path, dict(body, priority=0))[0] == 200


def test_context_error_names_both_counts(server):
    _, resp, _ = request(server, "POST", CHAT, chat(max_tokens=10**6))
    msg = resp["error"]["message"]
    assert "1000000" in msg and "maximum context length is 8192" in msg and "in the messages" in msg


@pytest.mark.parametrize("path,body", [(CHAT, chat(max_tokens=10**6)), (COMP, comp(max_tokens=10**6)),
                                       (CHAT, chat(messages=[{"role": "user", "content": "hello " * 9000}])),
                                       (COMP, comp(prompt="hello " * 9000))])
def test_context_error_has_openai_code(server, path, body):
    """OpenAI's context-length errors carry code 'context_length_exceeded', which clients (LangChain,
    agents) test to shorten the conversation and retry; through the openai client too."""
    import openai

    status, resp, _ = request(server, "POST", path, body)
    assert status == 400 and resp["error"]["code"] == "context_length_exceeded", resp
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    create = c.chat.completions.create if path == CHAT else c.completions.create
    with pytest.raises(openai.BadRequestError) as e:
        create(**body)
    assert e.value.code == "context_length_exceeded" and "maximum context length is 8192" in e.value.message


@pytest.mark.parametrize("raw,path", [(b'{"model": ', CHAT), (b"[1, 2]", CHAT), (b"", COMP), (b"\xff\xfe{", CHAT),
                                      (b'{"model": "smollm2", "prompt": "x", "temperature": NaN}', COMP),
                                      (b"[" * 100000 + b"]" * 100000, CHAT)])
def test_malformed_json(server, raw, path):
    status, resp, _ = request(server, "POST", path, raw=raw)
    assert status == 400
    _check_body(resp, 400, None)


@pytest.mark.parametrize("framing", [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n"])
def test_malformed_chunked_body_400(server, framing):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" + framing)
        reply = b""
        while data := s.recv(65536):  # the connection closes: where the next request starts is unknown
            reply += data
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply
    _check_body(json.loads(body), 400, None)


def test_compressed_body_415(server):
    import gzip

    raw = gzip.compress(json.dumps(comp()).encode())
    status, resp, _ = request(server, "POST", COMP, raw=raw, headers={"Content-Encoding": "gzip"})
    assert status == 415 and "gzip" in resp["error"]["message"]
    _check_body(resp, 415, None)


@pytest.mark.parametrize("field,status,param", [(b'"model": "x\\ud800"', 404, "model"),
                                                 (b'"model": "smollm2", "\\ud800": 1', 400, "\ud800")])
def test_lone_surrogate_echoed_in_an_error(server, field, status, param):
    """A lone surrogate is valid JSON (as an escape) but not UTF-8: echoed back, it is escaped, not a 500."""
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, ' + field + b"}"
    got, resp, _ = request(server, "POST", CHAT, raw=raw)
    assert got == status, resp
    _check_body(resp, status, param)



@pytest.mark.parametrize("body,param", [(b'{"prompt": "a\\ud83d"}', "prompt"),
                                        (b'{"messages": [{"role": "user", "content": "a\\ud83d"}]}', "messages")])
def test_tokenize_lone_surrogate_names_its_field(server, body, param):
    """/tokenize of text with a lone surrogate (valid JSON, not UTF-8): a 400 naming the field it came
    from; a conversation's was called 'prompt'."""
    status, resp, _ = request(server, "POST", "/tokenize", raw=body)
    assert status == 400 and "lone surrogate" in resp["error"]["message"], resp
    _check_body(resp, 400, param)

def test_wrong_method_and_route(server):
    status, resp, _ = request(server, "GET", CHAT)
    assert status == 405 and resp["error"]["type"] == "invalid_request_error"
    status, resp, _ = request(server, "GET", "/v1/nothing")
    assert status == 404 and resp["error"]["code"] == "not_found"
    status, resp, _ = request(server, "GET", "/v1/models/gpt-17")
    assert status == 404 and resp["error"]["param"] == "model"


def test_streaming_request_errors_are_json_not_sse(server):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request("POST", CHAT, b'{"model": "smollm2", "messages": [], "stream": true}', {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 400 and r.getheader("Content-Type").startswith("application/json")
    c.close()


def test_healthy_after_errors(server):
    assert request(server, "GET", "/health")[0] == 200
    status, resp, _ = request(server, "POST", CHAT, chat(max_tokens=2, temperature=0))
    assert status == 200 and resp["usage"]["completion_tokens"] >= 1
    m = metrics(server)
    assert not [k for k, v in m.items() if k[0] == "pocketcupy_http_requests_total" and ("status", "500") in k[1] and v]


@pytest.fixture(scope="module")
def small_pool(smollm2_gguf):
    """A server whose KV pool (7 usable blocks of 16 tokens) holds a short prompt but not a long one."""
    yield from serving(smollm2_gguf, "--num-kv-blocks", "8")


def test_prompt_the_pool_cannot_hold_is_no_finished_request(small_pool):
    """Of a completion's prompts, those submitted before the one the KV pool cannot hold are taken back
    uncounted: the request is a 400, not an aborted request in request_finished_total (it was)."""
    m0 = metrics(small_pool)
    status, resp, _ = request(small_pool, "POST", COMP, comp(prompt=["hi", "word " * 200], max_tokens=4))
    assert status == 400 and resp["error"]["param"] == "prompt" and "KV blocks" in resp["error"]["message"]
    m1 = metrics(small_pool)
    for name, labels in [("pocketcupy_request_finished_total", {"finish_reason": "abort"}),
                         ("pocketcupy_prompt_tokens_total", {}), ("pocketcupy_requests_in_flight", {})]:
        assert metric(m1, name, **labels) == metric(m0, name, **labels), name
    assert request(small_pool, "POST", COMP, comp(prompt=["hi", "hello"]))[0] == 200
    assert metric(metrics(small_pool), "pocketcupy_kv_blocks_used") == 0


def test_refused_constrained_request_is_not_counted(small_pool):
    """A constrained prompt the KV pool cannot hold is refused after its grammar compiled, and a prompt
    submitted before it is taken back: neither is in structured_requests_total (both were)."""
    def n():
        return metric(metrics(small_pool), "pocketcupy_structured_requests_total")
    n0 = n()
    for prompt in ("word " * 200, ["hi", "word " * 200]):
        status, resp, _ = request(small_pool, "POST", COMP, comp(prompt=prompt, max_tokens=4, guided_regex="[a-z]+"))
        assert status == 400 and "KV blocks" in resp["error"]["message"], resp
    assert n() == n0
    assert request(small_pool, "POST", COMP, comp(max_tokens=4, guided_regex="[a-z]+"))[0] == 200
    assert n() == n0 + 1

"""POST /v1/messages (the Anthropic Messages API) through the official `anthropic` client and raw
HTTP: the same text and token counts as the chat request it translates to, the stream's event
sequence, stop sequences, tool use and its round trip, count_tokens, and Anthropic's error body."""
import json

import pytest

from tests.test_server_harness import MODEL, request, server  # noqa: F401

Q = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
NAMED = {"type": "tool", "name": "get_weather"}


@pytest.fixture(scope="module")
def client(server):
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def create(client, **kw):
    """Greedy: the current API has no temperature, so it goes as an extra field (older clients send it)."""
    return client.messages.create(model=MODEL, **{"messages": Q, "max_tokens": 24, "extra_body": {"temperature": 0},
                                                   **kw})


def total_input(usage) -> int:
    """The prompt's tokens: Anthropic's input_tokens leave out those read from (or written to) the cache."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def chat(server, **kw):
    status, body, _ = request(server, "POST", "/v1/chat/completions", dict({"model": MODEL, "temperature": 0}, **kw))
    assert status == 200, body
    return body


def test_text_matches_chat(client, server):
    m = create(client, system="Answer briefly.", max_tokens=40)
    c = chat(server, messages=[{"role": "system", "content": "Answer briefly."}] + Q, max_tokens=40)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL and m.id.startswith("msg_")
    (block,) = m.content
    assert block.type == "text" and block.text == c["choices"][0]["message"]["content"]
    assert (total_input(m.usage), m.usage.output_tokens) == (c["usage"]["prompt_tokens"],
                                                              c["usage"]["completion_tokens"])
    want = {"stop": "end_turn", "length": "max_tokens"}[c["choices"][0]["finish_reason"]]
    assert m.stop_reason == want and m.stop_sequence is None


def test_content_blocks_and_system_blocks(client):
    """A system prompt as text blocks and a turn as text blocks render as the plain strings do."""
    plain = create(client, system="Answer briefly.", max_tokens=12)
    blocks = create(client, system=[{"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}],
                    messages=[{"role": "user", "content": [{"type": "text", "text": Q[0]["content"]}]}], max_tokens=12)
    assert blocks.content[0].text == plain.content[0].text
    assert total_input(blocks.usage) == total_input(plain.usage)


def test_last_assistant_turn_is_a_prefill(client, server):
    """As Anthropic's API does, the reply continues a last assistant turn (chat's continue_final_message)."""
    turns = Q + [{"role": "assistant", "content": "The capital of France is"}]
    m = create(client, messages=turns, max_tokens=8)
    c = chat(server, messages=turns, max_tokens=8, continue_final_message=True, add_generation_prompt=False)
    assert m.content[0].text == c["choices"][0]["message"]["content"] and m.content[0].text
    assert total_input(m.usage) == c["usage"]["prompt_tokens"]


@pytest.mark.parametrize("empty", ["", []])
def test_empty_final_assistant_turn_is_no_prefill(client, empty):
    """Anthropic allows the final assistant turn (only) to be empty; the reply is then not a continuation."""
    m = create(client, messages=Q + [{"role": "assistant", "content": empty}], max_tokens=8)
    plain = create(client, max_tokens=8)
    assert m.content[0].text == plain.content[0].text and total_input(m.usage) == total_input(plain.usage)


def test_stream_events(client, server):
    whole = create(client)
    status, events = _raw_stream(server, dict(model=MODEL, messages=Q, max_tokens=24, temperature=0, stream=True))
    types = [e["type"] for e in events]
    # Anthropic's order, a ping after the first content_block_start (there was none)
    assert types[:3] == ["message_start", "content_block_start", "ping"] and types[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(types[3:-3]) == {"content_block_delta"}
    assert events[0]["message"]["usage"]["input_tokens"] + events[0]["message"]["usage"][
        "cache_read_input_tokens"] == total_input(whole.usage)
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == whole.content[0].text
    assert events[-2]["delta"]["stop_reason"] == whole.stop_reason
    assert events[-2]["usage"]["output_tokens"] == whole.usage.output_tokens
    with client.messages.stream(model=MODEL, messages=Q, max_tokens=24, extra_body={"temperature": 0}) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text and final.content[0].text == text and final.stop_reason == whole.stop_reason


def test_usage_leaves_cached_prompt_tokens_out_of_input_tokens(client, server):
    """As Anthropic's API: input_tokens are the prompt tokens not read from the (prefix) cache, those
    read are cache_read_input_tokens, and together they are the prompt (input_tokens was the whole
    prompt, cache_read_input_tokens counted twice). A stream's message_start and message_delta say
    the same as the whole response; the client's final message too."""
    turns = [{"role": "user", "content": "List three colours of the rainbow, " + "please " * 40}]
    prompt = chat(server, messages=turns, max_tokens=1)["usage"]["prompt_tokens"]   # (now in the prefix cache)
    m = create(client, messages=turns, max_tokens=8)
    u = m.usage
    assert u.cache_read_input_tokens >= 32 and u.cache_creation_input_tokens == 0
    assert u.input_tokens == prompt - u.cache_read_input_tokens
    status, events = _raw_stream(server, dict(model=MODEL, messages=turns, max_tokens=8, temperature=0, stream=True))
    start, delta = events[0]["message"]["usage"], events[-2]["usage"]
    split = {k: getattr(u, k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")}
    assert status == 200 and start == dict(split, output_tokens=0)
    assert delta == dict(split, output_tokens=u.output_tokens)
    with client.messages.stream(model=MODEL, messages=turns, max_tokens=8, extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert final.usage.model_dump(include=set(split) | {"output_tokens"}) == dict(split, output_tokens=u.output_tokens)


def _raw_stream(server, body):
    """-> (status, [event data]); every SSE message's `event:` line names its data's type."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    c.request("POST", "/v1/messages", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    messages = r.read().decode().strip().split("\n\n")
    c.close()
    events = []
    for m in messages:
        event, data = m.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert event == f"event: {events[-1]['type']}"
    return r.status, events


def test_stop_sequence(client):
    text = create(client).content[0].text
    word = text.split()[2]                      # a word the greedy reply writes
    m = create(client, stop_sequences=[word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == text[:text.index(word)]


def test_tool_use_round_trip(client):
    m = create(client, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=TOOLS,
               tool_choice=NAMED)
    (use,) = m.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert m.stop_reason == "tool_use" and isinstance(use.input["city"], str)
    follow = [{"role": "user", "content": "What is the weather in Paris?"},
              {"role": "assistant", "content": [b.model_dump() for b in m.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C, sunny"}]}]
    answer = create(client, messages=follow, tools=TOOLS, tool_choice={"type": "none"})
    assert answer.content[0].type == "text" and answer.content[0].text
    plain = create(client, messages=follow[:1], tools=TOOLS, tool_choice={"type": "none"}, max_tokens=1)
    assert total_input(answer.usage) > total_input(plain.usage) + 10   # the call and its result are in the prompt


def test_tool_use_streams_input_json(client, server):
    whole = create(client, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=TOOLS,
                   tool_choice={"type": "any"}).content[0]
    status, events = _raw_stream(server, dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}],
                                              max_tokens=24, temperature=0, stream=True, tools=TOOLS,
                                              tool_choice={"type": "any"}))
    start = next(e for e in events if e["type"] == "content_block_start")["content_block"]
    assert start["type"] == "tool_use" and start["name"] == "get_weather" and start["input"] == {}
    parts = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert len(parts) > 1 and json.loads("".join(parts)) == whole.input
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_output_config_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    m = create(client, messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=48,
               extra_body={"temperature": 0, "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    person = json.loads(m.content[0].text)
    assert m.stop_reason == "end_turn" and set(person) == {"name", "age"} and isinstance(person["age"], int)


def test_count_tokens(client):
    kw = dict(system="Answer briefly.", messages=Q, tools=TOOLS)
    counted = client.messages.count_tokens(model=MODEL, **kw).input_tokens
    assert counted == total_input(create(client, max_tokens=1, **kw).usage)


@pytest.mark.parametrize("body,field", [
    ({"messages": Q}, "max_tokens"),
    ({"messages": [], "max_tokens": 4}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 4}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 4},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}],
      "max_tokens": 4}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": []}], "max_tokens": 4}, "messages[0]"),
    ({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}], "max_tokens": 4},
     "messages[0]"),
    ({"messages": Q, "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}],
      "max_tokens": 4}, "messages[2].content[0].is_error"),
    ({"messages": Q, "max_tokens": 4, "temperature": 5}, "temperature"),
    ({"messages": Q, "max_tokens": 4, "temperature": 1.5}, "temperature"),   # Anthropic's range is [0, 1]
    ({"messages": Q, "max_tokens": 4, "top_k": -1}, "top_k"),
    ({"messages": Q, "max_tokens": 4, "stop_sequences": [""]}, "stop_sequences"),
    ({"messages": Q, "max_tokens": 4, "stop_sequences": "Paris"}, "stop_sequences"),
    ({"messages": Q, "max_tokens": 4, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"messages": Q, "max_tokens": 4, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    # (the message said 'parameters', chat's name)
    ({"messages": Q, "max_tokens": 4, "tools": [{"name": "f", "input_schema": {"type": 3}}]}, "'input_schema' must be"),
    ({"messages": Q, "max_tokens": 4, "tools": TOOLS, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"messages": Q, "max_tokens": 4, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"messages": Q, "max_tokens": 4, "thinking": {"type": "sometimes"}}, "thinking.type"),
    # Anthropic's budget: required with 'enabled', >= 1 and < max_tokens (any positive one was taken)
    ({"messages": Q, "max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"messages": Q, "max_tokens": 4, "thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens"),
    ({"messages": Q, "max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}},
     "thinking.budget_tokens"),
    ({"messages": Q, "max_tokens": 4, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    # an empty text block, which Anthropic refuses (it was taken)
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}], "max_tokens": 4},
     "'messages[0].content[0].text': text content blocks must be non-empty"),
    # (the message said chat's "a string or an array": Anthropic's field takes an array only)
    ({"messages": Q, "max_tokens": 4, "stop_sequences": ["x"] * 33}, "'stop_sequences' must be an array of at most 32"),
    ({"messages": Q, "max_tokens": 4, "container": "x"}, "container"),
    ({"messages": Q, "max_tokens": 9000}, "max_tokens"),
    ({"messages": Q, "max_tokens": 4, "output_config": {"format": {"type": "xml"}}}, "output_config.format.type"),
    ({"messages": Q, "max_tokens": 4, "output_config": {"effort": "huge"}}, "output_config.effort"),
    ({"messages": Q, "max_tokens": 4, "system": 5}, "system"),
    ({"messages": Q, "max_tokens": 4, "system": [{"type": "image", "text": "x"}]}, "system[0].type"),   # was a 200
    ({"messages": Q, "max_tokens": 4, "output_config": {"format": {"type": "json_schema", "schema": 3}}},
     "output_config.format.schema"),
])
def test_bad_requests_have_anthropic_error_bodies(server, body, field):
    status, resp, _ = request(server, "POST", "/v1/messages", dict({"model": MODEL}, **body))
    assert status == 400, resp
    assert resp["type"] == "error" and resp["error"]["type"] == "invalid_request_error"
    assert field in resp["error"]["message"], resp


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


CALLED = [{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]}]


@pytest.mark.parametrize("turns,where", [
    ([{"role": "user", "content": [{"type": "text", "text": "What is this?"}, IMAGE]}], "messages[0].content[1]"),
    (CALLED + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}]}],
     "messages[2].content[0].content[0]"),
])
def test_image_blocks_say_the_model_is_text_only(client, turns, where):
    import anthropic

    with pytest.raises(anthropic.BadRequestError) as e:
        create(client, messages=turns)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    message = e.value.body["error"]["message"]
    assert where in message and "text only" in message, message


def test_client_errors(client):
    import anthropic

    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", messages=Q, max_tokens=4)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, messages=[{"role": "user", "content": "x" * 40000}], max_tokens=4)

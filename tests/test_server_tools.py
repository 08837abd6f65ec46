"""Tools through the server: tool_choice none/auto/required/named, a full round trip
(request -> tool_calls -> tool result -> answer), and tool-call deltas when streaming.

What is guaranteed vs what the model did: SmolLM2-135M's chat template ignores `tools`, so the
server renders them Hermes-style itself; the tiny model rarely follows that by itself ("auto"
is only checked for a well-formed answer). For a named function or "required", the server
prefills the assistant turn with '<tool_call>\\n{"name": "<fn>", "arguments": ' (for "required"
with several functions it first picks the one the model finds most likely), so a call to a
listed function is guaranteed, and its arguments follow the function's parameters schema (the
structured-output engine constrains them).
"""
import json
import re

import openai
import pytest

from tests.test_server_harness import MODEL, client, metric, metrics, request, server  # noqa: F401

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current local time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def create(client, **kw):
    return client.chat.completions.create(model=MODEL, **{"messages": ASK, "tools": TOOLS, "max_tokens": 24,
                                                           "temperature": 0, **kw})


def test_named_tool_choice_round_trip(client):
    r = create(client, tool_choice=NAMED)
    c = r.choices[0]
    # a call of the function tool_choice names ends with "stop", as OpenAI's and vLLM's do
    assert c.finish_reason in ("stop", "length") and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert isinstance(call.function.arguments, str) and call.function.arguments
    print("model's arguments:", call.function.arguments)
    if c.finish_reason == "stop":  # not cut by max_tokens: the object the parameters' schema allows
        assert isinstance(json.loads(call.function.arguments)["city"], str)
    follow = ASK + [c.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18, "sky": "sunny"})}]
    answer = create(client, messages=follow, tool_choice="none", max_tokens=24)
    a = answer.choices[0]
    assert not a.message.tool_calls and a.message.content and a.finish_reason in ("stop", "length")
    print("model's answer:", a.message.content)
    plain = create(client, tool_choice="none", max_tokens=1).usage.prompt_tokens
    assert answer.usage.prompt_tokens > plain + 10  # the call and its result were rendered into the prompt


def test_named_tool_call_streams_as_deltas(client):
    r = create(client, tool_choice=NAMED).choices[0]
    whole, whole_reason = r.message.tool_calls[0], r.finish_reason
    chunks = list(create(client, tool_choice=NAMED, stream=True))
    deltas = [tc for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls
              for tc in ch.choices[0].delta.tool_calls]
    assert deltas[0].id and deltas[0].function.name == "get_weather" and deltas[0].index == 0
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    assert len(deltas) > 2  # arguments arrive in pieces
    assert "".join(d.function.arguments or "" for d in deltas) == whole.function.arguments
    assert chunks[-1].choices[0].finish_reason == whole_reason


def test_forced_call_cut_by_a_stop_string_is_not_a_finished_call(client):
    """A stop string inside a forced call's arguments (here the key its schema requires) cuts them short:
    finish_reason is "stop" with that string as stop_reason, whole and streamed, named and "required"; it
    was "tool_calls", telling the client to run a call whose arguments are not JSON."""
    for choice in (NAMED, "required"):
        c = create(client, tool_choice=choice, stop=["city"]).choices[0]
        (call,) = c.message.tool_calls
        assert (c.finish_reason, c.model_extra["stop_reason"]) == ("stop", "city")
        with pytest.raises(ValueError):
            json.loads(call.function.arguments)
        chunks = list(create(client, tool_choice=choice, stop=["city"], stream=True))
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert "".join(d.function.arguments or "" for ch in chunks
                       for d in ch.choices[0].delta.tool_calls or []) == call.function.arguments


def finished(m) -> float:
    return sum(v for (name, _), v in m.items() if name == "pocketcupy_request_finished_total")


def test_required_picks_a_listed_function(client, server):
    m0 = metrics(server)
    r = create(client, tool_choice="required")
    m1 = metrics(server)
    # the metrics count the request once, as its usage says (not the prompts that scored the names)
    assert metric(m1, "pocketcupy_prompt_tokens_total") - metric(m0, "pocketcupy_prompt_tokens_total") == \
        r.usage.prompt_tokens
    assert metric(m1, "pocketcupy_generation_tokens_total") - metric(m0, "pocketcupy_generation_tokens_total") == \
        r.usage.completion_tokens
    assert finished(m1) - finished(m0) == 1
    assert metric(m1, "pocketcupy_e2e_request_latency_seconds_count") == \
        metric(m0, "pocketcupy_e2e_request_latency_seconds_count") + 1
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name in {"get_weather", "get_time"} and r.choices[0].finish_reason in ("tool_calls", "length")
    print("required ->", call.function.name, call.function.arguments)
    if r.choices[0].finish_reason == "tool_calls":
        assert isinstance(json.loads(call.function.arguments)["city"], str)
    # the names scored on a left-truncated prompt (truncate_prompt_tokens)
    t = create(client, tool_choice="required", extra_body={"truncate_prompt_tokens": r.usage.prompt_tokens - 40})
    assert t.choices[0].message.tool_calls[0].function.name in {"get_weather", "get_time"}
    assert t.usage.prompt_tokens < r.usage.prompt_tokens


def test_auto_and_none(client):
    r = create(client, tool_choice="auto")
    m = r.choices[0].message
    # the model decides; either way the answer is well formed
    assert m.content or m.tool_calls
    for call in m.tool_calls or []:
        assert call.function.name in {"get_weather", "get_time"}
    print("auto ->", m.content, m.tool_calls)
    r = create(client, tool_choice="none")
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content
    # "none" without tools is what no tools mean anyway: taken, as vLLM takes it (it was a 400); not the others
    plain = create(client, tools=openai.omit)
    assert create(client, tools=openai.omit, tool_choice="none").choices[0].message == plain.choices[0].message
    with pytest.raises(openai.BadRequestError) as e:
        create(client, tools=openai.omit, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"


def prompt_sizes(server, tool_choice) -> list[int]:
    """The prompt's tokens of one question with TOOLS under tool_choice ("auto", "none" or None: no
    tools) on the chat, Responses and Anthropic routes (Anthropic's count_tokens generates nothing)."""
    chat = {"model": MODEL, "messages": ASK, "max_tokens": 1}
    resp = {"model": MODEL, "input": ASK[0]["content"], "max_output_tokens": 1}
    msgs = {"model": MODEL, "messages": ASK}
    if tool_choice is not None:
        chat.update(tools=TOOLS, tool_choice=tool_choice)
        resp.update(tools=[dict(t["function"], type="function") for t in TOOLS], tool_choice=tool_choice)
        msgs.update(tools=[{"name": t["function"]["name"], "description": t["function"]["description"],
                            "input_schema": t["function"]["parameters"]} for t in TOOLS],
                    tool_choice={"type": tool_choice})
    replies = [request(server, "POST", path, body)
               for path, body in [("/v1/chat/completions", chat), ("/v1/responses", resp),
                                  ("/v1/messages/count_tokens", msgs)]]
    assert all(status == 200 for status, _, _ in replies), replies
    (_, c, _), (_, r, _), (_, m, _) = replies
    return [c["usage"]["prompt_tokens"], r["usage"]["input_tokens"], m["input_tokens"]]


def test_none_keeps_the_tools_in_the_prompt(client, server):
    """tool_choice "none" renders the tools as "auto" does, as OpenAI and vLLM keep them (they were left
    out of the prompt), on the chat, Responses and Anthropic routes; the reply is content, no call."""
    bare, auto, none = (prompt_sizes(server, c) for c in (None, "auto", "none"))
    assert none == auto and all(n > b + 50 for n, b in zip(none, bare)), (bare, auto, none)
    m = create(client, tool_choice="none", max_tokens=4).choices[0].message
    assert m.content and not m.tool_calls


def test_parallel_tool_calls_false_and_n(server):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": NAMED, "max_tokens": 24, "n": 2,
            "temperature": 0, "parallel_tool_calls": False}
    status, resp, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and len(resp["choices"]) == 2
    for c in resp["choices"]:
        assert len(c["message"]["tool_calls"]) == 1 and c["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_forced_arguments_follow_the_schema(client, server):
    """Sampled (n=3, temperature 1) forced calls: every choice's arguments are an object the schema
    allows (a short string and a boolean, only the listed keys: at most ~40 tokens); a function
    without parameters gets {}; a schema the structured-output engine refuses is a 400 naming it."""
    strict = [{"type": "function", "function": {
        "name": "forecast", "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "metric"],
                                           "properties": {"city": {"type": "string", "maxLength": 16},
                                                          "metric": {"type": "boolean"}}}}},
              {"type": "function", "function": {"name": "ping"}}]
    r = create(client, tools=strict, tool_choice={"type": "function", "function": {"name": "forecast"}}, n=3,
               temperature=1.0, max_tokens=64)
    for c in r.choices:
        assert c.finish_reason == "stop" and c.model_extra["stop_reason"] is None
        args = json.loads(c.message.tool_calls[0].function.arguments)
        assert set(args) == {"city", "metric"} and len(args["city"]) <= 16 and isinstance(args["metric"], bool)
    r = create(client, tools=strict, tool_choice={"type": "function", "function": {"name": "ping"}})
    assert r.choices[0].message.tool_calls[0].function.arguments == "{}"
    body = {"model": MODEL, "messages": ASK, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objectx"}}}]}
    status, resp, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 400 and resp["error"]["param"] == "tools[0].function.parameters"


STRICT_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                 "required": ["city", "unit"], "additionalProperties": False}
STRICT_WEATHER = {"name": "get_weather", "description": "Current weather in a city", "parameters": STRICT_PARAMS}


def shown_calls() -> list[dict]:
    """A conversation that shows the model two calls of get_weather with a city alone (SmolLM2 then
    calls it by itself for London, as shown), and asks for London's weather."""
    shots = []
    for i, city in enumerate(("Rome", "Paris")):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "get_weather",
                                                                "arguments": json.dumps({"city": city})}}
        shots += [{"role": "user", "content": f"What is the weather like in {city}?"},
                  {"role": "assistant", "content": None, "tool_calls": [call]}]
    return shots + [{"role": "user", "content": "What is the weather like in London?"}]


def strict_call(client, messages, **kw) -> dict:
    """The arguments of the one call the model makes under "auto" to a strict get_weather, checked
    against its schema (OpenAI's guarantee); kw: more of the request."""
    choice = client.chat.completions.create(**{
        "model": MODEL, "messages": messages, "tool_choice": "auto", "max_tokens": 40, "temperature": 0,
        "tools": [{"type": "function", "function": dict(STRICT_WEATHER, strict=True)}], **kw}).choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit") and len(args["city"]) <= 16
    return args


def test_strict_function_under_auto(client, server):
    """tool_choice "auto" with a strict function (OpenAI: its arguments follow the schema): the model
    decides whether to call (shown two calls, SmolLM2 calls by itself), and its call's arguments are
    constrained from the <tool_call> marker on (not strict, it wrote {"city": "London"}: no "unit").
    A strict schema the structured-output engine refuses is a 400 naming it."""
    strict_call(client, shown_calls())
    body = {"model": MODEL, "messages": ASK, "tool_choice": "auto", "tools": [
        {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 1e300}}}}}]}
    status, resp, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 400 and resp["error"]["param"] == "tools[0].function.parameters", resp


def test_tool_strict_must_be_a_boolean(client):
    """OpenAI's function.strict is a boolean (or null); a string was taken silently (200)."""
    bad = [{"type": "function", "function": {"name": "f", "strict": "yes", "parameters": {"type": "object"}}}]
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as e:
            create(client, tools=bad, tool_choice=choice, max_tokens=4)
        assert e.value.body["param"] == "tools[0].function.strict"
    ok = [{"type": "function", "function": {"name": "f", "strict": None, "parameters": {"type": "object"}}},
          {"type": "function", "function": {"name": "g", "strict": True, "parameters": {"type": "object"}}}]
    assert create(client, tools=ok, tool_choice="auto", max_tokens=4).choices[0].finish_reason


def test_qwen_xml_calls_with_typed_arguments(client):
    """Qwen3.5's (and Qwen3-Coder's) XML form inside <tool_call>, written here under a regex
    constraint: the call comes back with its values typed by the function's schema, whole and
    streamed."""
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    xml = ("<tool_call>\n<function=forecast>\n<parameter=city>\n[A-Z][a-z]{2,9}\n</parameter>\n"
           "<parameter=days>\n[1-9]\n</parameter>\n</function>\n</tool_call>")
    kw = dict(tools=tools, max_tokens=60, extra_body={"structured_outputs": {"regex": xml}})
    c = create(client, **kw).choices[0]
    (call,) = c.message.tool_calls
    args = json.loads(call.function.arguments)
    assert c.finish_reason == "tool_calls" and call.function.name == "forecast" and c.message.content is None
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 9 and args["city"].isalpha()
    chunks = list(create(client, stream=True, **kw))
    streamed = "".join(d.function.arguments or "" for ch in chunks if ch.choices
                       for d in ch.choices[0].delta.tool_calls or [])
    assert streamed == call.function.arguments


def test_parallel_tool_calls_false_ends_at_the_first_call(client):
    """parallel_tool_calls false: the reply ends with its first call, as a model under OpenAI's API
    makes one call and stops ("tool_calls", the tokens so far, nothing after it streamed); it generated
    on through calls it then dropped, here to max_tokens ("length", which the client's parse() refuses)."""
    two = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>')
    kw = dict(tool_choice="auto", max_tokens=40, parallel_tool_calls=False,
              extra_body={"structured_outputs": {"regex": re.escape(two)}})
    whole = create(client, **kw)
    c = whole.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None and whole.usage.completion_tokens < 40
    assert [(t.function.name, t.function.arguments) for t in c.message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')]
    chunks = list(create(client, stream=True, **kw))
    deltas = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas] == ["get_weather"] and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(ch.choices[0].delta.content for ch in chunks)
    r = client.responses.create(model=MODEL, input=ASK[0]["content"], max_output_tokens=40, parallel_tool_calls=False,
                                tools=[dict(type="function", **t["function"]) for t in TOOLS],
                                extra_body={"structured_outputs": {"regex": re.escape(two)}})
    assert r.status == "completed" and [o.name for o in r.output] == ["get_weather"]


def test_forced_arguments_are_an_object_when_the_schema_names_no_type(client):
    """parameters without "type" (JSON Schema then allows any value): a forced call's arguments are still
    an object; they were a number or a string (sampled here)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"city": {"type": "string"}}}}}]
    r = create(client, tools=tools, tool_choice="required", max_tokens=12, temperature=1.0, n=4, seed=1)
    assert all(c.message.tool_calls[0].function.arguments.startswith("{") for c in r.choices), r.choices


def test_response_format_with_auto_tools_is_content_in_the_format(client):
    """response_format with tools under "auto" constrains the whole reply, as vLLM does: well-formed
    content in the format (the model cannot write <tool_call>), whole and streamed."""
    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
            "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "city", "schema": city}}
    c = create(client, tool_choice="auto", response_format=rf, max_tokens=12).choices[0]
    assert c.finish_reason == "stop" and not c.message.tool_calls, c
    assert json.loads(c.message.content)["city"] in ("Paris", "Rome")
    chunks = [ch.choices[0] for ch in create(client, tool_choice="auto", response_format=rf, max_tokens=12,
                                             stream=True) if ch.choices]
    assert "".join(ch.delta.content or "" for ch in chunks) == c.message.content
    assert not any(ch.delta.tool_calls for ch in chunks) and chunks[-1].finish_reason == "stop"

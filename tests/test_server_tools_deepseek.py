"""DeepSeek-V3-style tool calls through a real server: SmolLM2 served with `--chat-template` set to
DeepSeek-V3.1's template (tests/fixtures/chat_templates). SmolLM2 does not call tools by itself, so
a regex constraint (structured output) makes it write DeepSeek's call block (in SmolLM2 the
markers are plain text, not special tokens). The calls come back as tool_calls, whole and
streamed; the conversation with them and the tool results, sent back as a client does, renders
through the template, which joins each call's arguments to strings; a forced call is prefilled in
DeepSeek's form."""
import json
import os
import re

import pytest

from pocketcupy.server.tools_deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from tests.test_server_harness import MODEL, ROOT, openai_client, request, serving
from tests.test_server_tools import ASK, TOOLS

TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "deepseek-v3.1.jinja")
CITY = '\\{"city": "[A-Z][a-z]{2,9}"\\}'
CALLS = (CALLS_BEGIN + CALL_BEGIN + "get_weather" + SEP + CITY + CALL_END
         + CALL_BEGIN + "get_time" + SEP + CITY + CALL_END + CALLS_END)


@pytest.fixture(scope="module")
def deepseek(smollm2_gguf):
    yield from serving(smollm2_gguf, "--chat-template", TEMPLATE)


@pytest.fixture(scope="module")
def ds_client(deepseek):
    return openai_client(deepseek)


def create(client, **kw):
    return client.chat.completions.create(**{
        "model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 200, "temperature": 0,
        "extra_body": {"structured_outputs": {"regex": CALLS}}, **kw})


def test_calls_the_round_trip_and_the_stream(ds_client):
    r = create(ds_client)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert [t.function.name for t in c.message.tool_calls] == ["get_weather", "get_time"]
    for t in c.message.tool_calls:
        assert re.fullmatch(r"[A-Z][a-z]{2,9}", json.loads(t.function.arguments)["city"])
    follow = ASK + [c.message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": t.id, "content": json.dumps({"temp_c": 18})} for t in c.message.tool_calls]
    answer = ds_client.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=8,
                                               temperature=0)
    assert answer.usage.prompt_tokens > r.usage.prompt_tokens + 20  # the calls and the results were rendered
    chunks = list(create(ds_client, stream=True))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ""
    for i, t in enumerate(c.message.tool_calls):
        assert "".join(d.function.arguments or "" for d in deltas if d.index == i) == t.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_forced_call_is_prefilled_in_deepseek_form(ds_client, deepseek):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = ds_client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named,
                                          max_tokens=24, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith("{")
    if r.choices[0].finish_reason != "length":   # (not cut by max_tokens)
        assert "city" in json.loads(call.function.arguments)
    _, tok, _ = request(deepseek, "POST", "/tokenize", {"messages": ASK, "tools": TOOLS})
    _, text, _ = request(deepseek, "POST", "/detokenize", {"tokens": tok["tokens"]})
    assert text["prompt"].endswith("<｜Assistant｜></think>")
    for prefill, same in ((CALLS_BEGIN + CALL_BEGIN + "get_weather" + SEP, True),
                          ('<tool_call>\n{"name": "get_weather", "arguments": ', False)):
        _, count, _ = request(deepseek, "POST", "/tokenize", {"prompt": text["prompt"] + prefill,
                                                              "add_special_tokens": False})
        assert (count["count"] == r.usage.prompt_tokens) == same

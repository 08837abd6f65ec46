"""DeepSeek-V3's and Qwen3.5's (XML) tool-call forms without a model: parsed whole and streamed in
pieces of every size; what the server prefills for a forced call; DeepSeek-V3.1's real template
(tests/fixtures/chat_templates) rendering a conversation with tool calls, whose arguments it joins
to strings while Hugging Face templates iterate them."""
import json
import os

import jinja2
import pytest
from jinja2.sandbox import SandboxedEnvironment

from pocketcupy.server.tool_prompt import ToolStyle, for_template, parse_messages, tool_style
from pocketcupy.server.tools import ToolParser, collect, forced_prefill
from pocketcupy.server.tools_deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from pocketcupy.server.tools_xml import parse_xml_call

from tests.test_server_units import pieces, streamed

NAMES = ["get_weather", "get_time"]
TEMPLATE = os.path.join(os.path.dirname(__file__), "fixtures", "chat_templates", "deepseek-v3.1.jinja")


def ds(*calls, v3=False):
    def one(name, args):
        return (f"{CALL_BEGIN}function{SEP}{name}\n```json\n{args}\n```{CALL_END}" if v3
                else f"{CALL_BEGIN}{name}{SEP}{args}{CALL_END}")
    return CALLS_BEGIN + "".join(one(*c) for c in calls) + CALLS_END


DEEPSEEK_CASES = [
    (ds(("get_weather", '{"city": "Paris"}')), (None, [("get_weather", '{"city": "Paris"}')])),
    ("Let me look." + ds(("get_time", "{}"), ("get_weather", '{"city": "Rome"}')),
     ("Let me look.", [("get_time", "{}"), ("get_weather", '{"city": "Rome"}')])),
    (ds(("get_weather", '{"city": "Lima"}'), v3=True), (None, [("get_weather", '{"city": "Lima"}')])),
    (ds(("get_time", '{"city": "Oslo"}'), v3=True) + "\nDone.", ("\nDone.", [("get_time", '{"city": "Oslo"}')])),
    (ds(("launch_rockets", "{}")), (ds(("launch_rockets", "{}")), [])),          # not a listed function
    (ds(("get_time", '{"city": ')), (ds(("get_time", '{"city": ')), [])),        # malformed arguments
    (CALLS_BEGIN + CALL_BEGIN + "get_time" + SEP + "{}" + CALL_END,              # cut before the block's end
     (None, [("get_time", "{}")])),
    (CALLS_BEGIN + CALL_BEGIN + "get_time" + SEP + '{"ci', (CALLS_BEGIN + CALL_BEGIN + "get_time" + SEP + '{"ci', [])),
]

XML = "<tool_call>\n<function={}>\n{}</function>\n</tool_call>"
SCHEMAS = {"get_weather": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "ratio": {"type": "number"}, "hours": {"type": "array"}, "where": {"type": ["object", "null"]}}},
    "get_time": {}}


def param(k, v):
    return f"<parameter={k}>\n{v}\n</parameter>\n"


XML_CASES = [
    (XML.format("get_weather", param("city", "New York") + param("days", "3") + param("metric", "True")
                + param("ratio", "0.5") + param("hours", "[1, 2]") + param("where", "null")),
     (None, [("get_weather", json.dumps({"city": "New York", "days": 3, "metric": True, "ratio": 0.5,
                                         "hours": [1, 2], "where": None}))])),
    ("Checking.\n" + XML.format("get_weather", param("city", "123") + param("days", "three") + param("note", "x\ny")),
     ("Checking.\n", [("get_weather", json.dumps({"city": "123", "days": "three", "note": "x\ny"}))])),
    (XML.format("get_time", ""), (None, [("get_time", "{}")])),
    (XML.format("launch_rockets", ""), (XML.format("launch_rockets", ""), [])),
    (XML.format("get_time", "stray text" + param("city", "Oslo")),
     (XML.format("get_time", "stray text" + param("city", "Oslo")), [])),
]


@pytest.mark.parametrize("text,expected", DEEPSEEK_CASES + XML_CASES)
def test_parsed_whole_and_streamed(text, expected):
    assert collect(ToolParser(NAMES, schemas=SCHEMAS), text) == expected
    for step in (1, 2, 3, 5, 11):
        assert streamed(ToolParser(NAMES, schemas=SCHEMAS), pieces(text, step)) == expected


def test_xml_values_without_a_schema_stay_text():
    assert parse_xml_call(f"<function=get_time>\n{param('n', '5')}</function>", {"get_time": {}}) == \
        ("get_time", '{"n": "5"}')


class _Tok:
    """The tokenizer's part in tool_style: a template, and no hidden marker tokens (as SmolLM2)."""

    def __init__(self, template):
        self.template = template

    def chat_template_for(self, tools):
        return self.template

    def hidden_token_ids(self, texts):
        return []


def test_forced_prefill_in_deepseek_forms():
    v31 = open(TEMPLATE, encoding="utf-8").read()
    style = tool_style(_Tok(v31), [{}])
    assert forced_prefill("get_weather", style.forced) == CALLS_BEGIN + CALL_BEGIN + "get_weather" + SEP
    v3 = v31.replace("+ '<｜tool▁sep｜>' + tool['function']['arguments']",
                     "+ '<｜tool▁sep｜>' + '\\n```json\\n' + tool['function']['arguments'] + '\\n```'")
    assert forced_prefill("get_weather", tool_style(_Tok(v3), [{}]).forced) == \
        CALLS_BEGIN + CALL_BEGIN + "function" + SEP + "get_weather\n```json\n"
    assert tool_style(_Tok("{{ messages }}"), [{}]) == ToolStyle()


def test_deepseek_template_renders_the_round_trip():
    """The V3.1 template joins each call's arguments to strings: they reach it as the client's JSON
    text, and as the object other templates iterate."""
    msgs = parse_messages([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call-2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call-1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call-2", "content": "14:05"},
    ])
    msgs, _ = for_template(msgs, [{}], native=True)
    text = jinja2.Environment().from_string(open(TEMPLATE, encoding="utf-8").read()).render(
        messages=msgs, bos_token="<s>", add_generation_prompt=True)
    assert ds(("get_weather", '{"city": "Paris"}'), ("get_time", "{}")) in text
    assert text.endswith("<｜tool▁output▁begin｜>14:05<｜tool▁output▁end｜>")
    args = msgs[1]["tool_calls"][0]["function"]["arguments"]
    hf = jinja2.Environment().from_string("{% for k, v in a|items %}{{ k }}={{ v }}{% endfor %} {{ a|tojson }}")
    assert hf.render(a=args) == 'city=Paris {"city": "Paris"}' and dict(args) == {"city": "Paris"}
    named, _ = for_template(parse_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "say", "arguments": '{"text": "hi"}'}}]}]), [{}], True)
    assert SandboxedEnvironment().from_string("{{ a.text }}").render(
        a=named[0]["tool_calls"][0]["function"]["arguments"]) == "hi"

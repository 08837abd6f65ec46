"""Mistral-style tool calls without a model: the parser on both forms (whole texts, every split into
two deltas, one character at a time), the 9-character ids Mistral's template insists on (its real
Jinja text, tests/fixtures/chat_templates), the forced-call prefill, and the [TOOL_CALLS] token
kept in the text of tool requests."""
import os
import re
from types import SimpleNamespace

import pytest

from pocketcupy.server.chat import parse_chat, render_messages
from pocketcupy.server.protocol import ApiError
from pocketcupy.server.state import ServerConfig
from pocketcupy.server.tool_prompt import ToolStyle, parse_messages, parse_tools, tool_style
from pocketcupy.server.tools import HERMES_FORCED, ForcedCallParser, ToolParser, collect, forced_prefill
from pocketcupy.server.tools_mistral import forced_form
from pocketcupy.tokenizer import IncrementalDetokenizer

from .test_server_units import NAMES, TOOLS, _template_engine, streamed

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "chat_templates",
                       "mistral-7b-instruct-v0.3.jinja")
with open(FIXTURE, encoding="utf-8") as _f:
    MISTRAL_V03 = _f.read()
# the v11 form (Mistral-Small-3.2, Magistral): one marker a call, the arguments after [ARGS]
V11_TEMPLATE = ("{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}[TOOL_CALLS]"
                "{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}{% else %}"
                "{{ m.content }}{% endif %}{% endfor %}")
HERMES_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                   "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
                   "<|im_end|>{% endfor %}{{ tools | length }}")
TEMPLATE_FIELDS = {"add_generation_prompt": True, "chat_template_kwargs": None, "continue_final_message": False}
MARKER_TOKENS = {"tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a", "[INST]", "[TOOL_CALLS]", "[ARGS]"],
                 "tokenizer.ggml.token_type": [2, 3, 3, 1, 3, 3, 3]}

CASES = [
    # v3 (Mistral-7B-Instruct-v0.3): a JSON array after the marker and a space
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
     (None, [("get_weather", '{"city": "Paris"}')])),
    # Nemo: no space, an "id" in each object, several calls
    ('[TOOL_CALLS][{"name": "get_time", "arguments": {}, "id": "a1B2c3D4e"}, '
     '{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "Zz9Yy8Xx7"}]',
     (None, [("get_time", "{}"), ("get_weather", '{"city": "Rome"}')])),
    ('Let me look.[TOOL_CALLS] [{"name": "get_time", "arguments": {"city": "Oslo"}}]\n',
     ("Let me look.\n", [("get_time", '{"city": "Oslo"}')])),
    ('[TOOL_CALLS] [{"name": "get_time", "arguments": {}}]\nDone.', ("\nDone.", [("get_time", "{}")])),
    # v11 (Mistral-Small-3.2): name[ARGS]{...}, one marker a call; arguments as the model wrote them
    ('[TOOL_CALLS]get_weather[ARGS]{"city":"Lima"}', (None, [("get_weather", '{"city":"Lima"}')])),
    ('I will check both.[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS] {"city": "a]} [TOOL_CALLS]b"}',
     ("I will check both.", [("get_time", "{}"), ("get_weather", '{"city": "a]} [TOOL_CALLS]b"}')])),
    ('[TOOL_CALLS]get_time[CALL_ID]x7Yq2LmN0[ARGS]{"city": "Kyiv"}', (None, [("get_time", '{"city": "Kyiv"}')])),
    ('[TOOL_CALLS]get_weather{"city": "Bern"}', (None, [("get_weather", '{"city": "Bern"}')])),  # [ARGS] dropped
    # not calls of the request's functions: the text stays content as written
    ('[TOOL_CALLS] [{"name": "launch_rockets", "arguments": {}}]',
     ('[TOOL_CALLS] [{"name": "launch_rockets", "arguments": {}}]', [])),
    ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "launch_rockets", "arguments": {}}]',
     ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "launch_rockets", "arguments": {}}]', [])),
    ('[TOOL_CALLS]launch_rockets[ARGS]{"n": 3}[TOOL_CALLS]get_time[ARGS]{}',
     ('[TOOL_CALLS]launch_rockets[ARGS]{"n": 3}', [("get_time", "{}")])),
    ('[TOOL_CALLS]get_time[ARGS]"now"', ('[TOOL_CALLS]get_time[ARGS]"now"', [])),  # arguments not an object
    ('[TOOL_CALLS] [{"name": "get_time", "arguments": {"city": "Os',  # cut off by max_tokens
     ('[TOOL_CALLS] [{"name": "get_time", "arguments": {"city": "Os', [])),
    ('[TOOL_CALLS]get_weather[AR', ('[TOOL_CALLS]get_weather[AR', [])),
    ("[TOOL_CALLS] I cannot call tools.", ("[TOOL_CALLS] I cannot call tools.", [])),
    ("[TOOL_CALLS]", ("[TOOL_CALLS]", [])),
    ("a list [1, 2] and [TOOL_ is no marker", ("a list [1, 2] and [TOOL_ is no marker", [])),
    # Hermes calls still parse beside the Mistral style
    ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>[TOOL_CALLS]get_weather[ARGS]{"city": "X"}',
     (None, [("get_time", "{}"), ("get_weather", '{"city": "X"}')])),
]

def splits(text):
    """The text whole, cut in two at every position, and one character at a time."""
    yield [text]
    for k in range(1, len(text)):
        yield [text[:k], text[k:]]
    yield list(text)


@pytest.mark.parametrize("text,expected", CASES)
def test_whole_and_every_split(text, expected):
    assert collect(ToolParser(NAMES), text) == expected
    for parts in splits(text):
        assert streamed(ToolParser(NAMES), parts) == expected, parts


@pytest.mark.parametrize("text,expected", [c for c in CASES if c[1][1] and "[" not in (c[1][0] or "")])
def test_markers_never_reach_a_delta_of_a_call(text, expected):
    """No delta of content carries a marker, or a start of one held back from an earlier delta."""
    for parts in splits(text):
        p = ToolParser(NAMES)
        events = [e for part in parts for e in p.feed(part)] + p.finish()
        deltas = [e[1] for e in events if e[0] == "content"]
        assert all(deltas) and not any("[" in d for d in deltas), (parts, deltas)
        assert [e[2] for e in events if e[0] == "call"] == [name for name, _ in expected[1]]


def test_calls_are_reported_when_complete():
    p = ToolParser(NAMES)
    assert p.feed("Sure.[TOOL_CALLS]get_ti") == [("content", "Sure.")]
    assert p.feed('me[ARGS]{"city": "Pa') == []
    assert p.feed('ris"}[TOOL_') == [("call", 0, "get_time"), ("args", 0, '{"city": "Paris"}')]
    assert p.feed("CALLS]get_weather[ARGS]{}") == [("call", 1, "get_weather"), ("args", 1, "{}")]
    assert p.finish() == []


def test_no_parallel_keeps_the_first_call():
    for text in ('[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {}}]',
                 "[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{}"):
        assert collect(ToolParser(NAMES, parallel=False), text) == (None, [("get_time", "{}")])


def test_mistral_template_takes_our_ids_back():
    """The server's ids for a Mistral template are 9 alphanumeric characters, which the real v0.3
    template renders back (the assistant's calls, the tool results); the old form is what it refused."""
    engine = _template_engine(MISTRAL_V03)
    style = tool_style(engine.tokenizer, TOOLS)
    assert style.short_ids and style.forced == forced_form(MISTRAL_V03)
    ids = [style.call_id() for _ in range(20)]
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids) and len(set(ids)) == 20

    def conversation(a, b):
        return parse_messages([
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": a, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": b, "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": a, "content": '{"temp_c": 18}'},
            {"role": "tool", "tool_call_id": b, "content": '"14:05"'}])

    text = render_messages(engine, conversation(ids[0], ids[1]), parse_tools(TOOLS), TEMPLATE_FIELDS)
    assert (f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{ids[0]}"}}, '
            f'{{"name": "get_time", "arguments": {{"city": "Paris"}}, "id": "{ids[1]}"}}]</s>') in text
    assert f'[TOOL_RESULTS] {{"content": "14:05", "call_id": "{ids[1]}"}}[/TOOL_RESULTS]' in text
    old = ToolStyle().call_id()
    with pytest.raises(ApiError) as e:
        render_messages(engine, conversation(old, ids[1]), parse_tools(TOOLS), TEMPLATE_FIELDS)
    assert e.value.param == "messages" and "length 9" in e.value.message


@pytest.mark.parametrize("template,short", [
    (HERMES_TEMPLATE, False),        # a template of its own that knows tools
    ("{% for m in messages %}{{ m.content }}{% endfor %}", False),   # the server's Hermes fallback
    ("{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
     "{% if c.id|length != 9 %}{{ raise_exception('bad id') }}{% endif %}{% endfor %}{% endif %}{% endfor %}", True),
])
def test_other_templates_keep_their_ids_and_prefill(template, short):
    style = tool_style(_template_engine(template).tokenizer, TOOLS)
    assert style.forced == HERMES_FORCED and style.markers == () and style.short_ids == short
    assert re.fullmatch(r"[A-Za-z0-9]{9}" if short else r"call-[0-9a-f]{32}", style.call_id())
    assert tool_style(_template_engine(MISTRAL_V03).tokenizer, None) == ToolStyle()  # no tools offered


def test_forced_prefill_in_mistral_form():
    """A forced call is prefilled the way the template writes calls; the model writes the arguments
    and ForcedCallParser takes them, whatever follows (the array's end, the next marker)."""
    v03 = forced_prefill("get_weather", forced_form(MISTRAL_V03))
    assert v03 == '[TOOL_CALLS] [{"name": "get_weather", "arguments": '
    v11 = forced_prefill("get_weather", tool_style(_template_engine(V11_TEMPLATE).tokenizer, TOOLS).forced)
    assert v11 == "[TOOL_CALLS]get_weather[ARGS]"
    assert forced_form("{{ '[TOOL_CALLS][' }}{{ tool_calls }}")[0] == '[TOOL_CALLS][{"name": "'  # Nemo: no space
    for gen in ('{"city": "Paris"}}]', '{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'):
        p = ForcedCallParser("get_weather")
        events = p.feed(gen) + p.finish()
        assert p.done and events == [("call", 0, "get_weather"), ("args", 0, '{"city": "Paris"}')]
    # the model's own tool calls in the whole conversation text read back as calls
    engine = _template_engine(V11_TEMPLATE)
    msgs = parse_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}]}])
    text = render_messages(engine, msgs, parse_tools(TOOLS), TEMPLATE_FIELDS)
    assert collect(ToolParser(NAMES), text) == (None, [("get_time", '{"city": "Oslo"}')])


def test_tool_requests_keep_the_marker_tokens():
    """A tokenizer with Mistral's marker tokens (control tokens, dropped by skip_special_tokens):
    a chat request with tools keeps those, and only those, in its text; without tools, or with
    tool_choice none, nothing changes."""
    engine = _template_engine(MISTRAL_V03, **MARKER_TOKENS)
    tok = engine.tokenizer
    state = SimpleNamespace(engine=engine, config=ServerConfig(served_model_names=["m"]))
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}], "tools": TOOLS}
    req = parse_chat(state, body)
    marks = tok.encode("[TOOL_CALLS][ARGS]", add_special_tokens=False)
    assert req.params.preserved_token_ids == marks == [5, 6] and req.style.short_ids
    assert req.params.skip_special_tokens
    for other in ({"tool_choice": "none"}, {"tools": None}):
        assert parse_chat(state, {**body, **other}).params.preserved_token_ids == []
    out = [4, 5, 3, 6, 2]   # [INST] [TOOL_CALLS] ▁a [ARGS] </s>
    detok = IncrementalDetokenizer(tok, [1], req.params.skip_special_tokens, req.params.preserved_token_ids)
    assert "".join(detok.push(t) for t in out) == "[TOOL_CALLS] a[ARGS]"
    assert tok.decode(out, skip_special_tokens=True) == "a"
    # a tokenizer without them (its template alone is Mistral's): the same ids, nothing to keep
    plain = parse_chat(SimpleNamespace(engine=_template_engine(MISTRAL_V03), config=state.config), body)
    assert plain.params.preserved_token_ids == [] and plain.style.short_ids

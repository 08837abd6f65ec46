"""Server pieces that need no model: tool-call parsing (whole and streamed), tool prompts, field
validation and error bodies."""
import json

import pytest

from pocketcupy.server.chat import parse_template_fields, render_messages
from pocketcupy.server.protocol import ApiError, Fields, check_context, parse_common
from pocketcupy.server.tool_prompt import for_template, parse_messages, parse_tool_choice, parse_tools
from pocketcupy.server.tools import ForcedCallParser, ToolParser, collect, forced_prefill

NAMES = ["get_weather", "get_time"]
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in NAMES]


def pieces(text, step):
    return [text[k:k + step] for k in range(0, len(text), step)]


def streamed(parser, parts):
    """Feed the deltas `parts`; aggregate like collect()."""
    events = []
    for part in parts:
        events += parser.feed(part)
    events += parser.finish()
    content, calls = "".join(e[1] for e in events if e[0] == "content"), []
    for e in events:
        if e[0] == "call":
            calls.append([e[2], ""])
        elif e[0] == "args":
            calls[e[1]][1] += e[2]
    return (None if calls and not content.strip() else content), [tuple(c) for c in calls]


CASES = [
    ("Hello there.", ("Hello there.", [])),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     (None, [("get_weather", '{"city": "Paris"}')])),
    ('Let me check.\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
     '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',
     ("Let me check.\n\n", [("get_time", "{}"), ("get_weather", '{"city": "Rome"}')])),
    ('<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>',  # not one of the tools: content
     ('<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>', [])),
    ('<tool_call>{"name": "get_time", "arguments": {"city": </tool_call>',  # malformed JSON: content
     ('<tool_call>{"name": "get_time", "arguments": {"city": </tool_call>', [])),
    ('<tool_call>{"name": "get_time", "arguments": {"city": "Oslo"}}', (None, [("get_time", '{"city": "Oslo"}')])),
    ('{"name": "get_weather", "parameters": {"city": "Lima"}}', (None, [("get_weather", '{"city": "Lima"}')])),
    ('<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "X"}}',
     (None, [("get_time", "{}"), ("get_weather", '{"city": "X"}')])),
    ('{"answer": 42}', ('{"answer": 42}', [])),
    ("a < b and <tool_ is not a tag", ("a < b and <tool_ is not a tag", [])),
    ("  \n", ("  \n", [])),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_tool_parser_whole_and_streamed(text, expected):
    assert collect(ToolParser(NAMES), text) == expected
    for step in (1, 2, 3, 7):
        assert streamed(ToolParser(NAMES), pieces(text, step)) == expected


def test_tool_parser_no_parallel_keeps_first():
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_weather", ' \
           '"arguments": {}}</tool_call>'
    assert collect(ToolParser(NAMES, parallel=False), text) == (None, [("get_time", "{}")])


@pytest.mark.parametrize("gen,args", [
    ('{"city": "Paris"}}\n</tool_call>', '{"city": "Paris"}'),
    (' {"city": {"name": "a}b"}} trailing', '{"city": {"name": "a}b"}}'),
    ('not json at all', 'not json at all'),     # OpenAI: arguments may be invalid JSON
    ('{"city": "Par', '{"city": "Par'),          # cut off by max_tokens
])
def test_forced_call_parser(gen, args):
    for step in (1, 4, 100):
        assert streamed(ForcedCallParser("get_weather"), pieces(gen, step)) == (None, [("get_weather", args)])
    p = ForcedCallParser("get_weather")
    p.feed(gen)
    assert p.done == (args != gen or args.endswith("}"))
    assert forced_prefill("get_weather").endswith('"arguments": ')


def test_tool_prompt_fallback_renders_hermes():
    msgs = parse_messages([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"}])
    out, tools = for_template(msgs, parse_tools(TOOLS), native=False)
    assert tools is None and [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.") and "<tools>" in out[0]["content"]
    assert json.dumps(TOOLS[0]) in out[0]["content"]
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert out[3]["content"] == "<tool_response>\n18C, sunny\n</tool_response>"
    native, tools = for_template(msgs, TOOLS, native=True)
    assert tools == TOOLS and native[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def _template_engine(chat_template: str, **meta):
    """Just enough of an Engine for render_messages and parse_chat: a tokenizer with these templates,
    and no sampling defaults of its own."""
    from types import SimpleNamespace

    from pocketcupy.engine import Engine
    from pocketcupy.tokenizer import Tokenizer
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a"],
            "tokenizer.ggml.token_type": [2, 3, 3, 1], "tokenizer.chat_template": chat_template, **meta}
    engine = SimpleNamespace(tokenizer=Tokenizer.from_gguf_metadata(meta), default_sampling={})
    engine.render_chat = lambda *a, **k: Engine.render_chat(engine, *a, **k)
    return engine


def test_fields_reach_a_template_without_tools():
    """A template that knows no tools (the server writes them in Hermes' form) still gets the messages'
    other fields, as vLLM passes them: `name`, and the reasoning sent back (they were dropped)."""
    engine = _template_engine("{% for m in messages %}{{ m.role }}/{{ m.name }}/{{ m.reasoning_content }}:"
                              "{{ m.content }}|{% endfor %}")
    template = {"add_generation_prompt": False, "chat_template_kwargs": None, "continue_final_message": False}
    msgs = parse_messages([{"role": "system", "content": "s", "name": "rules"},
                           {"role": "user", "content": "hi", "name": "ann"},
                           {"role": "assistant", "content": "yo", "reasoning": "greet"},
                           {"role": "user", "content": "bye"}])
    want = "system/rules/:s|user/ann/:hi|assistant//greet:yo|user//:bye|"
    assert render_messages(engine, msgs, None, template) == want
    with_tools = render_messages(engine, msgs, parse_tools(TOOLS), template)
    assert with_tools.startswith("system/rules/:s\n\n# Tools") and with_tools.endswith(want.split("|", 1)[1])


def test_chat_template_kwargs_checked():
    """chat_template_kwargs set template variables (enable_thinking); one naming an argument of its
    own (add_generation_prompt, tools, ...) is a ValueError naming chat_template_kwargs in the library
    (was a TypeError) and a 400 naming it in the server; a template error is a 400 naming messages."""
    engine = _template_engine("{{ messages[0].content }}{% if enable_thinking is false %}/no_think{% endif %}")
    msgs = [{"role": "user", "content": "hi"}]
    assert engine.render_chat(msgs, chat_template_kwargs={"enable_thinking": False}) == "hi/no_think"
    for kw in ({"add_generation_prompt": False}, {"tools": []}, {"bos_token": "x"}, {"messages": []}, "x", {1: 2}):
        with pytest.raises(ValueError, match="^chat_template_kwargs: "):
            engine.render_chat(msgs, chat_template_kwargs=kw)
    template = {"add_generation_prompt": True, "chat_template_kwargs": {"continue_final_message": True},
                "continue_final_message": False}
    with pytest.raises(ApiError) as e:
        render_messages(engine, parse_messages(msgs), None, template)
    assert e.value.status == 400 and e.value.param == "chat_template_kwargs"
    with pytest.raises(ApiError) as e:
        render_messages(_template_engine("{{ raise_exception('no system role') }}"), parse_messages(msgs), None,
                        dict(template, chat_template_kwargs=None))
    assert e.value.param == "messages" and "no system role" in e.value.message


def test_reasoning_effort_reaches_the_template():
    """OpenAI's reasoning_effort is a template variable (as vLLM passes it, for gpt-oss-style
    templates); chat_template_kwargs, when it sets one too, wins."""
    engine = _template_engine("{{ messages[0].content }}/{{ reasoning_effort | default('unset') }}")
    msgs = parse_messages([{"role": "user", "content": "hi"}])

    def render(body):
        return render_messages(engine, msgs, None, parse_template_fields(Fields(body)))
    assert render({}) == "hi/unset"
    assert render({"reasoning_effort": "high"}) == "hi/high"
    assert render({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}) == "hi/low"


def test_tool_use_template_renders_the_tools():
    """A model whose default template ignores tools but whose named "tool_use" template renders
    them: the server hands tools to that template (as vLLM through transformers) instead of writing
    its Hermes fallback into the system message."""
    engine = _template_engine(
        "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}",
        **{"tokenizer.chat_template.tool_use": "{% for t in tools %}<{{ t.function.name }}>{% endfor %}"
                                               "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}"})
    template = {"add_generation_prompt": True, "chat_template_kwargs": None, "continue_final_message": False}
    msgs = parse_messages([{"role": "user", "content": "hi"}])
    assert render_messages(engine, msgs, parse_tools(TOOLS), template) == "<get_weather><get_time>user:hi|"
    assert render_messages(engine, msgs, None, template) == "user:hi|"


def test_tool_choice_rules():
    assert parse_tool_choice(None, None) == "none" and parse_tool_choice(None, TOOLS) == "auto"
    assert parse_tool_choice({"type": "function", "function": {"name": "get_time"}}, TOOLS) == ("function", "get_time")
    for bad, tools in [("auto", None), ("maybe", TOOLS), ({"type": "function", "function": {"name": "x"}}, TOOLS)]:
        with pytest.raises(ApiError) as e:
            parse_tool_choice(bad, tools)
        assert e.value.param == "tool_choice" and e.value.status == 400


def test_fields_validation_and_error_body():
    f = Fields({"n": 2, "temperature": 0.5, "stop": "x", "seed": -1, "max_tokens": 7, "priority": 3})
    kw, priority = parse_common(f, 100)
    f.reject_unknown()
    assert kw["n"] == 2 and kw["stop"] == ["x"] and kw["seed"] == -1 and kw["max_tokens"] == ("max_tokens", 7)
    assert priority == 3
    for body, param in [({"n": True}, "n"), ({"temperature": "1"}, "temperature"), ({"top_p": -0.1}, "top_p"),
                        ({"stop": [1]}, "stop"), ({"stop_token_ids": [100]}, "stop_token_ids"),
                        ({"n": None, "whatever": 1}, "whatever")]:
        with pytest.raises(ApiError) as e:
            f = Fields(body)
            parse_common(f, 100)
            f.reject_unknown()
        assert e.value.param == param
        b = e.value.body()["error"]
        assert set(b) == {"message", "type", "param", "code"} and b["type"] == "invalid_request_error"


def test_context_errors_name_both_counts():
    with pytest.raises(ApiError) as e:
        check_context(100, 90, ("max_completion_tokens", 20), "messages", "messages")
    assert e.value.param == "max_completion_tokens" and "90" in e.value.message and "20" in e.value.message
    with pytest.raises(ApiError) as e:
        check_context(100, 100, None, "prompt", "prompt")
    assert e.value.param == "prompt"


class _FakeJob:
    request_id = "x"
    closed = 0

    def close(self, reason="abort"):
        self.closed += 1


def test_sse_stream_ends_cleanly_when_generation_fails():
    from pocketcupy.server.sse import SSEStream

    def chunks():
        yield {"a": 1}
        raise RuntimeError("boom")

    job = _FakeJob()
    out = b"".join(SSEStream(chunks(), job))
    events = [e for e in out.decode().split("\n\n") if e]
    assert events[0] == 'data: {"a":1}' and events[-1] == "data: [DONE]"
    assert json.loads(events[1][6:])["error"]["type"] == "server_error" and job.closed >= 1
    job2 = _FakeJob()
    s = SSEStream(iter([{"a": 1}]), job2)
    s.close()  # closed before it was iterated (client gone at once): the engine request is still aborted
    assert job2.closed == 1


@pytest.mark.parametrize("env, argv, names", [
    ({"POCKETCUPY_MODEL": "{model}"}, [], ["{model}"]),
    ({}, ["--model", "{model}"], ["{model}"]),
    ({"POCKETCUPY_MODEL": "{model}"}, ["--served-model-name", "a", "b"], ["a", "b"]),
])
def test_serve_names_the_model_as_given(monkeypatch, smollm2_gguf, env, argv, names):
    """serve.py's default served name is the model as given by --model or POCKETCUPY_MODEL (a model
    from the environment was served as SmolLM2-135M-Instruct). No server starts."""
    import pocketcupy.server.gunicorn_app as gunicorn_app
    from .helpers import load_script
    from .test_server_harness import free_port

    seen = {}

    class NoServer:
        def __init__(self, config, options):
            seen["config"] = config

        def run(self):
            pass

    monkeypatch.setattr(gunicorn_app, "ServeApplication", NoServer)
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(model=smollm2_gguf))
    argv = [a.format(model=smollm2_gguf) for a in argv] + ["--device", "cpu", "--port", str(free_port())]
    assert load_script("serve").main(argv) == 0  # (main checks that the port is free)
    assert seen["config"].served_model_names == [n.format(model=smollm2_gguf) for n in names]
    assert seen["config"].engine_args.model == smollm2_gguf

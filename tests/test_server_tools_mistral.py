"""Mistral-style tool calls through a real server: SmolLM2 served with `--chat-template` set to
Mistral-7B-Instruct-v0.3's template (tests/fixtures/chat_templates). SmolLM2 does not call tools by
itself, so a regex constraint (structured output) makes it write a Mistral call (in SmolLM2
[TOOL_CALLS] is plain text, not a special token). The calls come back as tool_calls with 9-character
ids, whole and streamed, and the conversation with them and the tool results, sent back as a client
does, renders through the Mistral template (which refuses other ids)."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.test_server_harness import MODEL, ROOT, openai_client, request, serving
from tests.test_server_tools import ASK, TOOLS

TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "mistral-7b-instruct-v0.3.jinja")
CITY = '\\{"city": "[A-Z][a-z]{2,9}"\\}'
FORMS = {  # the regex each form is written under
    "v3": '\\[TOOL_CALLS\\] \\[\\{"name": "get_weather", "arguments": ' + CITY + '\\}\\]',
    "v11": "\\[TOOL_CALLS\\]get_weather\\[ARGS\\]" + CITY + "\\[TOOL_CALLS\\]get_time\\[ARGS\\]" + CITY,
}
ID = re.compile(r"[A-Za-z0-9]{9}")


@pytest.fixture(scope="module")
def mistral(smollm2_gguf):
    yield from serving(smollm2_gguf, "--chat-template", TEMPLATE)


@pytest.fixture(scope="module")
def mistral_client(mistral):
    return openai_client(mistral)


def create(client, form, **kw):
    return client.chat.completions.create(**{
        "model": MODEL, "messages": ASK, "tools": TOOLS, "max_tokens": 80, "temperature": 0,
        "extra_body": {"structured_outputs": {"regex": FORMS[form]}}, **kw})


@pytest.mark.parametrize("form,names", [("v3", ["get_weather"]), ("v11", ["get_weather", "get_time"])])
def test_calls_ids_and_the_round_trip(mistral_client, form, names):
    r = create(mistral_client, form)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert [t.function.name for t in c.message.tool_calls] == names
    for t in c.message.tool_calls:
        assert ID.fullmatch(t.id) and t.type == "function"
        assert re.fullmatch(r"[A-Z][a-z]{2,9}", json.loads(t.function.arguments)["city"])
    print(form, "->", [(t.id, t.function.name, t.function.arguments) for t in c.message.tool_calls])
    # the client's next turn: the assistant message as it came, and a result for each call
    follow = ASK + [c.message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": t.id, "content": json.dumps({"temp_c": 18})} for t in c.message.tool_calls]
    answer = mistral_client.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=8,
                                                    temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens > r.usage.prompt_tokens + 20  # the calls and the results were rendered


@pytest.mark.parametrize("form", ["v3", "v11"])
def test_streamed_calls_match_the_whole_reply(mistral_client, form):
    whole = create(mistral_client, form).choices[0].message.tool_calls
    chunks = list(create(mistral_client, form, stream=True))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == ""  # [TOOL_CALLS], [ARGS] and the call text never reach the content
    firsts = [d for d in deltas if d.id is not None]
    assert [(d.index, d.function.name) for d in firsts] == [(i, t.function.name) for i, t in enumerate(whole)]
    assert all(ID.fullmatch(d.id) for d in firsts)  # the same form as the whole reply's ids
    for i, t in enumerate(whole):
        assert "".join(d.function.arguments or "" for d in deltas if d.index == i) == t.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_forced_call_is_prefilled_in_mistral_form(mistral_client, mistral):
    """tool_choice naming a function: the prompt ends with the template's own call form (its
    prompt_tokens equal the rendered conversation plus '[TOOL_CALLS] [{"name": "get_weather",
    "arguments": ' as /tokenize counts them), and the call comes back with a 9-character id."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = mistral_client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named,
                                               max_tokens=24, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and ID.fullmatch(call.id)
    status, tok, _ = request(mistral, "POST", "/tokenize", {"messages": ASK, "tools": TOOLS})
    status, text, _ = request(mistral, "POST", "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and text["prompt"].endswith("What is the weather like in Paris today?[/INST]")
    for prefill, same in (('[TOOL_CALLS] [{"name": "get_weather", "arguments": ', True),
                          ('<tool_call>\n{"name": "get_weather", "arguments": ', False)):
        _, count, _ = request(mistral, "POST", "/tokenize", {"prompt": text["prompt"] + prefill,
                                                             "add_special_tokens": False})
        assert (count["count"] == r.usage.prompt_tokens) == same
    if r.choices[0].finish_reason != "length":
        follow = ASK + [r.choices[0].message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "18C"}]
        status, resp, _ = request(mistral, "POST", "/v1/chat/completions",
                                  {"model": MODEL, "messages": follow, "tools": TOOLS, "max_tokens": 4})
        assert status == 200, resp


def test_old_ids_are_what_the_template_refuses(mistral):
    """The reason for the ids: the Mistral template answers a conversation carrying an id of
    another form with a 400 naming messages."""
    follow = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-0123456789abcdef", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call-0123456789abcdef", "content": "14:05"}]
    status, resp, _ = request(mistral, "POST", "/v1/chat/completions",
                              {"model": MODEL, "messages": follow, "tools": TOOLS, "max_tokens": 4})
    assert status == 400 and resp["error"]["param"] == "messages" and "length 9" in resp["error"]["message"]


def test_bad_chat_template_is_a_startup_error(tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }}")
    latin1 = tmp_path / "latin1.jinja"
    latin1.write_bytes("{{ 'caf\u00e9' }}".encode("latin-1"))
    deep = tmp_path / "deep.jinja"          # Jinja's parser recurses once a parenthesis
    deep.write_text("{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}")
    for arg, says in ((str(broken), "error: --chat-template: line 1"),  # was "chat template: line 1"
                      ("no/such/template.jinja", "--chat-template: no/such/template.jinja looks like a template "
                                                 "file's path, but it does not exist"),
                      ("hello", "--chat-template: hello is neither a file nor a template"),
                      (str(latin1), f"chat-template: {latin1} is not UTF-8 text"),
                      (str(deep), "error: --chat-template: nested too deeply")):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "serve.py"), "--chat-template", arg],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and says in out.stderr, out.stderr


def test_missing_chat_template_file_with_a_brace_is_a_startup_error(tmp_path):
    """A --chat-template path that does not exist but holds a '{' was served as the template text
    itself (startup went on: here it would have stopped at --port 0 instead)."""
    missing = str(tmp_path / "templates-{model}" / "chat.jinja")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "serve.py"), "--chat-template", missing,
                          "--port", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"error: --chat-template: {missing} looks like a template file's path, but it does not exist" in out.stderr


def test_inline_chat_template_escapes_decoded():
    """An inline --chat-template has its backslash escapes decoded, as vLLM's (a shell passes "\\n" as
    two characters); other text, non-ASCII included, stays as written."""
    from .helpers import load_script

    read = load_script("serve").read_chat_template
    assert read(r"{{ messages[0].content }}\n\t\u00bfé—") == "{{ messages[0].content }}\n\t¿é—"
    with pytest.raises(ValueError, match=r"chat-template: a bad backslash escape in the template \(truncated"):
        read(r"{{ x }}\x4")

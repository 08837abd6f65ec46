"""`--reasoning-parser qwen3` through a real server. SmolLM2 does not think by itself, so a regex
constraint (structured output) makes it write a <think> block and an answer; the parser server's
reasoning_content and content must be exactly that text's parts, against the same request to the
shared server without a parser, whole, streamed and through the openai client."""
import os
import re
import subprocess
import sys

import pytest

from tests import test_server_harness
from tests.test_server_harness import MODEL, ROOT, ServerProcess, request, sse_events

server = test_server_harness.server  # the shared server, without a parser (a fixture, by this name)

THINK = {"model": MODEL, "messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 24,
         "temperature": 0, "structured_outputs": {"regex": "<think>[a-z ]{3,20}</think>\\n?[A-Za-z ]{1,20}"}}
PARTS = re.compile(r"<think>(.*)</think>\n*(.*)", re.S)
PLAIN = {k: v for k, v in THINK.items() if k != "structured_outputs"}
TOOL_REGEX = '<think>[a-z ]{3,20}</think>\\n<tool_call>\\{"name": "get_time", "arguments": \\{\\}\\}</tool_call>'


@pytest.fixture(scope="module")
def reasoner(smollm2_gguf):
    s = ServerProcess(smollm2_gguf, "--reasoning-parser", "qwen3")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def chat(srv, **kw):
    status, resp, _ = request(srv, "POST", "/v1/chat/completions", dict(THINK, **kw))
    assert status == 200, resp
    return resp


def test_think_block_is_split(reasoner, server):
    raw = chat(server, n=2)
    parsed = chat(reasoner, n=2)
    for r, p in zip(raw["choices"], parsed["choices"]):
        thought, answer = PARTS.fullmatch(r["message"]["content"]).groups()
        assert "reasoning_content" not in r["message"]
        assert (p["message"]["reasoning_content"], p["message"]["content"]) == (thought, answer or None)
        assert p["message"]["reasoning"] == thought     # vLLM's current name, besides the older one
        assert thought and answer
        assert p["finish_reason"] == r["finish_reason"] and p["logprobs"] == r["logprobs"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")   # (cached tokens: what ran before)
    assert [parsed["usage"][k] for k in counts] == [raw["usage"][k] for k in counts]


def test_streamed_deltas_join_to_the_same_parts(reasoner):
    whole = chat(reasoner)["choices"][0]["message"]
    status, events = sse_events(reasoner, "/v1/chat/completions", dict(THINK, stream=True))
    assert status == 200 and events[-1] == "DONE"
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])
    assert [d.get("reasoning") for d in deltas] == [d.get("reasoning_content") for d in deltas]
    assert not any("<" in (d.get("reasoning_content") or "") + (d.get("content") or "") for d in deltas)
    # the reasoning comes first, then the content
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content")


def test_plain_reply_is_all_content(reasoner, server):
    raw = request(server, "POST", "/v1/chat/completions", dict(PLAIN, max_tokens=8))[1]
    msg = request(reasoner, "POST", "/v1/chat/completions", dict(PLAIN, max_tokens=8))[1]["choices"][0]["message"]
    raw = raw["choices"][0]["message"]["content"]
    assert raw and "<think>" not in raw
    assert (msg["reasoning_content"], msg["content"]) == (None, raw)


def test_openai_client(reasoner):
    from openai import OpenAI

    client = OpenAI(base_url=reasoner.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.chat.completions.create(**PLAIN, extra_body={"structured_outputs": THINK["structured_outputs"]})
    msg = r.choices[0].message
    assert msg.model_extra["reasoning_content"] == msg.reasoning_content == msg.model_extra["reasoning"]
    assert msg.reasoning_content and msg.content
    assert "<think>" not in msg.content and "</think>" not in msg.reasoning_content


def test_tool_call_after_the_reasoning(reasoner):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    body = dict(PLAIN, max_tokens=40, tools=tools, structured_outputs={"regex": TOOL_REGEX})
    msg = chat(reasoner, **body)["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [("get_time", "{}")]
    status, events = sse_events(reasoner, "/v1/chat/completions", dict(body, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert [c["function"]["name"] for d in deltas for c in d.get("tool_calls", []) if "name" in c["function"]] \
        == ["get_time"]


def test_responses_api_output_items(reasoner):
    """The Responses API writes the same parts as items: a reasoning item, then a message (streamed:
    reasoning_text deltas before output_text deltas); then a function call after the reasoning."""
    whole = chat(reasoner)
    msg = whole["choices"][0]["message"]
    body = {"model": MODEL, "input": THINK["messages"][0]["content"], "max_output_tokens": 24, "temperature": 0,
            "structured_outputs": THINK["structured_outputs"]}
    status, r, _ = request(reasoner, "POST", "/v1/responses", body)
    assert status == 200, r
    assert [it["type"] for it in r["output"]] == ["reasoning", "message"]
    assert r["output"][0]["content"][0]["text"] == msg["reasoning_content"]
    assert r["output"][1]["content"][0]["text"] == msg["content"]
    assert 0 < r["usage"]["output_tokens_details"]["reasoning_tokens"] < r["usage"]["output_tokens"]
    assert r["usage"]["output_tokens"] == whole["usage"]["completion_tokens"]
    status, events = sse_events(reasoner, "/v1/responses", dict(body, stream=True))
    kinds = [e["type"] for e in events if e["type"].endswith("_text.delta")]
    assert kinds == sorted(kinds, key=lambda k: k == "response.output_text.delta") and len(set(kinds)) == 2
    assert [it["content"] for it in events[-1]["response"]["output"]] == [it["content"] for it in r["output"]]
    tools = [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}]
    status, r, _ = request(reasoner, "POST", "/v1/responses", dict(body, max_output_tokens=40, tools=tools,
                                                                     structured_outputs={"regex": TOOL_REGEX}))
    assert status == 200, r
    assert [it["type"] for it in r["output"]] == ["reasoning", "function_call"]
    assert (r["output"][1]["name"], r["output"][1]["arguments"]) == ("get_time", "{}")


def test_anthropic_messages_thinking_blocks(reasoner):
    """The Messages API writes the parts as a thinking block, then a text block (streamed:
    thinking_delta before text_delta)."""
    msg = chat(reasoner)["choices"][0]["message"]
    body = {"model": MODEL, "messages": THINK["messages"], "max_tokens": 24, "temperature": 0,
            "structured_outputs": THINK["structured_outputs"]}
    status, r, _ = request(reasoner, "POST", "/v1/messages", body)
    assert status == 200, r
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in r["content"]] == [
        ("thinking", msg["reasoning_content"]), ("text", msg["content"])]
    status, events = sse_events(reasoner, "/v1/messages", dict(body, stream=True))
    kinds = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert kinds == sorted(kinds, key=lambda k: k == "text_delta") and len(set(kinds)) == 2


# a reply that starts inside the reasoning block (the prompt opens it, as Qwen3-Thinking's template does)
OPENED = [*THINK["messages"], {"role": "assistant", "content": "<think>"}]


def test_thinking_token_budget_through_the_openai_client(reasoner):
    """vLLM's thinking_token_budget: the reasoning is the reply's first 4 tokens, then </think> is forced."""
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=reasoner.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    r = client.chat.completions.create(model=MODEL, messages=OPENED, max_tokens=10, temperature=0, logprobs=True,
                                       extra_body=dict(extra, thinking_token_budget=4))
    tokens = [t.token for t in r.choices[0].logprobs.content]
    msg = r.choices[0].message
    assert (msg.reasoning_content, "".join(tokens[4:7])) == ("".join(tokens[:4]), "</think>")
    assert msg.content and r.usage.completion_tokens == 10
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=OPENED, max_tokens=4,
                                       extra_body=dict(extra, thinking_token_budget=-1))
    assert e.value.body["param"] == "thinking_token_budget"


def test_anthropic_budget_tokens_cut_the_thinking(reasoner):
    """thinking.budget_tokens is enforced: the thinking block is the reply's first budget_tokens tokens."""
    body = {"model": MODEL, "messages": OPENED, "max_tokens": 10, "temperature": 0,
            "thinking": {"type": "enabled", "budget_tokens": 3}}
    status, r, _ = request(reasoner, "POST", "/v1/messages", body)
    assert status == 200, r
    chat_body = dict(PLAIN, messages=OPENED, max_tokens=3, continue_final_message=True, add_generation_prompt=False)
    first = chat(reasoner, **chat_body)["choices"][0]["message"]["reasoning_content"]   # its first 3 tokens
    assert [(b["type"], b.get("thinking")) for b in r["content"]] == [("thinking", first), ("text", None)]
    assert r["content"][1]["text"] and r["usage"]["output_tokens"] == 10


def test_unknown_parser_is_a_startup_error():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "serve.py"), "--reasoning-parser", "granite"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--reasoning-parser" in out.stderr and "qwen3" in out.stderr

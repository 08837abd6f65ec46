"""Reasoning sent back to a template that writes it (Qwen3's and others' reasoning_content): SmolLM2
served with `--chat-template` set to a template file that writes an assistant turn's reasoning_content
in <think>, and `--reasoning-parser qwen3`. A regex constraint makes SmolLM2 think; the Responses
API's reasoning item sent back, and chat's `reasoning` (vLLM's name) or `reasoning_content`, reach the
template the same way; a block the template opens in the prompt (chat_template_kwargs open_think) is
parsed as reasoning from the reply's first token, and a structured output's constraint starts after it
(SmolLM2, shown two thoughts closed with </think>, writes one itself)."""
import json
import re

import jsonschema
import pytest

from tests.test_server_harness import MODEL, openai_client, request, serving, sse_events
from tests.test_server_reasoning import THINK

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
            "{% if m.reasoning_content is string %}<think>{{ m.reasoning_content }}</think>{% endif %}"
            "{{ m.content or '' }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>"
            "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if open_think %}<think>\n{% endif %}{% endif %}")
Q, MORE = THINK["messages"][0]["content"], "Tell me more."


@pytest.fixture(scope="module")
def replay(smollm2_gguf, tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "reasoning.jinja"
    path.write_text(TEMPLATE)
    yield from serving(smollm2_gguf, "--chat-template", str(path), "--reasoning-parser", "qwen3")


def prompt(srv, messages):
    status, body, _ = request(srv, "POST", "/tokenize", {"model": MODEL, "messages": messages})
    assert status == 200, body
    status, text, _ = request(srv, "POST", "/detokenize", {"model": MODEL, "tokens": body["tokens"]})
    return body["count"], text["prompt"]


def test_reasoning_goes_back_to_the_template(replay):
    client = openai_client(replay)
    first = client.responses.create(model=MODEL, input=Q, max_output_tokens=24, temperature=0,
                                    extra_body={"structured_outputs": THINK["structured_outputs"]})
    reasoning, message = first.output
    thought, answer = reasoning.content[0].text, message.content[0].text
    assert reasoning.type == "reasoning" and thought and answer
    turns = [{"role": "user", "content": Q}, {"role": "assistant", "content": answer},
             {"role": "user", "content": MORE}]
    counts = {}
    for key in ("reasoning", "reasoning_content"):  # chat: vLLM's name and the older one
        counts[key], text = prompt(replay, [turns[0], dict(turns[1], **{key: thought}), turns[2]])
        assert f"<|im_start|>assistant\n<think>{thought}</think>{answer}<|im_end|>" in text
    assert counts["reasoning"] == counts["reasoning_content"] > prompt(replay, turns)[0]
    # the Responses API: the first response's output items sent back, its reasoning item included
    items = [{"role": "user", "content": Q}, *(it.model_dump(exclude_none=True) for it in first.output),
             {"role": "user", "content": MORE}]
    second = client.responses.create(model=MODEL, input=items, max_output_tokens=1, temperature=0)
    assert second.usage.input_tokens == counts["reasoning"]
    bare = client.responses.create(model=MODEL, input=[it for it in items if it.get("type") != "reasoning"],
                                   max_output_tokens=1, temperature=0)
    assert bare.usage.input_tokens == prompt(replay, turns)[0]


def test_anthropic_thinking_blocks_go_back_to_the_template(replay):
    """The Messages API: an assistant turn's thinking block sent back is its reasoning, as chat's (vLLM
    passes it on; it was dropped); redacted_thinking stays out."""
    thought, answer = "the sky scatters blue light", "Rayleigh scattering."
    turns = [{"role": "user", "content": Q}, {"role": "assistant", "content": answer},
             {"role": "user", "content": MORE}]
    blocks = [{"type": "redacted_thinking", "data": "opaque"}, {"type": "thinking", "thinking": thought,
                                                                "signature": "s"}, {"type": "text", "text": answer}]
    body = {"model": MODEL, "messages": [turns[0], {"role": "assistant", "content": blocks}, turns[2]]}
    status, resp, _ = request(replay, "POST", "/v1/messages/count_tokens", body)
    assert status == 200, resp
    assert resp["input_tokens"] == prompt(replay, [turns[0], dict(turns[1], reasoning=thought), turns[2]])[0]
    blocks[1]["thinking"] = 5
    status, resp, _ = request(replay, "POST", "/v1/messages/count_tokens", body)
    assert status == 400 and "messages[1].content[1].thinking" in resp["error"]["message"], resp


SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["true", "false"]}}, "required": ["verdict"],
          "additionalProperties": False}
FORMAT = {"name": "verdict", "schema": SCHEMA}
# SmolLM2 thinks when shown how: it writes a short thought, closes it with </think>, then JSON
SHOTS = [{"role": "user", "content": "Is fire hot? Think, then answer in JSON."},
         {"role": "assistant", "content": '<think>\nfire burns</think>{"answer": "yes"}'},
         {"role": "user", "content": "Is ice cold? Think, then answer in JSON."},
         {"role": "assistant", "content": '<think>\nice is frozen</think>{"answer": "yes"}'},
         {"role": "user", "content": "Is the sky blue? Think, then answer in JSON."}]
OPEN = {"model": MODEL, "messages": SHOTS, "max_tokens": 24, "temperature": 0,
        "chat_template_kwargs": {"open_think": True}}


def test_a_block_the_prompt_opened(replay):
    """A template that opens the <think> block in the prompt (Qwen3-Thinking's): the output starts
    inside the reasoning, so it is split at </think> (whole and streamed alike), and a structured
    output's constraint starts after it, as vLLM's does: the reasoning is free text, the content
    follows the schema. A prompt that does not open the block is constrained from its first token."""
    body = dict(OPEN, response_format={"type": "json_schema", "json_schema": FORMAT})
    status, resp, _ = request(replay, "POST", "/v1/chat/completions", body)
    assert status == 200, resp
    msg = resp["choices"][0]["message"]
    assert re.fullmatch("[a-z ]{3,40}", msg["reasoning"]), msg   # no JSON: the constraint was not on
    jsonschema.validate(json.loads(msg["content"]), SCHEMA)
    assert resp["choices"][0]["finish_reason"] == "stop"
    status, events = sse_events(replay, "/v1/chat/completions", dict(body, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert ["".join(d.get(k) or "" for d in deltas) for k in ("reasoning", "content")] == \
        [msg["reasoning"], msg["content"]]
    status, closed, _ = request(replay, "POST", "/v1/chat/completions", dict(body, chat_template_kwargs={}))
    assert status == 200, closed
    closed = closed["choices"][0]["message"]
    assert closed["reasoning"] is None and closed["content"] and json.loads(closed["content"]) in (
        {"verdict": "true"}, {"verdict": "false"})


def test_responses_and_messages_constrain_after_the_reasoning(replay):
    """The Responses API's text.format and the Messages API's output_config.format start after the
    reasoning the same way: a free reasoning item (thinking block), then the JSON."""
    body = {"model": MODEL, "input": SHOTS, "max_output_tokens": 24, "temperature": 0,
            "chat_template_kwargs": {"open_think": True}, "text": {"format": dict(FORMAT, type="json_schema")}}
    status, r, _ = request(replay, "POST", "/v1/responses", body)
    assert status == 200, r
    assert [it["type"] for it in r["output"]] == ["reasoning", "message"], r["output"]
    assert re.fullmatch("[a-z ]{3,40}", r["output"][0]["content"][0]["text"])
    jsonschema.validate(json.loads(r["output"][1]["content"][0]["text"]), SCHEMA)
    body = {"model": MODEL, "messages": SHOTS, "max_tokens": 24, "temperature": 0,
            "chat_template_kwargs": {"open_think": True},
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    status, r, _ = request(replay, "POST", "/v1/messages", body)
    assert status == 200, r
    assert [b["type"] for b in r["content"]] == ["thinking", "text"], r["content"]
    jsonschema.validate(json.loads(r["content"][1]["text"]), SCHEMA)


@pytest.mark.parametrize("item,param", [
    ({"type": "reasoning", "summary": [], "content": "x"}, "input[1].content"),
    ({"type": "reasoning", "summary": [{"type": "summary_text", "text": 1}]}, "input[1].summary[0]"),
])
def test_bad_reasoning_item(replay, item, param):
    body = {"model": MODEL, "input": [{"role": "user", "content": Q}, item, {"role": "assistant", "content": "a"}]}
    status, resp, _ = request(replay, "POST", "/v1/responses", body)
    assert status == 400 and resp["error"]["param"] == param, resp

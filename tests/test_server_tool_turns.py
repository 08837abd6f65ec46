"""Conversations carrying tool calls, checked as OpenAI's API checks them: an assistant's tool call
needs its id and type "function". Each bad one is a 400 naming the field, through the real `openai`
client; nothing is generated."""
import openai
import pytest

from tests.test_server_harness import MODEL, client, server  # noqa: F401

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
ASK = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def said(*calls) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def result(call_id="c1") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "18C"}


CHAT_CASES = [   # (messages, the param of the 400)
    ([ASK, said({k: v for k, v in CALL.items() if k != "id"}), result()], "messages[1].tool_calls[0].id"),
    ([ASK, said(dict(CALL, id=5)), result()], "messages[1].tool_calls[0].id"),
    ([ASK, said(dict(CALL, type="custom")), result()], "messages[1].tool_calls[0].type"),
    ([ASK, said({k: v for k, v in CALL.items() if k != "type"}), result()], "messages[1].tool_calls[0].type"),
]


@pytest.mark.parametrize("messages,param", CHAT_CASES)
def test_chat_tool_turns_are_checked(client, messages, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=1)
    assert e.value.body["param"] == param, e.value.body

"""Tools and conversations carrying tool calls, checked as OpenAI's API checks them: an assistant's
tool call needs its id and type "function"; a tool message (a Responses function_call_output, an
Anthropic tool_result) answers a call of the assistant message before it; a function's parameters are
a JSON Schema of type "object". Each bad one is a 400 naming the field, through the real `openai`
client; nothing is generated but a token where a request is taken."""
import openai
import pytest

from tests.test_server_harness import MODEL, client, request, server  # noqa: F401

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
    ([ASK, said(CALL), result("c2")], "messages[2].tool_call_id"),
    ([ASK, result()], "messages[1].tool_call_id"),
    ([ASK, said(CALL), result(), ASK, result()], "messages[4].tool_call_id"),
]


@pytest.mark.parametrize("messages,param", CHAT_CASES)
def test_chat_tool_turns_are_checked(client, messages, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=1)
    assert e.value.body["param"] == param, e.value.body


def test_answered_calls_are_taken(client):
    """Several calls answered in any order, and a call left unanswered (vLLM takes it), are taken."""
    two = said(CALL, dict(CALL, id="c2"))
    for messages in ([ASK, two, result("c2"), result("c1")], [ASK, said(CALL), ASK]):
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=1)
        assert r.choices[0].finish_reason == "length"


FC = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
RESPONSES_CASES = [   # (input, the param of the 400)
    ([ASK, {"type": "function_call_output", "call_id": "c1", "output": "18C"}], "input[1].call_id"),
    ([ASK, FC, {"type": "function_call_output", "call_id": "c9", "output": "18C"}], "input[2].call_id"),
    ([ASK, FC, {"type": "function_call_output", "call_id": "c1"}], "input[2].output"),
    ([ASK, FC, {"type": "function_call_output", "call_id": "c1", "output": 18}], "input[2].output"),
]


@pytest.mark.parametrize("items,param", RESPONSES_CASES)
def test_responses_tool_items_are_checked(client, items, param):
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=items, tools=tools, max_output_tokens=1)
    assert e.value.body["param"] == param, e.value.body


def test_anthropic_tool_result_answers_a_tool_use(server):
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "18C"}]}
    body = {"model": MODEL, "max_tokens": 1, "messages": [ASK, use, answer],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
    status, resp, _ = request(server, "POST", "/v1/messages", body)
    assert status == 400 and "tool_use_id" in resp["error"]["message"], resp
    body["messages"][2]["content"][0]["tool_use_id"] = "t1"
    assert request(server, "POST", "/v1/messages", body)[0] == 200


def test_parameters_describe_an_object(client):
    """A function's arguments are a JSON object (OpenAI's API refuses parameters of another type): a
    schema of type "string" is a 400 naming it; a forced call under it wrote a JSON string."""
    for choice in ("auto", "required"):
        for kind in ("string", ["object", "null"]):
            tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": kind}}}]
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model=MODEL, messages=[ASK], tools=tools, tool_choice=choice,
                                               max_tokens=1)
            assert e.value.body["param"] == "tools[0].function.parameters"


def test_responses_tool_choice_message_shows_its_shape(client):
    """A bad Responses tool_choice is explained in the Responses shape ({'type': 'function', 'name': ...});
    the message showed chat's nesting ({'function': {'name': ...}})."""
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    for choice in ("always", 5, ["auto"]):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input="hi", tools=tools, tool_choice=choice, max_output_tokens=1)
        assert e.value.body["param"] == "tool_choice" and "'name': ..." in e.value.body["message"]
        assert "'function': {" not in e.value.body["message"], e.value.body


def test_parameters_are_checked_whatever_tool_choice(client):
    """OpenAI's API checks every function's schema: one that is no JSON Schema (a type that is no JSON
    type, properties that are not schemas) is a 400 naming it with "auto" and "none" too (it was taken:
    only a forced call's schema was compiled); a valid schema the structured-output engine cannot enforce
    (uniqueItems) is taken when no call is forced."""
    bad = [{"type": "object", "properties": {"city": {"type": "strin"}}},
           {"type": "object", "properties": {"days": {"type": "array", "items": [{"type": "int"}]}}},
           {"type": "object", "properties": ["city"]},
           {"type": "object", "properties": {"city": {"anyOf": [{"type": "string"}, 5]}}}]
    for schema in bad:
        for choice in ("auto", "none"):
            tools = [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": schema}}]
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model=MODEL, messages=[ASK], tools=tools, tool_choice=choice,
                                               max_tokens=1)
            assert e.value.body["param"] == "tools[1].function.parameters", e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="hi", max_output_tokens=1,
                                tools=[{"type": "function", "name": "f", "parameters": bad[0]}])
    assert e.value.body["param"] == "tools[0].parameters" and "properties.city.type" in e.value.body["message"]
    unique = {"type": "object", "properties": {"days": {"type": "array", "uniqueItems": True}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": unique}}]
    r = client.chat.completions.create(model=MODEL, messages=[ASK], tools=tools, max_tokens=1)
    assert r.choices[0].finish_reason == "length"

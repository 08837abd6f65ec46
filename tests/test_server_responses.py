"""POST /v1/responses (OpenAI's Responses API) through the official `openai` client and raw HTTP:
the same text and token counts as the chat request it translates to, streamed as the API's event
sequence, incomplete responses, logprobs, function calls and their round trip, text.format, and
400s naming the Responses field."""
import http.client
import json
import os
import subprocess
import sys
import time

import pytest

from tests.test_server_harness import MODEL, ROOT, ServerProcess, client, metric, metrics, request, server  # noqa: F401

Q = "What is the capital of France?"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
NAMED = {"type": "function", "name": "get_weather"}


def respond(client, **kw):
    return client.responses.create(model=MODEL, **{"input": Q, "max_output_tokens": 24, "temperature": 0, **kw})


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def test_text_matches_chat(client):
    r = respond(client, instructions="Answer briefly.", max_output_tokens=40)
    c = chat(client, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": Q}],
             max_tokens=40)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL and r.store is False
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert r.output_text == c.choices[0].message.content and r.output_text
    assert (r.usage.input_tokens, r.usage.output_tokens) == (c.usage.prompt_tokens, c.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.status == ("completed" if c.choices[0].finish_reason == "stop" else "incomplete")
    assert r.instructions == "Answer briefly." and r.max_output_tokens == 40 and r.temperature == 0


def test_input_items_match_chat(client):
    """Message items (text parts, developer role) become the same conversation as chat's messages."""
    items = [{"type": "message", "role": "developer", "content": "Answer in one sentence."},
             {"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
             {"role": "user", "content": "Another one?"}]
    msgs = [{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"}]
    r = respond(client, input=items, max_output_tokens=16)
    c = chat(client, msgs, max_tokens=16)
    assert r.output_text == c.choices[0].message.content
    assert r.usage.input_tokens == c.usage.prompt_tokens


def test_stream_events(client):
    whole = respond(client)
    events = list(respond(client, stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == whole.output_text == events[-4].text
    item = events[2].item
    assert all(e.item_id == item.id and e.output_index == 0 for e in deltas)
    final = events[-1].response
    assert final.id == events[0].response.id and final.output_text == whole.output_text
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens, whole.usage.output_tokens)
    assert final.usage.input_tokens_details.cached_tokens > 0   # the same prompt ran just before: a prefix hit


def test_stream_helper_final_response(client):
    with client.responses.stream(model=MODEL, input=Q, max_output_tokens=40, temperature=0) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == text == respond(client, max_output_tokens=40).output_text


def test_response_has_the_sdk_fields(client):
    """The response validates as the openai package's Response (usage.input_tokens_details.cache_write_tokens is
    required: it was missing), echoes prompt_cache_key, safety_identifier, text.verbosity and reasoning.summary
    (were dropped), and a completed one has completed_at, streamed too (was absent)."""
    from openai.types.responses import Response

    kw = dict(text={"format": {"type": "json_schema", "name": "x", "schema": {"const": 7}}, "verbosity": "low"},
              prompt_cache_key="k1", safety_identifier="user-1", reasoning={"summary": "auto"})
    raw = json.loads(client.responses.with_raw_response.create(model=MODEL, input=Q, **kw).text)
    final = list(respond(client, stream=True, **kw))[-1].response.model_dump(by_alias=True)
    for r in (Response.model_validate(raw), Response.model_validate(final)):
        assert r.status == "completed" and r.completed_at >= r.created_at
        assert r.usage.input_tokens_details.cache_write_tokens == 0
        assert (r.prompt_cache_key, r.safety_identifier) == ("k1", "user-1")
        assert (r.text.verbosity, r.reasoning.summary) == ("low", "auto")


def test_input_tokens_count(client, server):
    """The client's responses.input_tokens.count (POST /v1/responses/input_tokens) gives the prompt tokens the
    same request reports as usage.input_tokens (it was a 405), the model optional; bad input a 400 naming it."""
    kw = dict(input=Q, instructions="Be brief.", tools=TOOLS)
    counted = client.responses.input_tokens.count(model=MODEL, **kw)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == respond(client, max_output_tokens=1, **kw).usage.input_tokens
    assert client.responses.input_tokens.count(**kw).input_tokens == counted.input_tokens
    status, body, _ = request(server, "POST", "/v1/responses/input_tokens", {"input": [{"role": "robot"}]})
    assert status == 400 and body["error"]["param"] == "input[0].role", body


def test_incomplete_at_max_output_tokens(client):
    r = respond(client, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = list(respond(client, max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == r.output_text


def test_logprobs(client):
    r = respond(client, max_output_tokens=6, include=["message.output_text.logprobs"], top_logprobs=3)
    lps = r.output[0].content[0].logprobs
    c = chat(client, [{"role": "user", "content": Q}], max_tokens=6, logprobs=True, top_logprobs=3)
    want = c.choices[0].logprobs.content
    assert [(lp.token, len(lp.top_logprobs)) for lp in lps] == [(w.token, 3) for w in want]
    assert all(abs(lp.logprob - w.logprob) < 1e-4 for lp, w in zip(lps, want))
    streamed = [lp for e in respond(client, max_output_tokens=6, include=["message.output_text.logprobs"],
                                    top_logprobs=3, stream=True)
                if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in lps]
    assert respond(client, max_output_tokens=6).output[0].content[0].logprobs == []


def test_include_takes_the_apis_values(client):
    """include ["reasoning.encrypted_content"] (Codex and stateless agents send it) was a 400: it is one of the
    API's include values, with nothing to add here; the reply is the one without it."""
    plain = respond(client, max_output_tokens=1)
    r = respond(client, max_output_tokens=1, include=["reasoning.encrypted_content", "message.input_image.image_url"])
    assert r.output_text == plain.output_text


def test_logprobs_only_when_included(client):
    """As OpenAI's API: output_text logprobs come only with include ["message.output_text.logprobs"];
    top_logprobs says how many alternatives, not whether (they came back without include)."""
    r = respond(client, max_output_tokens=4, top_logprobs=3)
    assert r.output[0].content[0].logprobs == [] and r.top_logprobs == 3
    events = list(respond(client, max_output_tokens=4, top_logprobs=3, stream=True))
    texts = [e for e in events if e.type in ("response.output_text.delta", "response.output_text.done")]
    assert texts and all(e.logprobs == [] for e in texts)
    assert events[-1].response.output[0].content[0].logprobs == []
    lps = respond(client, max_output_tokens=4, include=["message.output_text.logprobs"]).output[0].content[0].logprobs
    assert lps and all(lp.top_logprobs == [] for lp in lps)     # included without top_logprobs: no alternatives


def test_function_call_round_trip(client):
    r = respond(client, input="What is the weather in Paris?", tools=TOOLS, tool_choice=NAMED)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.id.startswith("fc_") and call.call_id
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert r.tools[0].name == "get_weather" and r.tool_choice.name == "get_weather"
    follow = [{"role": "user", "content": "What is the weather in Paris?"}, call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 18})}]
    answer = respond(client, input=follow, tools=TOOLS, tool_choice="none")
    assert answer.output[0].type == "message" and answer.output_text
    plain = respond(client, input="What is the weather in Paris?", tools=TOOLS, tool_choice="none")
    assert answer.usage.input_tokens > plain.usage.input_tokens + 10   # the call and its output are in the prompt


def test_empty_tools_are_no_tools(client):
    """tools [] is the API's default (a response echoes it; the Agents SDK sends it for an agent without
    tools), with tool_choice 'auto' or 'none' too: the reply is the one without tools; it was a 400."""
    plain = respond(client, max_output_tokens=8)
    for choice in ({}, {"tool_choice": "auto"}, {"tool_choice": "none"}):
        r = respond(client, max_output_tokens=8, tools=[], **choice)
        assert r.output_text == plain.output_text and r.tools == []
        assert r.tool_choice == choice.get("tool_choice", "auto")


def test_function_call_streams_argument_deltas(client):
    whole = respond(client, input="Weather in Rome?", tools=TOOLS, tool_choice="required").output[0]
    events = list(respond(client, input="Weather in Rome?", tools=TOOLS, tool_choice="required", stream=True))
    added = next(e for e in events if e.type == "response.output_item.added").item
    assert added.type == "function_call" and added.name == "get_weather" and added.arguments == ""
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert len(deltas) > 1 and "".join(deltas) == done.arguments == whole.arguments


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    r = respond(client, input="Describe a person as JSON.", max_output_tokens=48,
                text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert r.status == "completed" and r.text.format.type == "json_schema"
    person = json.loads(r.output_text)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)


@pytest.mark.parametrize("body,param", [
    ({"input": []}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),    # (no response store here)
    ({"input": [{"type": "function_call", "call_id": 3, "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "truncation": "middle"}, "truncation"),
    ({"input": "x", "include": ["reasoning.everything"]}, "include"),
    ({"input": "x", "include": ""}, "include"),
    ({"input": "x", "top_logprobs": 21}, "top_logprobs"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": -1}, "temperature"),   # (3 is taken, as vLLM takes it)
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "bad name", "schema": {}}}}, "text.format.name"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    # OpenAI's Responses API requires the schema (chat's response_format does not): it gave any JSON object
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    # a text format with a json_schema's keys was taken as plain text (chat's response_format refuses them)
    ({"input": "x", "text": {"format": {"type": "text", "schema": {"type": "object"}}}}, "text.format.schema"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "n": 2}, "n"),
    # OpenAI's metadata: at most 16 pairs of strings (any object was taken)
    ({"input": "x", "metadata": {"a": 1}}, "metadata"),
    ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"input": [{"role": "user", "content": "x"}, {"role": "user", "content": 5}]}, "input[1].content"),
    # the same item twice: OpenAI's "Duplicate item found" (it was taken)
    ({"input": [{"type": "message", "id": "msg_a", "role": "user", "content": "x"}] * 2}, "input[1]"),
])
def test_bad_requests_name_the_responses_field(server, body, param):
    status, resp, _ = request(server, "POST", "/v1/responses", dict({"model": MODEL}, **body))
    assert status == 400, resp
    assert resp["error"]["param"] == param, resp


def test_errors_while_generating_name_the_responses_field(client, server):
    """A 400 the engine raises while generating (here min_tokens forbids the stop token "7", the only one
    text.format allows) names text.format where it said response_format.json_schema.schema, chat's field
    (the Responses renames applied only to the errors raised before the engine ran), streamed or not.
    Streamed, it is the API's error event (type, code, message, param, sequence_number), where it was
    chat's untyped {"error": ...}, then response.failed, the response with status 'failed' and its error,
    as OpenAI's streams end a failed response (the stream ended at the error event)."""
    import openai
    from openai.types.responses import ResponseErrorEvent, ResponseFailedEvent

    kw = failing(server)
    with pytest.raises(openai.BadRequestError) as e:
        respond(client, **kw)
    events = list(respond(client, stream=True, **kw))
    error, failed = events[-2:]
    assert isinstance(error, ResponseErrorEvent) and isinstance(failed, ResponseFailedEvent)
    assert failed.sequence_number == len(events) - 1 and failed.response.id == events[0].response.id
    assert failed.response.status == "failed" and failed.response.error.code == "invalid_prompt"
    assert failed.response.error.message == error.message
    for body in (e.value.body, error.model_dump()):
        assert (body["param"], body["code"]) == ("min_tokens", "invalid_value"), body
        assert body["message"].startswith("min_tokens: with text.format.schema, it forbids every token")


def failing(server) -> dict:
    """respond()'s arguments of a request accepted whose generation fails: min_tokens forbids the stop token
    "7", the only one text.format allows (a 400 naming min_tokens)."""
    seven = request(server, "POST", "/tokenize", {"prompt": "7", "add_special_tokens": False})[1]["tokens"]
    return dict(text={"format": {"type": "json_schema", "name": "x", "schema": {"const": 7}}}, max_output_tokens=4,
                extra_body={"min_tokens": 1, "stop_token_ids": seven})


def test_context_overflow_and_unknown_model(server):
    status, resp, _ = request(server, "POST", "/v1/responses", {"model": MODEL, "input": "hello " * 9000})
    assert status == 400 and resp["error"]["param"] == "input" and "maximum context length" in resp["error"]["message"]
    status, resp, _ = request(server, "POST", "/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": 9000})
    assert status == 400 and resp["error"]["param"] == "max_output_tokens"
    status, resp, _ = request(server, "POST", "/v1/responses", {"model": "nope", "input": "x"})
    assert status == 404 and resp["error"]["param"] == "model"


def test_nothing_is_stored(server):
    status, resp, _ = request(server, "POST", "/v1/responses",
                              {"model": MODEL, "input": Q, "max_output_tokens": 2, "store": True})
    assert status == 200 and resp["store"] is False
    status, resp, _ = request(server, "GET", f"/v1/responses/{resp['id']}")
    assert status == 404 and resp["error"]["param"] == "response_id"


def test_raw_stream_names_each_event(server):
    """Each SSE message has an `event:` line naming its type, and the stream ends without [DONE], as
    OpenAI's Responses streams do."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {"model": MODEL, "input": Q, "max_output_tokens": 3, "stream": True}
    c.request("POST", "/v1/responses", json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    messages = r.read().decode().strip().split("\n\n")
    c.close()
    for m in messages:
        event, data = m.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == event[7:]
    assert messages[-1].startswith("event: response.incomplete")


@pytest.fixture(scope="module")
def stored(smollm2_gguf):
    """A server with a response store of two responses, and a context of 512 tokens."""
    from openai import OpenAI

    s = ServerProcess(smollm2_gguf, "--responses-store", "2", "--max-model-len", "512")
    try:
        s.wait_ready()
        yield s, OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    finally:
        s.stop()


def test_previous_response_id_continues_the_conversation(stored):
    srv, c = stored
    first = respond(c, input="My name is Ada. Say hello to me.", instructions="Be brief.")
    assert first.store is True
    second = respond(c, input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # the same conversation sent whole (the first turn's instructions do not carry over)
    turns = [{"role": "user", "content": "My name is Ada. Say hello to me."},
             {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "What is my name?"}]
    whole = respond(c, input=turns, store=False)
    assert second.output_text == whole.output_text and second.usage.input_tokens == whole.usage.input_tokens
    streamed = list(respond(c, input="And again?", previous_response_id=second.id, stream=True))
    third = c.responses.retrieve(streamed[-1].response.id)
    assert third.previous_response_id == second.id and third.output_text == streamed[-1].response.output_text
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens


def test_stream_keeps_the_whole_responses_items(stored):
    """Whitespace-only text beside function calls (here between and after them, written under a regex
    constraint) is no message item, streamed or not, as chat leaves such content null; a stream
    announced and stored it."""
    srv, c = stored
    call = '<tool_call>\n\\{"name": "get_weather", "arguments": \\{"city": "Paris"\\}\\}\n</tool_call>'
    kw = dict(input="Weather in Paris?", tools=TOOLS, max_output_tokens=80,
              extra_body={"structured_outputs": {"regex": f"Sure\\.\n{call}\n{call}\n"}})
    whole = [(o.type, o.content[0].text if o.type == "message" else o.arguments) for o in respond(c, **kw).output]
    assert whole == [("message", "Sure.\n")] + [("function_call", '{"city": "Paris"}')] * 2
    events = list(respond(c, stream=True, **kw))
    final = events[-1].response
    saved = c.responses.retrieve(final.id).output
    assert [o.type for o in final.output] == [o.type for o in saved] == [t for t, _ in whole]
    assert final.output[0].content[0].text == saved[0].content[0].text == "Sure.\n"
    assert [e.item.type for e in events if e.type == "response.output_item.added"] == [t for t, _ in whole]
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1, 2]


def test_store_retrieve_delete_and_evict(stored):
    srv, c = stored
    kept = respond(c, max_output_tokens=4)
    assert c.responses.retrieve(kept.id).output_text == kept.output_text
    unkept = respond(c, max_output_tokens=4, store=False)
    assert unkept.store is False and request(srv, "GET", f"/v1/responses/{unkept.id}")[0] == 404
    status, body, _ = request(srv, "DELETE", f"/v1/responses/{kept.id}")
    assert status == 200 and body == {"id": kept.id, "object": "response.deleted", "deleted": True}
    assert request(srv, "GET", f"/v1/responses/{kept.id}")[0] == 404
    status, body, _ = request(srv, "POST", "/v1/responses", {"model": MODEL, "input": "x",
                                                             "previous_response_id": kept.id})
    assert status == 400 and body["error"]["param"] == "previous_response_id"
    ids = [respond(c, max_output_tokens=2).id for _ in range(3)]   # a store of two: the oldest goes
    assert [request(srv, "GET", f"/v1/responses/{i}")[0] for i in ids] == [404, 200, 200]


def test_input_items_of_a_stored_response(stored):
    """GET /v1/responses/{id}/input_items (the client's responses.input_items.list) lists the items the request
    sent, as OpenAI's ResponseItem (an id, a status, a string content as a text part), the newest first unless
    order is 'asc', by limit and after (it was a 404); a continued conversation's lists its own items only."""
    from openai.types.responses import ResponseItemList

    srv, c = stored
    sent = [{"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    r = respond(c, input=sent, max_output_tokens=1)
    status, body, _ = request(srv, "GET", f"/v1/responses/{r.id}/input_items")
    page = ResponseItemList.model_validate(body)
    assert status == 200 and [(i.role, i.content[0].text, i.status) for i in page.data] == [
        ("user", "Hi", "completed"), ("developer", "Be brief.", "completed")]
    assert (page.first_id, page.last_id, page.has_more) == (page.data[0].id, page.data[1].id, False)
    first = c.responses.input_items.list(r.id, order="asc", limit=1)
    assert [i.role for i in first.data] == ["developer"] and first.has_more
    rest = c.responses.input_items.list(r.id, order="asc", after=first.data[0].id)
    assert [i.id for i in rest.data] == [page.data[0].id] and not rest.has_more
    later = respond(c, input="Again", previous_response_id=r.id, max_output_tokens=1)
    assert [i.content[0].text for i in c.responses.input_items.list(later.id).data] == ["Again"]
    assert request(srv, "GET", f"/v1/responses/{r.id}/input_items?limit=0")[1]["error"]["param"] == "limit"
    assert request(srv, "GET", "/v1/responses/resp_none/input_items")[0] == 404


def test_item_reference_is_the_stored_item(stored):
    """An item_reference input item (as Codex resends an earlier output item) is the stored item of that id: the
    same prompt as the item sent whole (it was a 400 'input[1].type'); an unknown id is a 400 naming input[i].id."""
    srv, c = stored
    reply = respond(c, max_output_tokens=1).output[0]
    turns = [{"role": "user", "content": Q}, None, {"role": "user", "content": "And Spain?"}]
    kw = dict(max_output_tokens=1, store=False)
    whole = respond(c, input=[reply.model_dump(exclude_none=True) if t is None else t for t in turns], **kw)
    referenced = respond(c, input=[{"type": "item_reference", "id": reply.id} if t is None else t for t in turns], **kw)
    assert referenced.usage.input_tokens == whole.usage.input_tokens > respond(c, input=Q, **kw).usage.input_tokens
    status, body, _ = request(srv, "POST", "/v1/responses", {"model": MODEL, "input": [
        turns[0], {"type": "item_reference", "id": "msg_none"}]})
    assert status == 400 and body["error"]["param"] == "input[1].id", body


def test_an_item_given_twice_is_a_400(stored):
    """An item_reference to an item previous_response_id already brings in is OpenAI's "Duplicate item
    found" 400 naming input[i] (the item went into the prompt twice)."""
    srv, c = stored
    first = respond(c, max_output_tokens=1)
    status, body, _ = request(srv, "POST", "/v1/responses", {"model": MODEL, "previous_response_id": first.id,
                                                             "input": [{"type": "item_reference",
                                                                        "id": first.output[0].id}]})
    assert status == 400 and body["error"]["param"] == "input[0]" and "Duplicate item" in body["error"]["message"]


def test_input_items_list_a_reasoning_item_without_summary(stored):
    """A reasoning item sent without `summary` (the request's schema has it optional) is listed with
    summary [], as the list's ResponseReasoningItem requires (the SDK's schema refused the page)."""
    from openai.types.responses import ResponseItemList

    srv, c = stored
    thought = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Think."}]}
    r = respond(c, input=[{"role": "user", "content": "Hi"}, thought, {"role": "assistant", "content": "Hello."},
                          {"role": "user", "content": "Bye"}], max_output_tokens=1)
    status, body, _ = request(srv, "GET", f"/v1/responses/{r.id}/input_items?order=asc")
    page = ResponseItemList.model_validate(body)
    assert status == 200 and page.data[1].type == "reasoning" and page.data[1].summary == []


def settled(c, response):
    """The stored response once its background generation has ended."""
    while response.status in ("queued", "in_progress"):
        time.sleep(0.02)
        response = c.responses.retrieve(response.id)
    return response


def test_background_response_runs_in_the_server(stored):
    """background: true (it was a 400) answers at once with the response queued; its generation runs in the
    server, and GET /v1/responses/{id} gives its state until it ends: the text of the same request without
    background. Streamed, the events are a plain stream's, and GET ?stream=true&starting_after=N streams them
    again after sequence number N (OpenAI's resume). It must be stored (a 400 naming background)."""
    srv, c = stored
    plain = respond(c, max_output_tokens=4, store=False)
    r = respond(c, max_output_tokens=4, background=True)
    assert r.status == "queued" and r.background is True and r.output == []
    done = settled(c, r)
    assert (done.status, done.output_text, done.usage.output_tokens) == (
        plain.status, plain.output_text, plain.usage.output_tokens)
    events = list(respond(c, max_output_tokens=4, background=True, stream=True))
    assert events[0].response.status == "queued" and events[-1].response.output_text == plain.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    again = list(c.responses.retrieve(events[0].response.id, stream=True, starting_after=2))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events[3:]]
    status, body, _ = request(srv, "POST", "/v1/responses", {"model": MODEL, "input": "x", "background": True,
                                                             "store": False})
    assert status == 400 and body["error"]["param"] == "background" and "store=true" in body["error"]["message"]


def test_cancel_a_background_response(stored):
    """POST /v1/responses/{id}/cancel ends a background response that runs: 'cancelled', its engine request
    aborted and its KV blocks freed; a second cancel answers the same. A response made without background
    is a 400, an unknown id a 404."""
    srv, c = stored
    r = respond(c, max_output_tokens=400, background=True)
    cancelled = c.responses.cancel(r.id)
    assert cancelled.status == "cancelled" and c.responses.retrieve(r.id).status == "cancelled"
    assert c.responses.cancel(r.id).model_dump() == cancelled.model_dump()
    m = metrics(srv)
    assert [metric(m, "pocketcupy_" + k) for k in ("num_requests_running", "requests_in_flight", "kv_blocks_used")] \
        == [0, 0, 0]
    status, body, _ = request(srv, "POST", f"/v1/responses/{respond(c, max_output_tokens=1).id}/cancel")
    assert status == 400 and body["error"]["param"] == "response_id" and "background=true" in body["error"]["message"]
    assert request(srv, "POST", "/v1/responses/resp_none/cancel")[0] == 404


def test_failed_responses_are_stored(stored):
    """A response whose generation fails after it was accepted is stored 'failed' with its error (as OpenAI keeps
    it; it was not stored: a 404), streamed or in the background."""
    srv, c = stored
    kw = failing(srv)
    final = list(respond(c, stream=True, **kw))[-1].response
    saved = c.responses.retrieve(final.id)
    assert saved.status == "failed" and saved.error == final.error and saved.error.code == "invalid_prompt"
    failed = settled(c, respond(c, background=True, **kw))
    assert failed.status == "failed" and failed.error == final.error


def test_truncation_auto_drops_the_oldest_items(stored):
    """A conversation over the context (512 tokens here) is the context 400 with truncation 'disabled'; with
    'auto' (it was a 400) its oldest turns go, as few as make it fit (the same prompt as the conversation
    sent without them); the stored conversation keeps them all. A last message over the context is the 400."""
    srv, c = stored
    turns = [{"role": "user", "content": "Tell me about Rome. " * 120},
             {"role": "assistant", "content": "Rome is old."}, {"role": "user", "content": "How old?"},
             {"role": "assistant", "content": "Very."}, {"role": "user", "content": "Say it again."}]
    kw = {"input": turns, "instructions": "Be brief.", "max_output_tokens": 1}
    status, err, _ = request(srv, "POST", "/v1/responses", dict(kw, model=MODEL))
    assert status == 400 and err["error"]["param"] == "input"
    r = respond(c, truncation="auto", **kw)
    assert r.truncation == "auto" and r.status != "failed"
    assert r.usage.input_tokens == respond(c, **dict(kw, input=turns[2:], store=False)).usage.input_tokens
    assert len(c.responses.input_items.list(r.id).data) == len(turns)
    status, counted, _ = request(srv, "POST", "/v1/responses/input_tokens", dict(kw, truncation="auto"))
    assert status == 200 and counted["input_tokens"] == r.usage.input_tokens
    status, err, _ = request(srv, "POST", "/v1/responses", dict(kw, model=MODEL, input=turns[:1], truncation="auto"))
    assert status == 400 and err["error"]["param"] == "input"


def test_negative_responses_store_is_a_startup_error():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "serve.py"), "--responses-store", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "responses_store: must be >= 0" in out.stderr, out.stderr

"""Structured output through the real server with the official `openai` client: response_format
json_schema and json_object (streaming and not), vLLM's guided_* fields on both endpoints, 400s
naming the bad field, and the structured-output metrics."""
import json
import re

import jsonschema
import openai
import pytest

from tests.test_server_api import _wait_idle
from tests.test_server_harness import MODEL, client, metrics, request, server  # noqa: F401
from tests.test_server_metrics import moved
from tests.test_structured_params import ARITH_LARK

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
                                                                               "maximum": 120}}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


def chat(client, **kw):
    return client.chat.completions.create(model=MODEL, **{"messages": ASK, "max_tokens": 64, "temperature": 0, **kw})


def streamed_text(chunks) -> tuple[str, list]:
    chunks = list(chunks)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), \
        [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


def test_chat_json_schema(client):
    whole = chat(client, response_format=JSON_SCHEMA)
    c = whole.choices[0]
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), PERSON)
    text, finals = streamed_text(chat(client, response_format=JSON_SCHEMA, stream=True))
    assert text == c.message.content and finals == ["stop"]


def test_chat_json_object(client):
    kw = dict(response_format={"type": "json_object"}, max_tokens=96,
              messages=[{"role": "user", "content": "Return a JSON object with the capital of France."}])
    whole = chat(client, **kw).choices[0]
    assert whole.finish_reason == "stop" and isinstance(json.loads(whole.message.content), dict)
    text, finals = streamed_text(chat(client, stream=True, **kw))
    assert text == whole.message.content and finals == ["stop"]


def test_chat_json_schema_n_and_logprobs(client):
    r = chat(client, response_format=JSON_SCHEMA, n=2, temperature=0.9, seed=3, logprobs=True, top_logprobs=2)
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), PERSON)
        assert "".join(t.token for t in c.logprobs.content) == c.message.content


def test_openai_parse_helpers_parse_a_pydantic_model(client):
    """The openai client's parse helpers send the model's strict JSON schema (chat's response_format,
    Responses' text.format) and parse the reply into the model; cut by max_tokens, parse() raises."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    r = client.beta.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person, max_tokens=48,
                                           temperature=0)
    assert r.choices[0].finish_reason == "stop" and isinstance(r.choices[0].message.parsed, Person)
    resp = client.responses.parse(model=MODEL, input=ASK[0]["content"], text_format=Person, max_output_tokens=48,
                                  temperature=0)
    assert resp.status == "completed" and resp.output_parsed == r.choices[0].message.parsed
    with pytest.raises(openai.LengthFinishReasonError):
        client.beta.chat.completions.parse(model=MODEL, messages=ASK, response_format=Person, max_tokens=3)


def test_completions_guided_fields(client):
    def comp(**extra):
        return client.completions.create(model=MODEL, prompt="The first moon landing was on", max_tokens=24,
                                         temperature=0, extra_body=extra).choices[0]

    date = comp(guided_regex=r" \d{4}-\d{2}-\d{2}")
    assert date.finish_reason == "stop" and re.fullmatch(r" \d{4}-\d{2}-\d{2}", date.text)
    assert comp(guided_choice=[" yes", " no"]).text in (" yes", " no")
    expr = comp(guided_grammar=ARITH_LARK).text
    assert re.fullmatch(r"[0-9+\-*/()]+", expr)
    person = client.completions.create(model=MODEL, prompt="A person as JSON:", max_tokens=64, temperature=0,
                                       extra_body={"guided_json": PERSON}).choices[0]
    jsonschema.validate(json.loads(person.text), PERSON)
    chunks = list(client.completions.create(model=MODEL, prompt="A person as JSON:", max_tokens=64, temperature=0,
                                            stream=True, extra_body={"guided_json": PERSON}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == person.text


def test_chat_guided_json_and_vllm_structured_outputs(client):
    a = chat(client, extra_body={"guided_json": PERSON}).choices[0].message.content
    b = chat(client, extra_body={"structured_outputs": {"json": PERSON}}).choices[0].message.content
    c = chat(client, response_format=JSON_SCHEMA).choices[0].message.content
    assert a == b == c
    jsonschema.validate(json.loads(a), PERSON)


BAD = [  # (path, extra body fields, param)
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
     "response_format.json_schema.name"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": PERSON}}},
     "response_format.json_schema.name"),
    (CHAT, {"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "oops": 1}}},
     "response_format.json_schema.oops"),
    (CHAT, {"response_format": {"type": "yaml"}}, "response_format.type"),
    (CHAT, {"response_format": {}}, "response_format.type"),
    (CHAT, {"response_format": "json"}, "response_format"),
    (CHAT, {"guided_regex": "a(b"}, "guided_regex"),
    (CHAT, {"guided_grammar": "start: nope"}, "guided_grammar"),
    (CHAT, {"guided_choice": []}, "guided_choice"),
    (CHAT, {"guided_json": "{not json"}, "guided_json"),
    (CHAT, {"structured_outputs": {"regex": "(["}}, "structured_outputs"),
    (CHAT, {"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    (CHAT, {"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    (CHAT, {"response_format": {"type": "json_object"}, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tool_choice"),
    (COMP, {"guided_json": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}}}, "guided_json"),
    (COMP, {"guided_grammar": "root ::= missing"}, "guided_grammar"),
    (COMP, {"guided_regex": "[0-9]+\\"}, "guided_regex"),  # (llguidance dropped the backslash)
    # (it gave 9223372036854775807, finish_reason "stop")
    (COMP, {"guided_json": {"type": "integer", "minimum": 1e308, "maximum": 1e308}}, "guided_json"),
    (COMP, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format.json_schema.schema"),
    # compiles, but no output matches it (no first token): found when compiled against the tokenizer
    # (it was a 200 with empty content and finish_reason "abort")
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
     "response_format.json_schema.schema"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}},
            "stream": True}, "response_format.json_schema.schema"),
    (COMP, {"guided_json": {"$ref": "#"}}, "guided_json"),
    (CHAT, {"structured_outputs": {"json": {"$ref": "#"}}}, "structured_outputs"),
    (CHAT, {"tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}]},
     "tools[0].function.parameters"),
]


@pytest.mark.parametrize("path,extra,param", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_constraints_are_400_naming_the_field(server, path, extra, param):
    body = {"model": MODEL, "max_tokens": 4, **({"messages": ASK} if path == CHAT else {"prompt": "hi"}), **extra}
    status, resp, _ = request(server, "POST", path, body)
    assert status == 400, resp
    assert resp["error"]["param"] == param and resp["error"]["type"] == "invalid_request_error", resp


def test_bad_schema_through_the_client(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}})
    assert "response_format.json_schema.schema" in str(e.value)


def test_unsatisfiable_schema_is_a_400_through_the_client(client):
    """A schema that compiles but that no output matches ({"$ref": "#"}, its own definition) was a 200 with
    empty content and finish_reason "abort"; now a 400 naming the field, and the server goes on."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, stream=stream,
                 response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}})
        assert e.value.body["param"] == "response_format.json_schema.schema"
        assert e.value.body["message"].startswith("response_format.json_schema.schema: the constraint cannot")
    jsonschema.validate(json.loads(chat(client, response_format=JSON_SCHEMA).choices[0].message.content), PERSON)


def test_no_token_left_is_a_400_naming_bad_words(client, server):
    """guided_choice ["yes"] with bad_words ["yes"] forbids every token: the sampler drew from NaN probabilities
    and the request ended with finish_reason "abort" (an llguidance error in the log). Now the engine fails it: a
    400 naming bad_words, streamed an error chunk with the 400's own type, code and param (was "server_error"),
    each a finished request of reason "error". The message names guided_choice, the field the client sent, where it
    said structured_outputs (the engine's name for it, a field the client never sent)."""
    kw = {"model": MODEL, "prompt": "Say yes", "max_tokens": 4,
          "extra_body": {"guided_choice": ["yes"], "bad_words": ["yes"]}}
    m0 = _wait_idle(server)
    for stream in (False, True):
        with pytest.raises(openai.APIError) as e:
            out = client.completions.create(stream=stream, **kw)
            list(out) if stream else None
        body = e.value.body
        assert (body["param"], body["type"], body["code"]) == ("bad_words", "invalid_request_error", "invalid_value")
        assert body["message"].startswith("bad_words: with guided_choice, it forbids every token"), body
    assert moved(m0, _wait_idle(server)) == {"error": 2}


def test_metrics_count_constrained_requests(client, server):
    before = metrics(server)
    chat(client, response_format=JSON_SCHEMA, max_tokens=32)
    after = metrics(server)
    key = ("pocketcupy_structured_requests_total", frozenset())
    assert after[key] == before.get(key, 0) + 1
    count = ("pocketcupy_structured_mask_seconds_count", frozenset())
    assert after[count] > before.get(count, 0)
    assert after[("pocketcupy_structured_mask_seconds_bucket", frozenset({("le", "+Inf")}))] == after[count]

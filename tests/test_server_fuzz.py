"""Every POST route under random damage to a valid request (fields set to any JSON value, removed,
or added), through the server's own routes in process on the real SmolLM2: the answer is a 200 or a
4xx with an error body, never a 500, and no request is left in the engine afterwards."""
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pocketcupy import EngineArgs
from pocketcupy.server.app import create_app
from pocketcupy.server.state import ServerConfig, ServerState

from tests.test_server_harness import MODEL

MSG = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                     "properties": {"x": {"type": "integer"}}}}}
ROUTES = {  # a valid body of each route, and fields to damage beyond its own
    "/v1/chat/completions": ({"model": MODEL, "messages": MSG, "max_tokens": 3},
                             ["n", "stream", "tools", "tool_choice", "response_format", "logprobs", "top_logprobs",
                              "stop", "temperature", "seed", "stream_options", "logit_bias", "structured_outputs"]),
    "/v1/completions": ({"model": MODEL, "prompt": "Hi", "max_tokens": 3},
                        ["echo", "logprobs", "suffix", "n", "stream", "prompt_logprobs", "best_of", "min_tokens"]),
    "/v1/responses": ({"model": MODEL, "input": "Hi", "max_output_tokens": 3},
                      ["instructions", "tools", "text", "reasoning", "include", "previous_response_id", "store"]),
    "/v1/messages": ({"model": MODEL, "messages": MSG, "max_tokens": 3},
                     ["system", "tools", "tool_choice", "thinking", "stop_sequences", "stream", "metadata"]),
    "/v1/embeddings": ({"model": MODEL, "input": "Hi"}, ["encoding_format", "dimensions", "pooling", "normalize"]),
    "/v1/score": ({"model": MODEL, "text_1": "a", "text_2": ["b", "c"]}, ["pooling", "truncate_prompt_tokens"]),
    "/v1/rerank": ({"model": MODEL, "query": "a", "documents": ["b", "c"]}, ["top_n", "return_documents"]),
    "/tokenize": ({"model": MODEL, "prompt": "Hi"}, ["messages", "add_special_tokens", "return_token_strs"]),
    "/detokenize": ({"model": MODEL, "tokens": [1, 2]}, []),
}

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 40),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["", "auto", "none", "required", "mean", "json_object", "text", MODEL]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)


@pytest.fixture(scope="module")
def app(smollm2_gguf):
    state = ServerState(ServerConfig(engine_args=EngineArgs(model=smollm2_gguf, device="cpu", progress=False,
                                                            max_model_len=512),
                                     served_model_names=[MODEL]))
    state.load()
    yield state, create_app(state).test_client()
    state.shutdown(30)


@st.composite
def damaged(draw):
    path = draw(st.sampled_from(sorted(ROUTES)))
    body, extra = ROUTES[path]
    body = dict(body)
    names = sorted(set(body) | set(extra)) + ["x_unknown"]
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        if draw(st.booleans()) and name in body:
            del body[name]
        else:
            body[name] = draw(st.one_of(VALUES, st.just(TOOL), st.just([TOOL]), st.just(MSG)))
    for k, most in (("max_tokens", 4), ("max_output_tokens", 4), ("n", 2), ("best_of", 2), ("top_n", 3)):
        if isinstance(body.get(k), int) and not isinstance(body[k], bool) and body[k] > most:
            body[k] = most   # (what a valid value costs on the CPU, not what is being checked)
    return path, body


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=damaged())
def test_any_damage_is_a_200_or_an_error_body(app, case):
    state, client = app
    path, body = case
    raw = json.dumps(body, allow_nan=True)   # (NaN and Infinity too: Python's JSON parser takes them)
    resp = client.post(path, data=raw, content_type="application/json")
    data = resp.get_data()
    assert resp.status_code in (200, 400, 404, 422), (resp.status_code, data[:300], body)
    if resp.status_code != 200:
        err = json.loads(data)["error"]
        assert isinstance(err["message"], str) and err["message"], err
    for _ in range(200):   # a stream's or an aborted request's last step may still be in flight
        if not state.engine.has_unfinished_requests():
            break
        time.sleep(0.01)
    assert not state.engine.has_unfinished_requests() and state.engine.scheduler.num_blocks_used == 0

"""POST /v1/embeddings through the official `openai` client and raw HTTP against a real server:
float and base64 encodings give the vectors Engine.embed gives; batches of strings and of token
ids; usage; vLLM's extensions; malformed requests get a 400 naming the field."""
import base64

import numpy as np
import pytest

from pocketcupy import PoolingParams

from tests.test_server_harness import MODEL, client, request, server  # noqa: F401

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today."]
LONG = "word " * 9000   # past SmolLM2's context


@pytest.fixture(scope="module")
def local(smollm2_engine):
    return smollm2_engine


def test_openai_client_float_and_base64(client, local):
    want = np.asarray([o.outputs.embedding for o in local.embed(TEXTS)])
    as_float = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    as_b64 = client.embeddings.create(model=MODEL, input=TEXTS)    # the client asks for base64 and decodes it
    for resp in (as_float, as_b64):
        assert resp.object == "list" and resp.model == MODEL and [d.index for d in resp.data] == [0, 1]
        got = np.asarray([d.embedding for d in resp.data])
        np.testing.assert_allclose(got, want, atol=1e-5)
        n = sum(len(local.tokenizer.encode(t)) for t in TEXTS)
        assert resp.usage.prompt_tokens == resp.usage.total_tokens == n


def test_raw_http_token_ids_and_extensions(server, local):
    ids = [local.tokenizer.encode(t) for t in TEXTS]
    status, body, _ = request(server, "POST", "/v1/embeddings",
                              {"model": MODEL, "input": ids, "encoding_format": "base64", "pooling": "mean",
                               "normalize": False, "truncate_prompt_tokens": 5, "user": "u-1",
                               "dimensions": local.config.hidden_size})
    assert status == 200, body
    got = np.asarray([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]])
    want = [o.outputs.embedding for o in local.embed(ids, PoolingParams("mean", False, 5))]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10} and body["id"].startswith("embd-")
    status, one, _ = request(server, "POST", "/v1/embeddings", {"model": MODEL, "input": ids[0]})
    assert status == 200 and len(one["data"]) == 1 and len(one["data"][0]["embedding"]) == local.config.hidden_size


def test_embed_dtype_and_endianness(server):
    """vLLM's embed_dtype and endianness pick the base64 bytes: each decodes to the float vector, rounded."""
    body = {"model": MODEL, "input": TEXTS[0]}
    want = np.asarray(request(server, "POST", "/v1/embeddings", body)[1]["data"][0]["embedding"], dtype=np.float32)
    for dtype, order, np_dtype in (("float32", "big", ">f4"), ("float32", "native", "=f4"),
                                   ("float16", "little", "<f2"), ("float16", "big", ">f2"), ("bfloat16", "big", ">u2")):
        status, got, _ = request(server, "POST", "/v1/embeddings", {**body, "encoding_format": "base64",
                                                                      "embed_dtype": dtype, "endianness": order})
        assert status == 200, got
        vec = np.frombuffer(base64.b64decode(got["data"][0]["embedding"]), dtype=np_dtype)
        if dtype == "bfloat16":
            vec = (vec.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_allclose(vec, want, rtol=0 if dtype == "float32" else 1e-2, atol=1e-4)
        assert dtype != "float32" or np.array_equal(vec, want)


def test_use_activation(server):
    """vLLM's use_activation (its newer name for normalize): false gives the raw pooled vector."""
    body = {"model": MODEL, "input": TEXTS[0]}
    raw = request(server, "POST", "/v1/embeddings", {**body, "normalize": False})[1]["data"][0]["embedding"]
    status, got, _ = request(server, "POST", "/v1/embeddings", {**body, "use_activation": False})
    assert status == 200 and got["data"][0]["embedding"] == raw, got
    unit = request(server, "POST", "/v1/embeddings", {**body, "use_activation": True})[1]["data"][0]["embedding"]
    assert abs(np.linalg.norm(unit) - 1) < 1e-5 and abs(np.linalg.norm(raw) - 1) > 1e-3
    status, err, _ = request(server, "POST", "/v1/embeddings", {**body, "use_activation": True, "normalize": False})
    assert status == 400 and err["error"]["param"] == "use_activation"


def test_add_special_tokens(server, local):
    """vLLM's add_special_tokens: false encodes the texts without the tokenizer's special tokens."""
    status, body, _ = request(server, "POST", "/v1/embeddings", {"model": MODEL, "input": TEXTS,
                                                                 "add_special_tokens": False})
    assert status == 200, body
    ids = [local.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    np.testing.assert_allclose([d["embedding"] for d in body["data"]],
                               [o.outputs.embedding for o in local.embed(ids)], atol=1e-5)
    assert body["usage"]["prompt_tokens"] == sum(map(len, ids))


def test_chat_messages(server, local):
    """vLLM's chat embedding request: the conversation as the template renders it (without the generation
    prompt unless asked) is embedded as one input."""
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    for gen in (False, True):
        ids = request(server, "POST", "/tokenize", {"messages": msgs, "add_generation_prompt": gen})[1]["tokens"]
        extra = {"add_generation_prompt": True} if gen else {}
        status, body, _ = request(server, "POST", "/v1/embeddings", {"model": MODEL, "messages": msgs, **extra})
        assert status == 200, body
        assert len(body["data"]) == 1 and body["usage"]["prompt_tokens"] == len(ids)
        np.testing.assert_allclose(body["data"][0]["embedding"], local.embed([ids])[0].outputs.embedding, atol=1e-5)
    for patch, param in (({"input": "hi"}, "messages"), ({"messages": []}, "messages"),
                         ({"messages": [{"role": "nobody", "content": "x"}]}, "messages[0].role")):
        status, resp, _ = request(server, "POST", "/v1/embeddings", {"model": MODEL, "messages": msgs, **patch})
        assert status == 400 and resp["error"]["param"] == param, resp


@pytest.mark.parametrize("patch, param", [
    ({"input": None}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[1, 2], "text"]}, "input"),
    ({"input": [10**9]}, "input"),
    ({"encoding_format": "int8"}, "encoding_format"),
    ({"dimensions": 8}, "dimensions"),
    ({"pooling": "max"}, "pooling"),
    ({"normalize": "yes"}, "normalize"),
    ({"add_special_tokens": 1}, "add_special_tokens"),
    ({"embed_dtype": "fp8_e4m3"}, "embed_dtype"),
    ({"endianness": "middle"}, "endianness"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"temperature": 0.5}, "temperature"),
    ({"input": LONG}, "input"),
])
def test_malformed_requests(server, patch, param):
    body = {"model": MODEL, "input": "hello", **patch}
    body = {k: v for k, v in body.items() if v is not None}
    status, resp, _ = request(server, "POST", "/v1/embeddings", body)
    assert status == 400 and resp["error"]["param"] == param, resp
    if patch.get("input") == LONG:
        assert resp["error"]["code"] == "context_length_exceeded" and "embedding" in resp["error"]["message"]


def test_unknown_model(server):
    status, resp, _ = request(server, "POST", "/v1/embeddings", {"model": "other", "input": "hello"})
    assert status == 404 and resp["error"]["param"] == "model"

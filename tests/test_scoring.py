"""Scoring over embeddings (vLLM's score and rerank for embedding models): Engine.score, and the
/score and /rerank routes of a real server, against the cosine similarity of Engine.embed's vectors
of the real SmolLM2; pairing rules, ordering, top_n, usage; malformed requests get a 400 naming
the field."""
import numpy as np
import pytest

from pocketcupy import Engine, PoolingParams, SamplingParams
from pocketcupy.scoring import cosine, score_pairs

from tests.test_server_harness import MODEL, request, server  # noqa: F401

QUERY = "What is the capital of France?"
DOCS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris.", "Horses eat grass."]


@pytest.fixture(scope="module")
def local(smollm2_engine):
    return smollm2_engine


def _cosines(local, first, second, pooling=None):
    a = [o.outputs.embedding for o in local.embed(first, pooling)]
    b = [o.outputs.embedding for o in local.embed(second, pooling)]
    a = a * len(b) if len(a) == 1 else a
    return [float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]


def test_pairing_and_cosine():
    assert score_pairs(1, 3) == [(0, 0), (0, 1), (0, 2)] and score_pairs(2, 2) == [(0, 0), (1, 1)]
    assert score_pairs(1, 1) == [(0, 0)]
    with pytest.raises(ValueError, match="text_2: 3 texts cannot be paired with 2"):
        score_pairs(2, 3)
    assert cosine([1, 0], [0, 2]) == 0 and cosine([1, 1], [2, 2]) == pytest.approx(1) and cosine([0, 0], [1, 0]) == 0


def test_engine_score_one_to_many_and_side_by_side(local):
    got = local.score(QUERY, DOCS)
    np.testing.assert_allclose([o.outputs.score for o in got], _cosines(local, [QUERY], DOCS), atol=1e-6)
    q_ids = local.tokenizer.encode(QUERY)
    assert got[1].prompt_token_ids == q_ids + local.tokenizer.encode(DOCS[1])
    mean = PoolingParams("mean", normalize=False)
    side = local.score(DOCS[:2], [QUERY, DOCS[2]], mean)
    np.testing.assert_allclose([o.outputs.score for o in side], _cosines(local, DOCS[:2], [QUERY, DOCS[2]], mean),
                               atol=1e-6)
    same = local.score(q_ids, [q_ids])   # token ids; a text scored against itself
    assert same[0].outputs.score == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("args, field", [((QUERY, []), "text_2"), (([], DOCS), "text_1"),
                                         ((DOCS[:2], DOCS), "text_2"), ((QUERY, 5), "text_2")])
def test_engine_score_bad_arguments(local, args, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        local.score(*args)


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_score_route(server, local, path):
    status, body, _ = request(server, "POST", path, {"model": MODEL, "text_1": QUERY, "text_2": DOCS})
    assert status == 200, body
    assert body["object"] == "list" and body["model"] == MODEL and body["id"].startswith("score-")
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"score"}
    np.testing.assert_allclose([d["score"] for d in body["data"]], _cosines(local, [QUERY], DOCS), atol=1e-5)
    n = sum(len(local.tokenizer.encode(t)) for t in [QUERY, *DOCS])
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}
    ids = [local.tokenizer.encode(t) for t in DOCS[:2]]
    status, side, _ = request(server, "POST", path, {"model": MODEL, "text_1": ids, "text_2": DOCS[1:],
                                                     "pooling": "mean", "truncate_prompt_tokens": 4})
    assert status == 200, side
    mean = PoolingParams("mean", truncate_prompt_tokens=4)
    np.testing.assert_allclose([d["score"] for d in side["data"]], _cosines(local, ids, DOCS[1:], mean), atol=1e-5)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_route(server, local, path):
    want = _cosines(local, [QUERY], DOCS)
    order = sorted(range(3), key=lambda j: -want[j])
    status, body, _ = request(server, "POST", path, {"model": MODEL, "query": QUERY,
                                                     "documents": [DOCS[0], {"text": DOCS[1]}, DOCS[2]]})
    assert status == 200, body
    assert body["model"] == MODEL and body["id"].startswith("rerank-")
    assert [r["index"] for r in body["results"]] == order
    assert [r["document"]["text"] for r in body["results"]] == [DOCS[j] for j in order]
    np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], [want[j] for j in order], atol=1e-5)
    n = sum(len(local.tokenizer.encode(t)) for t in [QUERY, *DOCS])
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    status, top, _ = request(server, "POST", path, {"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 2,
                                                    "return_documents": False})
    assert status == 200 and [r["index"] for r in top["results"]] == order[:2]
    assert all(set(r) == {"index", "relevance_score"} for r in top["results"])


def test_model_is_optional_as_in_vllm(server):
    """vLLM's score and rerank requests may leave out 'model' (the served one answers); a wrong one is a 404."""
    status, score, _ = request(server, "POST", "/score", {"text_1": QUERY, "text_2": DOCS[:2]})
    assert status == 200 and score["model"] == MODEL and len(score["data"]) == 2, score
    status, rerank, _ = request(server, "POST", "/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200 and rerank["model"] == MODEL and len(rerank["results"]) == 3, rerank
    status, err, _ = request(server, "POST", "/rerank", {"model": "other", "query": QUERY, "documents": DOCS})
    assert status == 404 and err["error"]["param"] == "model"


@pytest.mark.parametrize("path, patch, param", [
    ("/v1/score", {"text_1": None}, "text_1"),
    ("/v1/score", {"text_2": []}, "text_2"),
    ("/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_2"),
    ("/v1/score", {"text_2": [10**9]}, "text_2"),
    ("/v1/score", {"text_2": "word " * 9000}, "text_2"),
    ("/v1/score", {"pooling": "max"}, "pooling"),
    ("/v1/score", {"normalize": False}, "normalize"),
    ("/v1/rerank", {"query": None}, "query"),
    ("/v1/rerank", {"query": [QUERY, QUERY]}, "query"),
    ("/v1/rerank", {"documents": "one text"}, "documents"),
    ("/v1/rerank", {"documents": []}, "documents"),
    ("/v1/rerank", {"documents": [1, 2, 3]}, "documents"),
    ("/v1/rerank", {"documents": [{"title": "x"}]}, "documents"),
    ("/v1/rerank", {"documents": [{"text": 5}]}, "documents"),   # not token id 5
    ("/v1/rerank", {"documents": [{"text": 1}, {"text": 2}]}, "documents"),
    ("/v1/rerank", {"documents": [{"text": "a", "title": "t"}]}, "documents"),
    ("/v1/rerank", {"top_n": -1}, "top_n"),
    ("/v1/rerank", {"return_documents": "yes"}, "return_documents"),
    ("/v1/rerank", {"rank_fields": ["text"]}, "rank_fields"),
])
def test_malformed_requests(server, path, patch, param):
    base = {"model": MODEL, "text_1": QUERY, "text_2": DOCS} if "score" in path else \
        {"model": MODEL, "query": QUERY, "documents": DOCS}
    body = {k: v for k, v in {**base, **patch}.items() if v is not None}
    status, resp, _ = request(server, "POST", path, body)
    assert status == 400 and resp["error"]["param"] == param, resp


RERANK_Q = ("<|im_start|>system\nJudge whether the Document meets the requirements of the Query. Answer only "
            "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Query>: What is the capital of France?\n")
RERANK_DOCS = [f"<Document>: {d}<|im_end|>\n<|im_start|>assistant\n" for d in DOCS]


@pytest.fixture(scope="module")
def reranker(smollm2_gguf):
    return Engine(smollm2_gguf, device="cpu", progress=False, score_tokens="no,yes")


def test_reranker_scores_are_p_yes_against_p_no(reranker):
    """score_tokens "no,yes" (Qwen3-Reranker's way): a pair's score is P(yes) / (P(yes) + P(no)) after
    its tokens; here against the full-vocabulary log-probabilities the prompt path gives those two
    tokens appended."""
    no, yes = reranker.score_token_ids
    assert reranker.tokenizer.decode([no]) == "no" and reranker.tokenizer.decode([yes]) == "yes"
    got = reranker.score(RERANK_Q, RERANK_DOCS)
    for out, doc in zip(got, RERANK_DOCS):
        ids = reranker.tokenizer.encode(RERANK_Q) + reranker.tokenizer.encode(doc, add_special_tokens=False)
        assert out.prompt_token_ids == ids
        lp = {t: reranker.generate(ids + [t], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
              .prompt_logprobs[-1][t].logprob for t in (no, yes)}
        assert out.outputs.score == pytest.approx(1 / (1 + np.exp(lp[no] - lp[yes])), abs=1e-4)


@pytest.mark.parametrize("spec", ["yes", "no,yes,maybe", "no,definitely yes", None])
def test_bad_score_tokens(reranker, spec):
    from pocketcupy.scoring import classifier_token_ids

    with pytest.raises(ValueError, match="^score_tokens: must be two texts that are one token each"):
        classifier_token_ids(reranker.tokenizer, spec)


def test_reranker_routes(smollm2_gguf, reranker):
    from pocketcupy import EngineArgs
    from pocketcupy.server.app import create_app
    from pocketcupy.server.state import ServerConfig, ServerState

    state = ServerState(ServerConfig(engine_args=EngineArgs(model=smollm2_gguf, device="cpu", progress=False,
                                                            score_tokens="no,yes"), served_model_names=[MODEL]))
    state.load()
    try:
        app = create_app(state).test_client()
        want = [o.outputs.score for o in reranker.score(RERANK_Q, RERANK_DOCS)]
        r = app.post("/v1/rerank", json={"model": MODEL, "query": RERANK_Q, "documents": RERANK_DOCS}).get_json()
        assert [x["index"] for x in r["results"]] == sorted(range(3), key=lambda j: -want[j])
        np.testing.assert_allclose([x["relevance_score"] for x in r["results"]], sorted(want, reverse=True),
                                   atol=1e-5)
        s = app.post("/v1/score", json={"model": MODEL, "text_1": RERANK_Q, "text_2": RERANK_DOCS}).get_json()
        np.testing.assert_allclose([d["score"] for d in s["data"]], want, atol=1e-5)
        n = sum(len(o.prompt_token_ids) for o in reranker.score(RERANK_Q, RERANK_DOCS))
        assert s["usage"]["prompt_tokens"] == r["usage"]["prompt_tokens"] == n
    finally:
        state.shutdown(30)

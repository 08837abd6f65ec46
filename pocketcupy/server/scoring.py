"""vLLM's score and rerank routes, for any model (scoring.py: a pair's score is the cosine similarity
of the two texts' embeddings, as vLLM scores with embedding models, or with score_tokens a reranker's
P(yes) after the pair): POST /score, /v1/score (text_1 against text_2) and /rerank, /v1/rerank,
/v2/rerank (a query against documents, in Jina's and Cohere's shape)."""
from __future__ import annotations

import time

from ..scoring import classifier_params, classifier_score, cosine, score_pairs
from .completions import parse_prompts
from .embeddings import MAX_INPUTS, fitted_ids, pooled, pooling_params
from .generation import Job
from .protocol import ApiError, Fields, bad, optional_model
from .responses import new_id


def handle_score(state, body, gone) -> dict:
    """{"model", "text_1", "text_2" (each a text, texts, token ids or lists of them: one text_1 scored
    against each text_2, or as many side by side); vLLM's "truncate_prompt_tokens", "priority"; ours
    "pooling"} -> {"id", "object": "list", "created", "model", "data": [{"index", "object": "score",
    "score"}], "usage"}."""
    tok = state.engine.tokenizer
    f = Fields(body)
    model = optional_model(f, state.config.served_model_names)
    first = parse_prompts(f.require("text_1"), tok, "text_1", MAX_INPUTS)
    second = parse_prompts(f.require("text_2"), tok, "text_2", MAX_INPUTS, not _reranker(state))
    try:
        pairs = score_pairs(len(first), len(second))
    except ValueError as e:
        raise bad("text_2", str(e).partition(": ")[2]) from None
    rid, scores, n = _scored(state, f, gone, "score", (first, "text_1"), (second, "text_2"), pairs)
    data = [{"index": k, "object": "score", "score": score} for k, score in enumerate(scores)]
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}


def handle_rerank(state, body, gone) -> dict:
    """{"model", "query" (a text or token ids), "documents" (texts, {"text": ...} objects or token-id
    lists), "top_n" (0 or absent: all), "return_documents" (default true); vLLM's
    "truncate_prompt_tokens", "priority"; ours "pooling"} -> {"id", "model", "usage", "results":
    [{"index", "document": {"text"}, "relevance_score"}]}, the most relevant first."""
    tok = state.engine.tokenizer
    f = Fields(body)
    model = optional_model(f, state.config.served_model_names)
    query = f.require("query")
    if isinstance(query, list) and query and all(isinstance(q, str) for q in query):
        raise bad("query", "'query' must be one text (or its token ids)")
    query = parse_prompts(query, tok, "query", 1)
    docs = f.require("documents")
    if not isinstance(docs, list) or not docs or all(isinstance(d, int) for d in docs):
        raise bad("documents", "'documents' must be a non-empty array of texts, {\"text\": ...} objects or "
                               "token-id arrays")
    for d in docs:   # a {"text": 5} unwrapped to 5 joined its neighbours as one token-id document
        if isinstance(d, dict) and not (set(d) == {"text"} and isinstance(d["text"], str)):
            raise bad("documents", "a document object must be {\"text\": <string>}")
    docs = [d["text"] if isinstance(d, dict) else d for d in docs]
    docs = parse_prompts(docs, tok, "documents", MAX_INPUTS, not _reranker(state))
    top_n = f.int("top_n", 0, 0)
    with_docs = f.bool("return_documents", True)
    pairs = [(0, j) for j in range(len(docs))]
    rid, scores, n = _scored(state, f, gone, "rerank", (query, "query"), (docs, "documents"), pairs)
    order = sorted(range(len(docs)), key=lambda j: -scores[j])[:top_n or None]
    results = [{"index": j, **({"document": {"text": docs[j][1]}} if with_docs else {}),
                "relevance_score": scores[j]} for j in order]
    return {"id": rid, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}


def _reranker(state) -> bool:
    return state.engine.score_token_ids is not None


def _scored(state, f: Fields, gone, kind: str, first: tuple, second: tuple,
            pairs: list[tuple[int, int]]) -> tuple[str, list[float], int]:
    """Reads the request's pooling fields (its last), then scores the (i, j) pairs of the first and
    second (prompts, field) groups in one job: (the request id, the scores, the prompt tokens). By
    the texts' embeddings, or as a reranker (score_tokens) by P(yes) after each pair's tokens."""
    engine = state.engine
    pooling = pooling_params(f, engine)
    priority = f.int("priority", 0)
    f.reject_unknown()
    rid = new_id(kind)
    if not _reranker(state):
        ids = fitted_ids(first[0], pooling, engine, first[1]) + fitted_ids(second[0], pooling, engine, second[1])
        vecs = pooled(state, rid, ids, pooling, priority, gone, second[1])
        return rid, [cosine(vecs[i], vecs[len(first[0]) + j]) for i, j in pairs], sum(len(p) for p in ids)
    ids = fitted_ids([(first[0][i][0] + second[0][j][0], "") for i, j in pairs], pooling, engine, second[1])
    with Job(state, rid, ids, classifier_params(engine.score_token_ids), priority, gone, {"prompt": second[1]},
             generates=False) as job:
        finals = job.results()
    if any(not out.outputs[0].logprobs for out in finals):   # aborted: the server stops
        raise ApiError(503, "the server is shutting down: the scores were not finished")
    return rid, [classifier_score(out, engine.score_token_ids) for out in finals], sum(len(p) for p in ids)

"""vLLM's score and rerank routes, for any model, over its embeddings (scoring.py: a pair's score is
the cosine similarity of the two texts' embeddings, as vLLM scores with embedding models):
POST /score, /v1/score (text_1 against text_2) and /rerank, /v1/rerank, /v2/rerank (a query against
documents, in Jina's and Cohere's shape)."""
from __future__ import annotations

import time

from ..scoring import cosine, score_pairs
from .completions import parse_prompts
from .embeddings import MAX_INPUTS, fitted_ids, pooled, pooling_params
from .protocol import Fields, bad, check_model
from .responses import new_id


def handle_score(state, body, gone) -> dict:
    """{"model", "text_1", "text_2" (each a text, texts, token ids or lists of them: one text_1 scored
    against each text_2, or as many side by side); vLLM's "truncate_prompt_tokens", "priority"; ours
    "pooling"} -> {"id", "object": "list", "created", "model", "data": [{"index", "object": "score",
    "score"}], "usage"}."""
    engine = state.engine
    f = Fields(body)
    model = check_model(f, state.config.served_model_names)
    first = parse_prompts(f.require("text_1"), engine.tokenizer, "text_1", MAX_INPUTS)
    second = parse_prompts(f.require("text_2"), engine.tokenizer, "text_2", MAX_INPUTS)
    try:
        pairs = score_pairs(len(first), len(second))
    except ValueError as e:
        raise bad("text_2", str(e).partition(": ")[2]) from None
    rid, vecs, n = _embedded(state, f, gone, "score", [(first, "text_1"), (second, "text_2")])
    data = [{"index": k, "object": "score", "score": cosine(vecs[i], vecs[len(first) + j])}
            for k, (i, j) in enumerate(pairs)]
    return {"id": rid, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}


def handle_rerank(state, body, gone) -> dict:
    """{"model", "query" (a text or token ids), "documents" (texts, {"text": ...} objects or token-id
    lists), "top_n" (0 or absent: all), "return_documents" (default true); vLLM's
    "truncate_prompt_tokens", "priority"; ours "pooling"} -> {"id", "model", "usage", "results":
    [{"index", "document": {"text"}, "relevance_score"}]}, the most relevant first."""
    engine = state.engine
    f = Fields(body)
    model = check_model(f, state.config.served_model_names)
    query = f.require("query")
    if isinstance(query, list) and query and all(isinstance(q, str) for q in query):
        raise bad("query", "'query' must be one text (or its token ids)")
    query = parse_prompts(query, engine.tokenizer, "query", 1)
    docs = f.require("documents")
    if not isinstance(docs, list) or not docs or all(isinstance(d, int) for d in docs):
        raise bad("documents", "'documents' must be a non-empty array of texts, {\"text\": ...} objects or "
                               "token-id arrays")
    docs = [d["text"] if isinstance(d, dict) and set(d) == {"text"} else d for d in docs]
    docs = parse_prompts(docs, engine.tokenizer, "documents", MAX_INPUTS)
    top_n = f.int("top_n", 0, 0)
    with_docs = f.bool("return_documents", True)
    rid, vecs, n = _embedded(state, f, gone, "rerank", [(query, "query"), (docs, "documents")])
    scores = [cosine(vecs[0], v) for v in vecs[1:]]
    order = sorted(range(len(docs)), key=lambda j: -scores[j])[:top_n or None]
    results = [{"index": j, **({"document": {"text": docs[j][1]}} if with_docs else {}),
                "relevance_score": scores[j]} for j in order]
    return {"id": rid, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}


def _embedded(state, f: Fields, gone, kind: str, groups: list[tuple[list, str]]) -> tuple[str, list, int]:
    """Reads the request's pooling fields (its last), then embeds the prompts of every (prompts, field)
    group in one job: (the request id, the vectors in order, their tokens)."""
    pooling = pooling_params(f, state.engine)
    priority = f.int("priority", 0)
    f.reject_unknown()
    ids = [p for prompts, field in groups for p in fitted_ids(prompts, pooling, state.engine, field)]
    rid = new_id(kind)
    return rid, pooled(state, rid, ids, pooling, priority, gone, groups[-1][1]), sum(len(p) for p in ids)

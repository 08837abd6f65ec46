"""Scores of text pairs, as vLLM scores and reranks: by default the cosine similarity of the two
texts' pooled final hidden states (vLLM's way with embedding models); with score_tokens "no,yes", a
reranker's (Qwen3-Reranker's; vLLM's classifier_from_token): the pair's tokens, the first text's then
the second's, are a prompt, and the score is the probability of "yes" against "no" as its next token."""
from __future__ import annotations

import math

import numpy as np

from .outputs import ScoringOutput, ScoringRequestOutput
from .sampling import SamplingParams


def score_pairs(n1: int, n2: int, field: str = "text_2") -> list[tuple[int, int]]:
    """The (first, second) index pairs to score: one first text against each second (1:N), or the
    texts side by side (N:N); field names the second argument in the error."""
    if n1 == 1:
        return [(0, j) for j in range(n2)]
    if n1 == n2:
        return [(i, i) for i in range(n1)]
    raise ValueError(f"{field}: {n2} texts cannot be paired with {n1}: give one first text (scored against "
                     "each) or as many as the second")


def cosine(a, b) -> float:
    """Their cosine similarity (0 where either is all zeros)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norms if norms else 0.0


def classifier_token_ids(tokenizer, spec: str) -> tuple[int, int]:
    """The ids of score_tokens' "no,yes": two texts, each one token of the vocabulary."""
    texts = spec.split(",") if isinstance(spec, str) else []
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    if len(texts) != 2 or any(len(i) != 1 for i in ids):
        raise ValueError(f"score_tokens: must be two texts that are one token each, as 'no,yes', got {spec!r} "
                         f"(tokens {ids})")
    return ids[0][0], ids[1][0]


def classifier_params(token_ids: tuple[int, int]) -> SamplingParams:
    """A scoring request's one step: the two tokens' log-probabilities, normalised between them."""
    return SamplingParams(max_tokens=1, temperature=0.0, allowed_token_ids=list(token_ids), logprobs=2)


def classifier_score(out, token_ids: tuple[int, int]) -> float:
    """P(second token) / (P(first) + P(second)) after the pair's prompt (its RequestOutput)."""
    return math.exp(out.outputs[0].logprobs[0][token_ids[1]].logprob)


def classifier_results(prompts: list[list[int]], outs: list, token_ids: tuple[int, int]) -> list:
    """ScoringRequestOutputs of a reranker's pairs: their prompts and final RequestOutputs."""
    return [ScoringRequestOutput(out.request_id, p, ScoringOutput(classifier_score(out, token_ids)))
            for p, out in zip(prompts, outs)]


def cosine_results(vecs: list, num_first: int, pairs: list[tuple[int, int]], request_ids) -> list:
    """ScoringRequestOutputs of embedded pairs: the first texts' EmbeddingRequestOutputs, then the
    second's, in vecs."""
    return [ScoringRequestOutput(rid, a.prompt_token_ids + b.prompt_token_ids,
                                 ScoringOutput(cosine(a.outputs.embedding, b.outputs.embedding)))
            for rid, (a, b) in zip(request_ids, ((vecs[i], vecs[num_first + j]) for i, j in pairs))]

"""Scores of text pairs from their embeddings, as vLLM scores and reranks with embedding models: a
pair's score is the cosine similarity of the two texts' pooled final hidden states."""
from __future__ import annotations

import numpy as np


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

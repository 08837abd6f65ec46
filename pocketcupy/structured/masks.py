"""Batched token masks: one llguidance call fills the packed allowed-token bits of every
constrained row (bit j of word w = token 32w + j, as the samplers take them)."""
from __future__ import annotations

import numpy as np
from llguidance.numpy import fill_next_token_bitmask_par


def mask_words(vocab: int) -> int:
    return (vocab + 31) // 32


def fill_bitmasks(executor, matchers, tokenizer_vocab: int, logits_width: int) -> np.ndarray:
    """uint32 [len(matchers), ceil(logits_width / 32)]. Ids the tokenizer does not have (a model's
    padded logits) are forbidden. A matcher that allows nothing gets an all-zero row."""
    buf = np.zeros((len(matchers), mask_words(tokenizer_vocab)), np.int32)  # llguidance wants its own width
    fill_next_token_bitmask_par(executor, [(m.ll, i) for i, m in enumerate(matchers)], buf)
    words = buf.view(np.uint32)
    limit = min(tokenizer_vocab, logits_width)
    if limit == tokenizer_vocab and limit % 32 == 0 and mask_words(logits_width) == words.shape[1]:
        return words
    out = np.zeros((len(matchers), mask_words(logits_width)), np.uint32)
    full, rest = divmod(limit, 32)
    out[:, :full] = words[:, :full]
    if rest:
        out[:, full] = words[:, full] & np.uint32((1 << rest) - 1)
    return out


def allow_only(words: np.ndarray, token_id: int) -> None:
    """Rewrite one packed row so that it allows token_id alone."""
    words[:] = 0
    words[token_id // 32] = np.uint32(1 << (token_id % 32))

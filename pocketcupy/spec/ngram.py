"""Prompt-lookup (n-gram) drafts: the tokens that followed the latest earlier occurrence of the
sequence's last n tokens, for the longest n in [n_min, n_max] that occurs (vLLM's "ngram" method,
llama.cpp's lookup decoding)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..sched.request import Request


class NgramProposer:
    resolves_every_step = False   # (proposes from the tokens known when it is called: Engine._step)

    def __init__(self, num_speculative_tokens: int, n_min: int, n_max: int):
        self.k, self.n_min, self.n_max = num_speculative_tokens, n_min, n_max

    def propose(self, reqs: list[Request], ks: list[int]) -> None:
        """Sets draft_token_ids of each request: at most its k of ks (none past its max_tokens)."""
        for r, k in zip(reqs, ks):
            r.draft_token_ids = self.draft(r.all_token_ids, min(k, r.max_tokens - r.num_output_tokens - 1))

    def draft(self, token_ids: Sequence[int], limit: int) -> list[int]:
        """Up to min(k, limit) draft tokens to follow token_ids ([] when no n-gram recurs). A match
        close to the end is continued through its own copy (as LZ77 does), so a repeating run of
        period p still yields k tokens, not p."""
        k = min(self.k, limit)
        if k <= 0 or len(token_ids) <= self.n_min:
            return []
        toks = np.asarray(token_ids, dtype=np.int64)
        L = len(toks)
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            # windows that start at 0..L-1-n: each has a token after it, and none is the suffix itself
            hits = np.flatnonzero((sliding_window_view(toks[:L - 1], n) == toks[L - n:]).all(axis=1))
            if hits.size:
                src = int(hits[-1]) + n
                out: list[int] = []
                for j in range(k):
                    out.append(int(toks[src + j]) if src + j < L else out[src + j - L])
                return out
        return []

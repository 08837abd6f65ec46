"""vLLM's `thinking_token_budget`: a sampled sequence's reasoning block cut at a number of tokens.

Counting starts after the start marker's tokens in the output, or at the output's first token when the
prompt already opened the block (starts_inside). Once `budget` tokens were counted without the end
marker, its tokens are forced one a step (the row's packed mask allows that token alone), so the block
ends there and the content follows; a block the model closes itself ends the counting. Budget 0 forces
the end marker at once."""
from __future__ import annotations

import numpy as np

from .structured.masks import allow_only, mask_words

OPEN, CLOSE = "<think>", "</think>"


def starts_inside(name: str | None, prompt: str) -> bool:
    """Whether reasoning parser `name` (None: none, read as qwen3) reads a reply to `prompt` as starting
    inside the reasoning: a prompt that ends with <think> opened the block; deepseek_r1 starts inside unless
    the prompt closed it (ends with </think>)."""
    tail = prompt.rstrip()
    return tail.endswith(OPEN) or (name == "deepseek_r1" and not tail.endswith(CLOSE))


class ThinkingBudget:
    """One sampled sequence's budget: before (the start marker awaited) -> counting -> forcing -> done."""

    def __init__(self, budget: int, start_ids: tuple[int, ...], end_ids: tuple[int, ...], inside: bool):
        self.budget, self.start, self.end = budget, tuple(start_ids), tuple(end_ids)
        self.count = 0      # reasoning tokens so far
        self.forced = 0     # end-marker tokens forced so far
        self._tail: tuple[int, ...] = ()   # the last output tokens, to find the markers in
        self.state = "before"
        if inside:
            self._start_counting()

    @property
    def done(self) -> bool:
        return self.state == "done"

    def forced_token(self) -> int | None:
        """The token the next step must sample, or None when it is free."""
        return self.end[self.forced] if self.state == "forcing" else None

    def accept(self, token_id: int) -> None:
        """Advance over a sampled token."""
        if self.state == "forcing":
            self.forced += 1
            if self.forced == len(self.end):
                self.state = "done"
            return
        if self.state == "done":
            return
        self._tail = (*self._tail, int(token_id))[-max(len(self.start), len(self.end)):]
        if self.state == "before":
            if self._tail[-len(self.start):] == self.start:
                self._start_counting()
        elif self._tail[-len(self.end):] == self.end:   # the model closed the block itself
            self.state = "done"
        else:
            self.count += 1
            self._check_spent()

    def _start_counting(self) -> None:
        self.state, self._tail = "counting", ()
        self._check_spent()

    def _check_spent(self) -> None:
        if self.count >= self.budget:
            self.state = "forcing"

    def mask(self, grammar_mask: np.ndarray | None, width: int) -> np.ndarray | None:
        """The row's packed mask for the next token: the grammar's (None: none), narrowed to the forced
        token while one is (a grammar that forbids it leaves no token: the request fails)."""
        token = self.forced_token()
        if token is None:
            return grammar_mask
        words = np.zeros(mask_words(width), np.uint32)
        allow_only(words, token)
        return words if grammar_mask is None else words & grammar_mask

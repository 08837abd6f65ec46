"""One sampled sequence's position in its grammar, and the trigger that starts it (a delayed start)."""
from __future__ import annotations

import logging

log = logging.getLogger("pocketcupy")


class SequenceMatcher:
    def __init__(self, ll_matcher, root: int = 0, start_after: tuple[int, ...] = (), repeat: bool = False):
        self.ll = ll_matcher          # llguidance.LLMatcher
        self.root = root              # which compilation of the grammar it was copied from
        self.error: str | None = None  # set when the grammar could not go on
        # Delayed start: while `trigger` is non-empty the sequence is free (no mask, the grammar does not
        # advance); the token after the output first holds these ids in a row is the grammar's first.
        # repeat: each complete structure makes the sequence free again until the trigger's next time.
        self.trigger = self._start_after = tuple(start_after)
        self._repeat = repeat and bool(start_after)
        self._tail: tuple[int, ...] = ()  # the last output tokens (up to len(trigger)) while waiting

    @property
    def waiting(self) -> bool:
        """The trigger has not appeared yet: no constraint on the next token."""
        return bool(self.trigger)

    def accept(self, token_id: int) -> bool:
        """Advance over a sampled token. True when the sequence must end: the structure is complete
        (only end-of-sequence could follow) or the matcher failed (then `error` says why)."""
        if self.waiting:
            self._tail = self._pushed(self._tail, token_id)
            if self._tail == self.trigger:
                self.trigger = self._tail = ()
            return False
        if self.error is not None:
            return True
        if not self.ll.consume_token(int(token_id)):
            self.fail(f"token {token_id} was rejected")
            return True
        if self._repeat and self.ll.is_stopped():   # free again, until the next trigger
            self.ll.reset()
            self.trigger = self._start_after
            return False
        return self.ll.is_stopped()

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of token_ids, from the start, the grammar accepts after the tokens so far (the
        matcher does not advance). Tokens up to and including a trigger still awaited are all free."""
        free = self._trigger_end(token_ids) if self.waiting else 0
        if free is None:
            return len(token_ids)
        if self.error is not None:
            return free
        return free + self.ll.validate_tokens([int(t) for t in token_ids[free:]])

    def _trigger_end(self, token_ids: list[int]) -> int | None:
        """The index in token_ids just past where the awaited trigger would complete, or None."""
        tail = self._tail
        for i, t in enumerate(token_ids):
            tail = self._pushed(tail, t)
            if tail == self.trigger:
                return i + 1
        return None

    def _pushed(self, tail: tuple[int, ...], token_id: int) -> tuple[int, ...]:
        return (*tail, int(token_id))[-len(self.trigger):]

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = (self.ll.get_error() or why)[:500]  # llguidance appends its whole parser state
            log.warning("structured output stopped: %s", self.error)


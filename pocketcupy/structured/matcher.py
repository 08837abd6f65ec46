"""One sampled sequence's position in its grammar."""
from __future__ import annotations

import logging

log = logging.getLogger("pocketcupy")


class SequenceMatcher:
    def __init__(self, ll_matcher, root: int = 0):
        self.ll = ll_matcher          # llguidance.LLMatcher
        self.root = root              # which compilation of the grammar it was copied from
        self.error: str | None = None  # set when the grammar could not go on

    def accept(self, token_id: int) -> bool:
        """Advance over a sampled token. True when the sequence must end: the structure is complete
        (only end-of-sequence could follow) or the matcher failed (then `error` says why)."""
        if self.error is not None:
            return True
        if not self.ll.consume_token(int(token_id)):
            self.fail(f"token {token_id} was rejected")
            return True
        return self.ll.is_stopped()

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of token_ids, from the start, the grammar accepts after the tokens so far (the
        matcher does not advance)."""
        return 0 if self.error is not None else self.ll.validate_tokens([int(t) for t in token_ids])

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = (self.ll.get_error() or why)[:500]  # llguidance appends its whole parser state
            log.warning("structured output stopped: %s", self.error)

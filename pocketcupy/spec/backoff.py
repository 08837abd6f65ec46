"""When a request's drafts keep failing, stop proposing them for a while: a verification that keeps
none of them costs a forward over rows that give nothing (on text that does not repeat, n-gram
drafts are mostly chance matches)."""
from __future__ import annotations

import weakref

from ..sched.request import Request


class DraftBackoff:
    """After n verifications in a row that kept no draft, the request drafts again only after
    min(2 ** (n - 1), max_pause) steps without; a verification that keeps one resets n."""

    def __init__(self, max_pause: int = 16):
        self.max_pause = max_pause
        self._state: weakref.WeakKeyDictionary[Request, list[int]] = weakref.WeakKeyDictionary()  # [n, pause]

    def allow(self, req: Request) -> bool:
        """Whether req drafts at its next step (a paused request's pause shrinks by one step)."""
        st = self._state.get(req)
        if st is None or st[1] == 0:
            return True
        st[1] -= 1
        return False

    def record(self, req: Request, num_kept: int) -> None:
        st = self._state.setdefault(req, [0, 0])
        st[0] = 0 if num_kept else st[0] + 1
        st[1] = min(2 ** (st[0] - 1), self.max_pause) if st[0] else 0

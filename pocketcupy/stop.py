"""Streaming stop-string matching over detokenised text deltas."""

from __future__ import annotations

from collections.abc import Iterable


class StopStringMatcher:
    """Feed text deltas; get back the text that is safe to emit.

    The stop that fires is the first one to *complete* in the character stream
    (as it would in a token-by-token engine); if several complete at the same
    character, the longest (earliest-starting) one wins. Without
    ``include_stop_str_in_output`` any suffix that could still grow into a stop
    string is held back, so no part of a stop string is ever emitted. With it,
    nothing needs holding back: everything up to the end of the stop is output.

    ``push(delta, check=False)`` (the text of the output's first min_tokens tokens) fires no stop;
    only a stop that ends in a later checked delta does (vLLM's rule).
    """

    def __init__(self, stops: Iterable[str], include_stop_str_in_output: bool = False):
        self.stops = list(stops)
        if any(not isinstance(s, str) or not s for s in self.stops):
            raise ValueError("stops: stop strings must be non-empty strings")
        self.include_stop_str_in_output = include_stop_str_in_output
        self._held = ""  # not yet emitted: could be the start of a stop
        self._tail = ""  # last emitted chars, only to find stops spanning deltas
        self._lookback = max((len(s) for s in self.stops), default=1) - 1
        self.stopped = False
        self.matched: str | None = None  # the stop string that fired

    def _first_stop(self, buf: str, new: int) -> tuple[int, int, str] | None:
        """(start, end, stop) of the first stop to complete in buf[new:] (the text just pushed; one
        ending before it was either seen then or pushed unchecked)."""
        best = None  # (end, start, stop): earliest end, then earliest start
        for s in self.stops:
            i = buf.find(s, max(0, new - len(s) + 1))
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        return None if best is None else (best[1], best[0], best[2])

    def _partial_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop."""
        longest = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), longest, -1):
                if buf.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def push(self, delta: str, check: bool = True) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return delta, False
        base = len(self._tail)
        buf = self._tail + self._held + delta
        hit = self._first_stop(buf, len(buf) - len(delta)) if check else None
        if hit is not None:
            start, end, s = hit
            self.stopped, self.matched, self._held = True, s, ""
            return buf[base : end if self.include_stop_str_in_output else max(start, base)], True
        keep = 0 if self.include_stop_str_in_output else self._partial_len(buf)
        cut = len(buf) - keep
        self._held = buf[cut:]
        self._tail = buf[max(0, cut - self._lookback) : cut]
        return buf[base:cut], False

    def flush(self) -> str:
        """Held-back text at the end of generation (stopped by length/eos); '' after a stop hit."""
        out, self._held = self._held, ""
        return out

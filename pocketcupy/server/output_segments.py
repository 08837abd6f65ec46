"""A choice's output as segments in the order the model wrote them -- text, reasoning, tool calls --
from the chat parser's events (chat.ChatUpdate.events), for the APIs that return typed parts (the
Responses API's output items, the Anthropic Messages API's content blocks)."""
from __future__ import annotations


class Segments:
    """segs: dicts {"kind": "content" | "reasoning" | "call", "text": str (a call's: its arguments),
    "name": a call's function}. feed() returns each change as ("open", i), ("delta", i, text) or
    ("close", i), for an API to announce in its own events; a segment closes when the next opens
    or at close().

    Text that is only whitespace so far is held back: as chat leaves a message with tool calls null
    when it holds only whitespace, a call that follows it, or the end of a reply with calls, drops
    it; other text or reasoning that follows makes it a segment, as does the end of a reply without
    calls. So a stream announces the same segments a whole reply shows."""

    def __init__(self):
        self.segs: list[dict] = []
        self.current: int | None = None     # the segment text goes to
        self.calls: dict[int, int] = {}     # the parser's call index -> segment index
        self.held = ""                      # whitespace-only text not yet a segment

    def feed(self, events: list) -> list[tuple]:
        out = []
        for ev in events:
            if ev[0] == "content" and not self._in("content"):
                self.held += ev[1]
                if self.held.strip():
                    out += self._release()
            elif ev[0] in ("content", "reasoning"):
                out += self._release()
                if not self._in(ev[0]):
                    out += self._open({"kind": ev[0], "text": "", "name": None})
                out += self._append(self.current, ev[1])
            elif ev[0] == "call":
                self.held = ""
                out += self._open({"kind": "call", "text": "", "name": ev[2]})
                self.calls[ev[1]] = self.current
            else:                                  # ("args", call index, text)
                out += self._append(self.calls[ev[1]], ev[2])
        return out

    def _in(self, kind: str) -> bool:
        return self.current is not None and self.segs[self.current]["kind"] == kind

    def _release(self) -> list[tuple]:
        """The held text as a content segment."""
        text, self.held = self.held, ""
        if not text:
            return []
        return self._open({"kind": "content", "text": "", "name": None}) + self._append(self.current, text)

    def _open(self, seg: dict) -> list[tuple]:
        out = self._close_current()
        self.segs.append(seg)
        self.current = len(self.segs) - 1
        return out + [("open", self.current)]

    def _append(self, i: int, text: str) -> list[tuple]:
        self.segs[i]["text"] += text
        return [("delta", i, text)]

    def _close_current(self) -> list[tuple]:
        i, self.current = self.current, None
        return [] if i is None else [("close", i)]

    def close(self) -> list[tuple]:
        """The end of the reply."""
        if self.calls:
            self.held = ""
        return self._release() + self._close_current()

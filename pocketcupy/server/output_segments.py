"""A choice's output as segments in the order the model wrote them -- text, reasoning, tool calls --
from the chat parser's events (chat.ChatUpdate.events), for the APIs that return typed parts (the
Responses API's output items, the Anthropic Messages API's content blocks)."""
from __future__ import annotations


class Segments:
    """segs: dicts {"kind": "content" | "reasoning" | "call", "text": str (a call's: its arguments),
    "name": a call's function}. feed() returns each change as ("open", i), ("delta", i, text) or
    ("close", i), for an API to announce in its own events; a segment closes when the next opens
    or at close()."""

    def __init__(self):
        self.segs: list[dict] = []
        self.current: int | None = None     # the segment text goes to
        self.calls: dict[int, int] = {}     # the parser's call index -> segment index

    def feed(self, events: list) -> list[tuple]:
        out = []
        for ev in events:
            if ev[0] in ("content", "reasoning"):
                if self.current is None or self.segs[self.current]["kind"] != ev[0]:
                    out += self._open({"kind": ev[0], "text": "", "name": None})
                out += self._append(self.current, ev[1])
            elif ev[0] == "call":
                out += self._open({"kind": "call", "text": "", "name": ev[2]})
                self.calls[ev[1]] = self.current
            else:                                  # ("args", call index, text)
                out += self._append(self.calls[ev[1]], ev[2])
        return out

    def _open(self, seg: dict) -> list[tuple]:
        out = self.close()
        self.segs.append(seg)
        self.current = len(self.segs) - 1
        return out + [("open", self.current)]

    def _append(self, i: int, text: str) -> list[tuple]:
        self.segs[i]["text"] += text
        return [("delta", i, text)]

    def close(self) -> list[tuple]:
        i, self.current = self.current, None
        return [] if i is None else [("close", i)]

    def kept(self) -> list[int]:
        """The segments a whole (non-streamed) reply shows: as chat leaves a message with tool calls
        null when it holds only whitespace, such text is left out."""
        calls = any(s["kind"] == "call" for s in self.segs)
        return [i for i, s in enumerate(self.segs) if not (calls and s["kind"] == "content" and not s["text"].strip())]

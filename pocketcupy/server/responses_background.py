"""The Responses API's background mode (`background: true`, with the response store): the response's
generation runs in a thread of its own, not tied to the HTTP request that made it. Its stream events
are kept, so that the POST's stream and `GET /v1/responses/<id>?stream=true&starting_after=N` follow
them (sequence number N + 1 on); the store holds its current state; `cancel` ends it."""
from __future__ import annotations

import threading
from collections import OrderedDict

from .protocol import bad
from .responses import sse_event
from .paging import query_int
from .sse import SSEStream

FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
CANCEL_WAIT_S = 30.0


class BackgroundResponse:
    """One background response: its events so far (the list index is the sequence number), whether
    its generation ended, and the flag that cancels it (the engine job's `gone` probe: the job ends, as
    for a client gone, within a poll)."""

    def __init__(self):
        self.events: list[dict] = []
        self.ended = False
        self.cancelled = threading.Event()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self, events, on_cancel) -> None:
        """Runs the generation: `events`, an iterable of numbered stream events that ends the engine
        job however it stops; on_cancel, called in the thread when a cancel stopped it before its end."""
        self._thread = threading.Thread(target=self._run, args=(events, on_cancel), daemon=True,
                                        name="pocketcupy-background")
        self._thread.start()

    def _run(self, events, on_cancel) -> None:
        try:
            for e in events:
                with self._changed:
                    self.events.append(e)
                    self._changed.notify_all()
            if self.cancelled.is_set() and not (self.events and self.events[-1]["type"] in FINAL_EVENTS):
                on_cancel()
        finally:
            with self._changed:
                self.ended = True
                self._changed.notify_all()

    def follow(self, after: int = -1):
        """Yields the events after sequence number `after`, as they come, until the generation ends."""
        i = after + 1
        while True:
            with self._changed:
                while i >= len(self.events) and not self.ended:
                    self._changed.wait()
                batch, ended = self.events[i:], self.ended
            yield from batch
            i += len(batch)
            if ended and i >= len(self.events):
                return

    def cancel(self) -> None:
        """Stops the generation and waits for its end (the engine request aborted, its KV freed)."""
        self.cancelled.set()
        if self._thread is not None:
            self._thread.join(CANCEL_WAIT_S)


class BackgroundResponses:
    """The server's background responses by id: all that still run, and the latest `capacity` ended
    ones (the store's size: their events can be streamed again)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[str, BackgroundResponse] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, response_id: str, response: BackgroundResponse) -> None:
        with self._lock:
            ended = [k for k, b in self._items.items() if b.ended]
            for k in ended[:max(0, len(ended) + 1 - self.capacity)]:
                del self._items[k]
            self._items[response_id] = response

    def get(self, response_id: str) -> BackgroundResponse | None:
        with self._lock:
            return self._items.get(response_id)

    def cancel_all(self) -> None:
        """Cancels those still running (the server is stopping: the engine loop waited for them)."""
        with self._lock:
            running = [b for b in self._items.values() if not b.ended]
        for b in running:
            b.cancelled.set()
        for b in running:
            b.cancel()


class Detached:
    """The job of a stream that only follows a background response's events: ending the stream (the
    client gone) leaves the generation running."""

    def __init__(self, request_id: str):
        self.request_id = request_id

    def close(self, reason: str = "abort") -> None:
        pass


def followed(background: BackgroundResponse, response_id: str, after: int = -1) -> SSEStream:
    """The SSE stream of a background response's events after sequence number `after`."""
    return SSEStream(background.follow(after), Detached(response_id), sse_event, done=False)


def resumed(state, response_id: str, query) -> SSEStream:
    """GET /v1/responses/<id>?stream=true[&starting_after=N]: a background response's events again,
    those after N (all without it), then the rest as they come (OpenAI's resume of a dropped stream)."""
    background = state.background.get(response_id)
    if background is None:
        raise bad("stream", "Only responses created with background=true can be streamed again (and only the "
                            f"latest {state.background.capacity} of them)")
    after = query_int(query.get("starting_after", "-1"), "starting_after")
    if after < -1:
        raise bad("starting_after", f"'starting_after' must be a sequence number (>= 0), got {after}")
    return followed(background, response_id, after)


def cancelled(state, response_id: str, response: dict) -> dict:
    """POST /v1/responses/<id>/cancel of a stored response: a background one that still runs ends, and
    is 'cancelled'; one that ended is left as it is (a second cancel answers the same)."""
    if not response.get("background"):
        raise bad("response_id", "Only responses created with background=true can be cancelled")
    background = state.background.get(response_id)
    if background is not None:
        background.cancel()
    found = state.responses.get(response_id)
    return found[1] if found is not None else response

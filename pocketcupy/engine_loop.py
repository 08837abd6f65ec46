"""A background step loop over an Engine, for servers: submit from any thread, read each
request's outputs from its own queue, abort at any time."""
from __future__ import annotations

import logging
import queue
import threading
from typing import Iterator

from .outputs import RequestOutput
from .sampling import SamplingParams

log = logging.getLogger("pocketcupy")


class RequestStream:
    """The outputs of one request as the loop produces them (each carries the step's deltas). By
    default in a queue of its own, read with get(); where several requests share one queue
    (EngineLoop.submit's `outputs`), it gets (key, item) pairs and their reader hands each item to
    its stream's take()."""

    def __init__(self, loop: "EngineLoop", request_id: str, outputs: queue.Queue | None = None, key=None):
        self.loop, self.request_id = loop, request_id
        self._shared = outputs is not None
        self._queue: queue.Queue = outputs if self._shared else queue.Queue()
        self._key = key
        self.finished = False    # the reader has taken the last item
        self._closed = False     # the last item is queued

    def append(self, item) -> None:
        """The engine's mailbox: an output of this request (or the error that ended it) queued;
        nothing after the last."""
        if self._closed:
            return
        self._closed = isinstance(item, BaseException) or item.finished
        self._queue.put((self._key, item) if self._shared else item)

    def get(self, timeout: float | None = None) -> RequestOutput:
        """The next output (own queue only); raises the engine's error if the step loop failed."""
        return self.take(self._queue.get(timeout=timeout))

    def take(self, item) -> RequestOutput:
        """An item of this stream's from its queue: the output, or the step loop's error raised."""
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def __iter__(self) -> Iterator[RequestOutput]:
        while not self.finished:
            yield self.get()

    def result(self) -> RequestOutput:
        last = None
        for last in self:
            pass
        return last

    def abort(self, refused: bool = False) -> None:
        if not self._closed:
            self.loop.abort(self, refused)


class EngineLoop:
    def __init__(self, engine):
        self.engine = engine
        self._streams: set[RequestStream] = set()   # not closed yet
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pocketcupy-step-loop", daemon=True)
        self._thread.start()

    def submit(self, prompt, params: SamplingParams | None = None, request_id: str | None = None,
               priority: int = 0, prompt_token_ids: list[int] | None = None, outputs: queue.Queue | None = None,
               key=None, pooling=None, id_prefix: str = "req") -> RequestStream:
        """Adds a request (pooling: an embedding request, Engine._add_request's); its outputs go to
        the stream returned, or, with `outputs`, as (key, output) into that queue (shared by several
        requests, e.g. the prompts of one API call). Without a request_id it is named id_prefix-N."""
        stream = RequestStream(self, request_id, outputs, key)
        with self._wake:   # (checked under it: the loop thread decides to stop under it too)
            if self._stopping:
                raise RuntimeError("the engine loop is shutting down")
            # the stream is the request's mailbox: its outputs reach it and no later request's of its id
            stream.request_id = self.engine._add_request(request_id or id_prefix, prompt, params, priority,
                                                         prompt_token_ids, mailbox=stream, pooling=pooling,
                                                         name_it=not request_id)
            self._streams.add(stream)
            self._wake.notify()
        return stream

    def abort(self, stream, refused: bool = False) -> None:
        """Aborts a stream's request (a request id, or an iterable of them: the live requests of those ids);
        refused: see Engine._abort_request_of."""
        if isinstance(stream, RequestStream):
            self.abort_streams([stream], refused)
            return
        self.engine.abort_request(stream)
        with self._wake:
            self._wake.notify()

    def abort_streams(self, streams: list[RequestStream], refused: bool = False) -> None:
        """Aborts several streams' requests under one hold of the engine's lock: one at a time, each
        waited out a step (a call of several prompts whose client went away held its HTTP thread, and
        the prompts not aborted yet went on computing, one step a prompt). A stream whose request has
        ended is passed over (Engine._abort_request_of finds no request of its id and mailbox)."""
        with self.engine._lock:
            for s in streams:
                self.engine._abort_request_of(s.request_id, s, refused)
        with self._wake:
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and self._idle():
                    self._wake.wait()
                if self._stopping and self._idle():
                    return
            try:
                self.engine.step()   # (its outputs go to the streams, the requests' mailboxes)
            except BaseException as e:  # fail every waiting request instead of hanging it
                log.exception("engine step failed")
                with self._wake:
                    streams, self._streams = [s for s in self._streams if not s._closed], set()
                for s in streams:
                    s.append(e)
                    self.abort(s)
                continue
            with self._wake:
                self._streams = {s for s in self._streams if not s._closed}

    def _idle(self) -> bool:
        """Nothing to step: no request running or waiting, and no aborted one owing its final output."""
        return not self.engine.has_unfinished_requests() and not self.engine.has_pending_outputs()

    @property
    def num_open_streams(self) -> int:
        return len(self._streams)

    def shutdown(self, timeout: float | None = None) -> None:
        """Let running requests finish (and aborted ones get their last output), then stop the loop thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)

"""One API request's engine requests: submit, follow their outputs, notice a gone client, record
metrics, and abort whatever is left when the HTTP side ends (error, disconnect, close)."""
from __future__ import annotations

import queue
import socket
import time

from ..input_errors import is_input_error
from .protocol import ApiError, from_value_error


GONE_PROBE = "pocketcupy.gone"   # an environ key: a callable that answers in place of the socket's probe
GONE_STATUS = 499                # the status of a request whose client went away (nginx's "client closed request")


class ClientGone(Exception):
    pass


def ending_reason(kind) -> str:
    """The finish reason of the engine requests an HTTP request leaves running when it ends on an
    exception of this type (None: none): the client gone, the server stopping, a 400 or its own end:
    "abort"; a failure of the server's own (a 500): "error"."""
    return "error" if kind is not None and not issubclass(kind, (ClientGone, ApiError)) else "abort"


def disconnect_probe(environ):
    """A callable telling whether the client closed its connection (gunicorn exposes the socket); an
    in-process request (a batch's line) brings its own as GONE_PROBE."""
    if GONE_PROBE in environ:
        return environ[GONE_PROBE]
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return lambda: False

    def gone() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError, ValueError):  # ValueError: TLS sockets cannot peek
            return False
        except OSError:
            return True
    return gone


class Job:
    """metered=False: a step of an API request whose own job reports its tokens, finishes and
    latencies (the forced tool call's choice of function); it only counts as in flight.
    generates=False: prompt scoring, whose one generated token is dropped: no generation tokens,
    TTFT or TPOT are recorded. pooling: embedding requests (PoolingParams; they generate nothing).
    rename: turns a 400 for the input that the engine raises while generating into the request API's
    field names (the Responses and Anthropic APIs': RenamedErrors.error)."""

    def __init__(self, state, request_id: str, prompts: list[list[int]], params, priority: int = 0,
                 gone=lambda: False, param_names: dict | None = None, metered: bool = True,
                 generates: bool = True, pooling=None, mentions=(), rename=None):
        self.state, self.request_id = state, request_id
        self.metered, self.generates, self.pooling = metered, generates and pooling is None, pooling
        self.prompts, self.params, self.priority = prompts, params, priority
        self.gone, self.param_names, self.mentions = gone, param_names or {}, mentions
        self.rename = rename or (lambda e: e)
        self.streams: list = []
        self._outputs: queue.Queue = queue.Queue()   # every prompt's, as (prompt index, output)
        self.aborted: set[int] = set()
        self._counted = False
        self.t0 = time.monotonic()
        self.first: dict[int, float] = {}   # when each prompt's first and latest new tokens came
        self.last: dict[int, float] = {}
        self.num_generated = [0] * len(prompts)
        self.ended: list[set[int]] = [set() for _ in prompts]   # each prompt's sequences counted as finished

    def __enter__(self) -> "Job":
        if not self.streams:
            self.start()
        return self

    def start(self) -> "Job":
        m = self.state.metrics
        try:
            for i, ids in enumerate(self.prompts):
                rid = self.request_id if len(self.prompts) == 1 else f"{self.request_id}-{i}"
                params = self._params(i)
                self.streams.append(self.state.loop.submit(ids, params, rid, self.priority, outputs=self._outputs,
                                                           key=i, pooling=self.pooling))
        except ValueError as e:
            self.close()
            raise from_value_error(e, self.param_names.get("prompt", "messages"), self.param_names,
                                   self.mentions) from None
        except RuntimeError as e:  # the loop is shutting down
            self.close()
            raise ApiError(503, f"the server is shutting down: {e}") from None
        m.requests_in_flight.inc()
        if self.metered:
            m.prompt_tokens.inc(sum(len(p) for p in self.prompts))
        self._counted = True
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(ending_reason(kind))

    def close(self, reason: str = "abort") -> None:
        """Abort what still runs: its sequences not finished yet are counted as finished for `reason`
        (those that did were counted for their own reason as they ended); not where start() failed:
        the prompts submitted before the one the engine refused are part of a 400, not finished requests."""
        ending = []
        for i, s in enumerate(self.streams):
            if not s.finished and i not in self.aborted:
                self.aborted.add(i)
                self._count_unended(i, reason)
                ending.append(s)
        if ending:   # (at once: the engine's lock is taken once, not once a prompt, each after a step)
            self.state.loop.abort_streams(ending, refused=not self._counted)
        if self._counted:
            self._counted = False
            self.state.metrics.requests_in_flight.dec()

    def outputs(self):
        """Yields (prompt index, RequestOutput) as the engine produces them, the prompts' interleaved."""
        poll = self.state.config.poll_s
        checked = time.monotonic()
        while not all(s.finished for s in self.streams):
            try:
                i, item = self._outputs.get(timeout=poll)
            except queue.Empty:
                i = None
            if time.monotonic() - checked >= poll:
                checked = time.monotonic()
                if self.gone():
                    raise ClientGone()
            # (at every output, not once a poll: a request queued behind the ones stopping ends would otherwise
            # take their place and finish between two polls)
            if self.state.ending:
                raise ApiError(503, "the server is shutting down: the request was ended before it finished")
            if i is not None:
                try:
                    out = self.streams[i].take(item)
                except Exception as e:   # the engine failed this request, or its step failed
                    self._count_unended(i, "error")   # (the engine sends the error instead of their last output)
                    if is_input_error(e):   # for its input (e.g. its bad_words)
                        raise self.rename(from_value_error(e, None, self.param_names, self.mentions)) from None
                    raise
                self._observe(i, out)
                yield i, out

    def _params(self, i: int):
        return self.params[i] if isinstance(self.params, list) else self.params

    def _count_unended(self, i: int, reason: str) -> None:
        """Prompt i's sequences not counted yet are finished requests of `reason` (each counted once)."""
        n = self._params(i).n
        if self.metered and self._counted and n > len(self.ended[i]):
            self.state.metrics.finished.labels(reason).inc(n - len(self.ended[i]))
        self.ended[i].update(range(n))

    def _observe(self, i: int, out) -> None:
        if not self.metered:
            return
        m, now = self.state.metrics, time.monotonic()
        new = sum(len(o.delta_token_ids) for o in out.outputs) if self.generates else 0
        if new:
            m.generation_tokens.inc(new)
            if i not in self.first:
                self.first[i] = now
                m.ttft.observe(now - self.t0)
            else:
                m.itl.observe(now - self.last[i])
            self.last[i] = now
        self.num_generated[i] = max((len(o.token_ids) for o in out.outputs), default=0)
        if out.finished:
            self._observe_finished(i, out, now)
        # each of the n sequences is an engine request of its own (as vLLM's n child requests; each is
        # in num_requests_running): counted once, for its own reason, when it ends
        for o in out.outputs:
            if (o.finish_reason is not None or out.finished) and o.index not in self.ended[i]:
                self.ended[i].add(o.index)
                m.finished.labels(o.finish_reason or "abort").inc()
                m.request_prompt_tokens.observe(len(self.prompts[i]))
                if self.generates:
                    m.request_generation_tokens.observe(len(o.token_ids))

    def _observe_finished(self, i: int, out, now: float) -> None:
        """Prompt i's latencies and parameters, once its last output came."""
        m, first = self.state.metrics, self.first.get(i)
        m.e2e.observe(now - self.t0)
        if out.time_in_queue is not None:
            m.queue_time.observe(out.time_in_queue)
            scheduled = self.t0 + out.time_in_queue   # (on this clock: the engine's arrival is a little after t0)
            m.inference_time.observe(now - scheduled)
            if first is not None:
                m.prefill_time.observe(max(0.0, first - scheduled))
        if first is not None:
            m.decode_time.observe(now - first)
            if self.num_generated[i] > 1:
                m.tpot.observe((now - first) / (self.num_generated[i] - 1))
        params = self._params(i)
        m.params_n.observe(params.n)
        if self.generates and params.max_tokens is not None:
            m.params_max_tokens.observe(params.max_tokens)

    def results(self) -> list:
        """Final RequestOutput of every prompt (non-streaming)."""
        last = {}
        for i, out in self.outputs():
            last[i] = out
        return [last[i] for i in range(len(self.streams))]

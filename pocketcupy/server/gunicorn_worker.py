"""The gunicorn gthread worker of the server: how it takes connections.

- A new connection waits on the poller until its request line arrives, not in an HTTP thread.
- Probes and scrapes (GET /health, /alive, /ready, /metrics) have a lane of their own: when every
  HTTP thread is taken (long streams), one for those routes is answered by two threads kept for them
  instead of queueing behind the streams (a liveness probe that timed out restarted a busy server).
- A client that stalls sending its request is dropped (headers) or answered 408 (body) after
  --client-timeout, and one that stops reading its response is dropped (a stream's requests aborted),
  instead of holding an HTTP thread for good.
- Connections are closed (and lingered on) off gunicorn's main thread.
- Stopping, the listening sockets are closed at once, so new clients are refused.
- Requests gunicorn itself refuses (over its limits, unparsable) get OpenAI's JSON error body, not its
  HTML page (gunicorn_errors.py), with gunicorn's status.
"""
from __future__ import annotations

import errno
import logging
import selectors
import socket
import struct
import threading
import time
from concurrent import futures
from functools import partial

from gunicorn import util
from gunicorn.http.errors import ParseException
from gunicorn.workers.gthread import ThreadWorker

from .gunicorn_errors import ErrorRecorder, error_reply
from .state import PROBES

QUICK_ROUTES = tuple(route.encode() for route in (*PROBES, "/metrics"))
QUICK_THREADS = 2
# stopping: what the worker needs, once its requests have ended, to exit before the arbiter kills it at the end
# of --graceful-timeout (gunicorn's loop notices within 1 s, closing a connection lingers up to 2 s)
EXIT_MARGIN_S = 3.0


class PocketcupyWorker(ThreadWorker):
    def init_process(self):
        self.log.error_log.addFilter(_StalledClientFilter())
        self.quick_pool = futures.ThreadPoolExecutor(QUICK_THREADS, thread_name_prefix="pocketcupy-quick")
        self.busy = 0  # connections given to the main pool and not yet finished (main thread only)
        super().init_process()

    def run(self):
        try:
            super().run()
        finally:
            self.quick_pool.shutdown(wait=False)

    def enqueue_req(self, conn):  # main thread
        if not self.cfg.is_ssl and not _buffered(conn):
            line = _peek_request_line(conn.sock)
            # nothing sent yet: wait for it on the poller (gunicorn waited up to 5 s in an HTTP thread)
            if line is None and not conn.data_ready:
                conn.timeout = time.monotonic() + self.cfg.keepalive
                self.pending_conns.append(conn)
                self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn))
                return
            if self.busy >= self.cfg.threads and line is not None and _is_quick(line):
                fs = self.quick_pool.submit(self.handle, conn)
                fs.add_done_callback(lambda fut: self.method_queue.defer(self.finish_request, conn, fut))
                return
        self.busy += 1
        conn.in_main_pool = True
        super().enqueue_req(conn)

    def handle_exit(self, sig, frame):  # SIGTERM: in-flight requests finish, unless they outlast the grace
        state = state_of(self.wsgi)
        if state is not None:
            state.begin_drain()
            grace = self.cfg.graceful_timeout
            state.end_requests_at(time.monotonic() + max(grace - EXIT_MARGIN_S, grace / 2))
        super().handle_exit(sig, frame)

    def handle_quit(self, sig, frame):  # SIGINT, SIGQUIT: stop now
        # (gunicorn's exit waited for the threads of in-flight streams until the arbiter killed the worker)
        state = state_of(self.wsgi)
        if state is not None:
            state.begin_drain()
            state.end_requests_at(time.monotonic())
        super().handle_quit(sig, frame)

    def handle(self, conn):
        # gunicorn reads and writes on a blocking socket without a timeout: a client that stalled
        # mid-headers, or stopped reading its answer (a stream's too), held an HTTP thread for good, and
        # --http-threads of them blocked every route. The kernel's timeouts bound each read and write
        # (gunicorn drops the connection; a stream's requests are aborted); the body's reads also get a
        # timeout of the socket object, answered 408 (app._body).
        state = state_of(self.wsgi)
        if state is not None:
            timeout = struct.pack("ll", int(state.config.client_timeout_s), 0)
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeout)
        return super().handle(conn)

    def handle_error(self, req, client, addr, exc):
        recorder = ErrorRecorder()
        super().handle_error(req, recorder, addr, exc)  # gunicorn's status, log line and access-log line
        status, reason = recorder.status()
        try:
            util.write_nonblock(client, error_reply(status, reason, exc))
        except Exception:  # noqa: BLE001 - the client has gone (gunicorn ignores it too)
            self.log.debug("Failed to send error message.")

    def _keepalive_after(self, conn, keepalive):
        # gunicorn (27) reads off a body the app left unread (a GET's) once the answer has gone out; bad
        # chunked framing there went to handle_error, which sent a second answer (a 400) after the first
        try:
            return super()._keepalive_after(conn, keepalive)
        except ParseException as e:
            self.log.warning("Invalid request body from ip=%s (answered, connection closed): %s",
                             (conn.client or ("",))[0], e)
            return False

    def finish_request(self, conn, fs):  # main thread
        # gunicorn closes a connection it does not keep alive on its main thread, lingering up to 2 s
        # for the client to close too (util.close_graceful): each client that does not (one stalled
        # mid-body and answered 408, or one that never reads) froze accepting and dispatching for
        # everyone that long. The linger runs in a thread of its own instead.
        if getattr(conn, "in_main_pool", False):
            conn.in_main_pool = False
            self.busy -= 1
        if "close" not in vars(conn):
            conn.close = _linger_in_background(conn.close)
        super().finish_request(conn, fs)

    def set_accept_enabled(self, enabled):
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:
            # Stopping: close the listening sockets (the arbiter has closed its copies) so that new
            # clients are refused at once; left open, their connections waited in the backlog for
            # the whole drain (up to --graceful-timeout) and were then reset.
            for s in self.sockets:
                s.close()


class _StalledClientFilter(logging.Filter):
    """A client that stalls mid-headers, or stops reading its answer, hits the receive or send timeout
    (handle) and gunicorn drops it, as --client-timeout asks, but logs that as "Socket error processing
    request." with an EAGAIN traceback at ERROR: one line at INFO instead."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        if not (isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
                and str(record.msg).startswith("Socket error processing request")):
            return True
        what = "reading its response" if _in_a_write(exc.__traceback__) else "sending its request headers"
        record.msg, record.args = f"a client stalled {what} past --client-timeout; dropped", ()
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def _in_a_write(tb) -> bool:
    """Whether gunicorn raised while writing the response (its write / send_headers / sendfile methods)."""
    while tb is not None:
        if tb.tb_frame.f_code.co_name.startswith(("write", "send")):
            return True
        tb = tb.tb_next
    return False


def _buffered(conn) -> bool:
    """Whether gunicorn has already read (part of) the connection's next request off the socket."""
    return conn.parser is not None and bool(conn.parser.unreader.buf.getvalue())


def _peek_request_line(sock) -> bytes | None:
    """The start of the request waiting on a connection, left in place; None if nothing has come."""
    try:
        return sock.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT) or None
    except OSError:  # nothing yet (EAGAIN), or the client has gone: the main pool sorts it out
        return None


def _is_quick(line: bytes) -> bool:
    method, _, rest = line.partition(b" ")
    path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
    return method in (b"GET", b"HEAD") and path in QUICK_ROUTES and b" " in rest


def _linger_in_background(close):
    def close_(graceful: bool = False) -> None:
        if graceful:  # not a daemon: a stopping worker still waits for it, as it did for gunicorn's linger
            threading.Thread(target=close, kwargs={"graceful": True}, name="pocketcupy-close").start()
        else:
            close()
    return close_


def state_of(wsgi):
    """The pocketcupy ServerState of the worker's app (None before it is loaded)."""
    ext = getattr(wsgi, "extensions", None)
    return ext.get("pocketcupy") if isinstance(ext, dict) else None

"""gunicorn, in-process: one gthread worker; the engine is built in the worker after the fork.

The worker answers /alive and /ready (503) while the model loads in a background thread; if
loading fails, the worker exits with gunicorn's boot-error code and the whole server stops.
SIGTERM: /ready turns 503, new connections are refused, new generation requests on kept-alive ones
get 503, in-flight ones (streams included) finish within the graceful timeout, then the engine loop
stops. SIGHUP reopens the log files and leaves the worker as it is (gunicorn would boot a second
copy of the model beside the first).

Probes and scrapes (GET /health, /alive, /ready, /metrics) have a lane of their own: when every HTTP
thread is taken (long streams), a new connection waits on the poller until its request line arrives,
and one for those routes is answered by two threads kept for them instead of queueing behind the
streams (a liveness probe that timed out restarted a busy server).

Tensor parallel: the worker is rank 0; the engine starts the other ranks and waits until every
one is ready before /ready answers 200. Any rank's death stops every rank and the server exits
(code 1) with the rank named in the log; so does the death of the worker itself (the arbiter
halts instead of starting another one).
"""
from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import struct
import sys
import threading
import time
from concurrent import futures
from functools import partial

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.workers.gthread import ThreadWorker

from .state import ServerConfig, ServerState

log = logging.getLogger("pocketcupy.server")
WORKER_BOOT_ERROR = 3  # gunicorn's arbiter halts on this exit code instead of restarting the worker
RANK_FAILED = 1       # a tensor-parallel rank died (the arbiter halts through _child_exit)
QUICK_ROUTES = (b"/health", b"/alive", b"/ready", b"/metrics")
QUICK_THREADS = 2


class PocketcupyWorker(ThreadWorker):
    def init_process(self):
        self.log.error_log.addFilter(_StalledHeadersFilter())
        self.quick_pool = futures.ThreadPoolExecutor(QUICK_THREADS, thread_name_prefix="pocketcupy-quick")
        self.busy = 0  # connections given to the main pool and not yet finished (main thread only)
        super().init_process()

    def run(self):
        try:
            super().run()
        finally:
            self.quick_pool.shutdown(wait=False)

    def enqueue_req(self, conn):  # main thread
        if self.busy >= self.cfg.threads and not self.cfg.is_ssl and not _buffered(conn):
            line = _peek_request_line(conn.sock)
            if line is None and not conn.data_ready:  # nothing sent yet: wait for it on the poller
                conn.timeout = time.monotonic() + self.cfg.keepalive
                self.pending_conns.append(conn)
                self.poller.register(conn.sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn))
                return
            if line is not None and _is_quick(line):
                fs = self.quick_pool.submit(self.handle, conn)
                fs.add_done_callback(lambda fut: self.method_queue.defer(self.finish_request, conn, fut))
                return
        self.busy += 1
        conn.in_main_pool = True
        super().enqueue_req(conn)

    def handle_exit(self, sig, frame):
        state = _state_of(self.wsgi)
        if state is not None:
            state.begin_drain()
        super().handle_exit(sig, frame)

    def handle(self, conn):
        # gunicorn reads a request on a blocking socket without a timeout: a client that stalled
        # mid-headers held an HTTP thread for good, and --http-threads of them blocked every route.
        # The kernel's receive timeout bounds each read (gunicorn drops the connection); the body's
        # reads also get a timeout of the socket object, answered 408 (app._body).
        state = _state_of(self.wsgi)
        if state is not None:
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                 struct.pack("ll", int(state.config.client_timeout_s), 0))
        return super().handle(conn)

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


class _StalledHeadersFilter(logging.Filter):
    """A client that stalls mid-headers hits the receive timeout (handle) and gunicorn drops it, as
    --client-timeout asks, but logs that as "Socket error processing request." with an EAGAIN
    traceback at ERROR: one line at INFO instead."""

    def filter(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        if not (isinstance(exc, OSError) and exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
                and str(record.msg).startswith("Socket error processing request")):
            return True
        record.msg, record.args = "a client stalled sending its request headers past --client-timeout; dropped", ()
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


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


def _state_of(wsgi) -> ServerState | None:
    ext = getattr(wsgi, "extensions", None)
    return ext.get("pocketcupy") if isinstance(ext, dict) else None


def _worker_exit(server, worker) -> None:
    state = _state_of(getattr(worker, "wsgi", None))
    if state is not None:
        state.shutdown(timeout=10)
        if state.engine is not None:
            state.engine.close()  # stops and reaps the other tensor-parallel ranks


def _rank_failed(err) -> None:
    """A tensor-parallel rank died and the group has stopped the others: nothing can run."""
    log.error("exiting: %s", err)
    logging.shutdown()
    os._exit(RANK_FAILED)


def _child_exit(server, worker) -> None:
    """Arbiter side, tensor parallel: the worker (rank 0) ended while the server was still
    listening, so the ranks it held are gone; halt instead of starting a fresh worker."""
    if server.LISTENERS:
        from gunicorn.errors import HaltServer

        raise HaltServer(f"tensor-parallel rank 0 (the worker, pid {worker.pid}) exited; the other ranks "
                         "stop with it (a rank that failed first is named above)", RANK_FAILED)


def _load_failed(exc) -> None:
    logging.getLogger("pocketcupy.server").error("exiting: the model could not be loaded")
    os._exit(WORKER_BOOT_ERROR)


class PocketcupyArbiter(Arbiter):
    def handle_hup(self):
        # gunicorn's reload boots a fresh worker before the old one drains: two copies of the model
        # and of its KV pool at once (on a GPU, the second gets what memory is left, or fails), and
        # a tensor-parallel group torn down. A hang-up reopens the log files only (logrotate).
        self.log.info("Hang up: log files reopened; the model is not reloaded (restart the server for that)")
        self.log.reopen_files()


class ServeApplication(BaseApplication):
    def __init__(self, config: ServerConfig, options: dict):
        self.server_config = config
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        opts = {"workers": 1, "worker_class": PocketcupyWorker, "preload_app": False,
                "worker_exit": _worker_exit, "when_ready": self._when_ready, "proc_name": "pocketcupy",
                "control_socket_disable": True}
        if self.server_config.engine_args.tensor_parallel_size > 1:
            opts["child_exit"] = _child_exit
        opts.update(self.options)
        for k, v in opts.items():
            self.cfg.set(k, v)

    def _when_ready(self, server) -> None:
        log.info("pocketcupy: listening on %s (%d threads); the model loads in the worker, "
                 "GET /ready answers 200 once it is loaded", self.server_config.url, self.cfg.threads)

    def run(self):  # BaseApplication.run with our arbiter
        try:
            PocketcupyArbiter(self).run()
        except RuntimeError as e:
            print(f"\nError: {e}\n", file=sys.stderr)
            sys.exit(1)

    def load(self):
        from .app import create_app

        from ..dist import set_failure_handler

        set_failure_handler(_rank_failed)
        state = ServerState(self.server_config)
        app = create_app(state)
        state.start_loading(on_failure=_load_failed)
        return app

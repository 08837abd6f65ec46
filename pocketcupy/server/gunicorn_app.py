"""gunicorn, in-process: one gthread worker; the engine is built in the worker after the fork.

The worker answers /alive and /ready (503) while the model loads in a background thread; if
loading fails, the worker exits with gunicorn's boot-error code and the whole server stops.
SIGTERM: /ready turns 503, new connections are refused, new generation requests on kept-alive ones
get 503, in-flight ones (streams included) finish within the graceful timeout, then the engine loop
stops.

Tensor parallel: the worker is rank 0; the engine starts the other ranks and waits until every
one is ready before /ready answers 200. Any rank's death stops every rank and the server exits
(code 1) with the rank named in the log; so does the death of the worker itself (the arbiter
halts instead of starting another one).
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading

from gunicorn.app.base import BaseApplication
from gunicorn.workers.gthread import ThreadWorker

from .state import ServerConfig, ServerState

log = logging.getLogger("pocketcupy.server")
WORKER_BOOT_ERROR = 3  # gunicorn's arbiter halts on this exit code instead of restarting the worker
RANK_FAILED = 1       # a tensor-parallel rank died (the arbiter halts through _child_exit)


class PocketcupyWorker(ThreadWorker):
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

    def finish_request(self, *args):  # gunicorn >= 24: (conn, fs); older: (fs), the connection in fs.conn
        # gunicorn closes a connection it does not keep alive on its main thread, lingering up to 2 s
        # for the client to close too (util.close_graceful): each client that does not (one stalled
        # mid-body and answered 408, or one that never reads) froze accepting and dispatching for
        # everyone that long. The linger runs in a thread of its own instead.
        conn = args[0] if len(args) > 1 else getattr(args[0], "conn", None)
        if conn is not None and "close" not in vars(conn):
            conn.close = _linger_in_background(conn.close)
        super().finish_request(*args)

    def set_accept_enabled(self, enabled):
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:
            # Stopping: close the listening sockets (the arbiter has closed its copies) so that new
            # clients are refused at once; left open, their connections waited in the backlog for
            # the whole drain (up to --graceful-timeout) and were then reset.
            for s in self.sockets:
                s.close()


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


class ServeApplication(BaseApplication):
    def __init__(self, config: ServerConfig, options: dict):
        self.server_config = config
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        opts = {"workers": 1, "worker_class": PocketcupyWorker, "preload_app": False,
                "worker_exit": _worker_exit, "when_ready": self._when_ready, "proc_name": "pocketcupy"}
        if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 24: no shared control socket
            opts["control_socket_disable"] = True
        if self.server_config.engine_args.tensor_parallel_size > 1:
            opts["child_exit"] = _child_exit
        opts.update(self.options)
        for k, v in opts.items():
            self.cfg.set(k, v)

    def _when_ready(self, server) -> None:
        log.info("pocketcupy: listening on %s (%d threads); the model loads in the worker, "
                 "GET /ready answers 200 once it is loaded", self.server_config.url, self.cfg.threads)

    def load(self):
        from .app import create_app

        from ..dist import set_failure_handler

        set_failure_handler(_rank_failed)
        state = ServerState(self.server_config)
        app = create_app(state)
        state.start_loading(on_failure=_load_failed)
        return app

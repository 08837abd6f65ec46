"""gunicorn, in-process: one gthread worker; the engine is built in the worker after the fork.

The worker answers /alive and /ready (503) while the model loads in a background thread; if
loading fails, the worker exits with gunicorn's boot-error code and the whole server stops.
SIGTERM: /ready turns 503, new connections are refused, new generation requests on kept-alive ones
get 503, in-flight ones (streams included) finish within the graceful timeout (those that would outlast
it end shortly before with a 503 or a stream's error event: gunicorn_worker.py), then the engine loop
stops. SIGINT / SIGQUIT end the in-flight requests at once. SIGHUP reopens the log files and leaves the
worker as it is (gunicorn would boot a second copy of the model beside the first).

The worker's handling of connections is gunicorn_worker.py's.

Tensor parallel: the worker is rank 0; the engine starts the other ranks and waits until every
one is ready before /ready answers 200. Any rank's death stops every rank and the server exits
(code 1) with the rank named in the log; so does the death of the worker itself (the arbiter
halts instead of starting another one).
"""
from __future__ import annotations

import logging
import os
import sys

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from .gunicorn_worker import PocketcupyWorker, state_of
from .state import ServerConfig, ServerState

log = logging.getLogger("pocketcupy.server")
WORKER_BOOT_ERROR = 3  # gunicorn's arbiter halts on this exit code instead of restarting the worker
RANK_FAILED = 1       # a tensor-parallel rank died (the arbiter halts through _child_exit)


def _worker_exit(server, worker) -> None:
    state = state_of(getattr(worker, "wsgi", None))
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

"""The Batches API's jobs (/v1/batches): each batch runs in a thread of the server's process, its input file's
lines answered by run_batch (batch.py) through the server's own app, as many at once as the run-batch
command runs. Its status goes validating -> in_progress -> finalizing -> completed (or failed: the input
file gone, empty or unreadable); a cancel goes cancelling -> cancelled. The lines that succeed go to the
output file, the others to the error file (OpenAI's split; a file only where it has lines), both files of
purpose batch_output in the file store. A cancelled batch aborts its lines in flight and begins no more:
they are error lines "batch_cancelled", and the output so far is kept. Stopping the server cancels the
running batches. The batches themselves are kept in memory, in this process only."""
from __future__ import annotations

import logging
import threading
import time
import uuid

from .batch import default_concurrency, run_batch, succeeded
from .protocol import ApiError

log = logging.getLogger("pocketcupy.server")
DAY_S = 24 * 3600
RUNNING = ("validating", "in_progress")


class BatchJob:
    def __init__(self, state, app, input_file_id: str, endpoint: str, metadata: dict | None):
        self.state, self.app = state, app
        now = int(time.time())
        self.obj = {"id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": endpoint, "errors": None,
                    "input_file_id": input_file_id, "completion_window": "24h", "status": "validating",
                    "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
                    "expires_at": now + DAY_S, "finalizing_at": None, "completed_at": None, "failed_at": None,
                    "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                    "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata}
        self.id = self.obj["id"]
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"pocketcupy-{self.id}", daemon=True)

    def view(self) -> dict:
        with self._lock:
            return {**self.obj, "request_counts": dict(self.obj["request_counts"])}

    def _set(self, status: str, **fields) -> None:
        with self._lock:
            self.obj.update(fields, status=status)
            self.obj[f"{status}_at"] = int(time.time())

    def cancel(self, why: str | None = None) -> bool:
        """Cancelling: the lines in flight end, no more begin. `why`: an error of the batch's (the server stops).
        False where the batch has ended already (or is finalizing)."""
        with self._lock:
            if self.obj["status"] not in RUNNING:
                return self.obj["status"] in ("cancelling", "cancelled")
            self.obj.update(status="cancelling", cancelling_at=int(time.time()))
            if why:
                self.obj["errors"] = {"object": "list", "data": [{"code": "server_shutdown", "message": why,
                                                                  "param": None, "line": None}]}
            self.cancelled.set()
            return True

    def _fail(self, code: str, message: str) -> None:
        self._set("failed", errors={"object": "list", "data": [{"code": code, "message": message, "param": None,
                                                                "line": None}]})

    def _run(self) -> None:
        store, file_id = self.state.files, self.obj["input_file_id"]
        try:
            with open(store.path(file_id), "rb") as f:
                lines = f.readlines()
        except OSError as e:
            return self._fail("invalid_file", f"the input file {file_id} cannot be read: {e}")
        total = sum(1 for line in lines if line.strip())
        if not total:
            return self._fail("empty_file", f"the input file {file_id} has no requests")
        with self._lock:
            self.obj["request_counts"]["total"] = total
            if self.obj["status"] == "validating":   # (not cancelled meanwhile)
                self.obj.update(status="in_progress", in_progress_at=int(time.time()))
        name = f"{self.id}_{{}}.jsonl"
        outputs = {True: store.new(name.format("output"), "batch_output"),
                   False: store.new(name.format("error"), "batch_output")}
        try:
            self._answer(lines, outputs)
        except Exception as e:   # noqa: BLE001 - the file store's (disk full), the runner's own
            log.exception("batch %s failed", self.id)
            for new in outputs.values():
                new.drop()
            return self._fail("internal_error", f"{type(e).__name__}: {e}")
        self._finish(outputs)

    def _answer(self, lines: list[bytes], outputs: dict) -> None:
        counts = self.obj["request_counts"]

        def write(text: str, result: dict) -> None:
            ok = succeeded(result)
            outputs[ok].write(text.encode("utf-8"))
            if result["error"] is None or result["error"]["code"] != "batch_cancelled":
                with self._lock:
                    counts["completed" if ok else "failed"] += 1

        run_batch(self.state, lines, write, default_concurrency(self.state.engine.args), self.app,
                  (self.obj["endpoint"],), self.cancelled)

    def _finish(self, outputs: dict) -> None:
        with self._lock:
            if not self.cancelled.is_set():
                self.obj.update(status="finalizing", finalizing_at=int(time.time()))
        ids = {}
        for ok, new in outputs.items():
            if new.obj["bytes"]:
                ids["output_file_id" if ok else "error_file_id"] = new.keep()["id"]
            else:
                new.drop()
        self._set("cancelled" if self.cancelled.is_set() else "completed", **ids)


class Batches:
    """The server's batches, in the order they were created."""

    def __init__(self, state):
        self.state = state
        self._jobs: dict[str, BatchJob] = {}
        self._lock = threading.Lock()

    def create(self, app, input_file_id: str, endpoint: str, metadata: dict | None) -> dict:
        job = BatchJob(self.state, app, input_file_id, endpoint, metadata)
        with self._lock:
            self._jobs[job.id] = job
        view = job.view()   # (validating: the thread may have moved on by the time it is read)
        job.thread.start()
        return view

    def get(self, batch_id: str) -> BatchJob:
        with self._lock:
            job = self._jobs.get(batch_id)
        if job is None:
            raise ApiError(404, f"No batch with id '{batch_id}'", "batch_id", "not_found")
        return job

    def listed(self) -> list[dict]:
        with self._lock:
            jobs = list(self._jobs.values())
        return [job.view() for job in jobs]

    def stop(self, timeout: float | None = None) -> None:
        """The server stops: every running batch is cancelled (its lines end within a poll of the engine's
        outputs); waits for them up to `timeout` seconds."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel("the server stopped before the batch finished")
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in jobs:
            if job.thread.is_alive():
                job.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

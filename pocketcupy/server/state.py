"""What one server process holds: its configuration, the engine (loaded in the background after
the fork), the engine's step loop, readiness, metrics, and the Files and Batches APIs' files and batches."""
from __future__ import annotations

import logging
import os
import resource
import threading
import time
from dataclasses import dataclass, field

from ..args import EngineArgs
from .batch_jobs import Batches
from .files_store import FileStore
from .metrics import Metrics
from .responses_background import BackgroundResponses
from .responses_store import ResponseStore

log = logging.getLogger("pocketcupy.server")

DEFAULT_MAX_REQUEST_BYTES = 8 << 20
DEFAULT_MAX_FILE_BYTES = 512 << 20   # OpenAI's limit on a file
PROBES = ("/health", "/alive", "/ready")   # readiness routes: open without the API key


@dataclass
class ServerConfig:
    engine_args: EngineArgs = field(default_factory=EngineArgs)
    served_model_names: list[str] = field(default_factory=list)   # first one is reported
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    client_timeout_s: float = 30.0   # a request stalled this long: 408 (in the body) or dropped (headers)
    url: str = ""                    # for the log line
    startup_delay: float = 0.0       # testing aid: hold /ready at 503 this long
    poll_s: float = 0.25             # how often a waiting request checks for a gone client
    reasoning_parser: str | None = None  # chat: split <think> blocks into reasoning_content (reasoning.py)
    chat_template: str | None = None     # replaces the model's chat templates (vLLM's --chat-template)
    responses_store: int = 0             # the Responses API's stored responses (responses_store.py); 0: none
    exclude_tools_when_tool_choice_none: bool = False  # vLLM's: tool_choice "none" leaves the tools out of the prompt
    files_dir: str | None = None         # the Files API's folder (files_store.py); None: a temporary one
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES   # larger uploads get 413

    @property
    def model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else "default"


class ServerState:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.engine = None
        self.loop = None
        self.status = "loading"      # loading | ready | draining | failed
        self.end_at: float | None = None   # stopping: from this time.monotonic() on, in-flight requests end
        self.started = int(time.time())
        self.metrics = Metrics(self)
        self.responses = ResponseStore(config.responses_store) if config.responses_store else None
        self.background = BackgroundResponses(config.responses_store) if config.responses_store else None
        self.files = FileStore(config.files_dir)
        self.batches = Batches(self)

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def load(self) -> None:
        """Loads the model in this thread (the batch runner); raises what made it fail."""
        def fail(e):
            raise e
        self._load(fail)

    def start_loading(self, on_failure=None) -> threading.Thread:
        t = threading.Thread(target=self._load, args=(on_failure,), name="pocketcupy-load", daemon=True)
        t.start()
        return t

    def _load(self, on_failure) -> None:
        from ..engine import Engine
        from ..engine_loop import EngineLoop

        try:
            if self.config.startup_delay:
                time.sleep(self.config.startup_delay)
            engine = Engine.from_args(self.config.engine_args)
            engine.reasoning_parser = self.config.reasoning_parser   # (where a prompt opens the reasoning)
            if self.config.chat_template is not None:  # for every request, with or without tools
                engine.tokenizer.chat_template = self.config.chat_template
                engine.tokenizer.tool_use_template = None
            self.loop = EngineLoop(engine)
            self.engine = engine
        except BaseException as e:  # noqa: BLE001 - reported, then the process goes down
            self.status = "failed"
            log.error("could not load the model: %s", e)
            if on_failure is not None:
                on_failure(e)
            return
        if self.status == "loading":
            self.status = "ready"
        log.info("ready%s: model '%s' (%s on %s, loaded in %.1fs), max_model_len %d, KV cache %s, "
                 "process RSS %s", f" on {self.config.url}" if self.config.url else "", self.config.model_name,
                 os.path.basename(engine.model_path), engine.device, engine.load_time_s, engine.max_model_len,
                 _kv_text(engine), _rss_text())

    def begin_drain(self) -> None:
        """Stop taking new generation requests; in-flight ones finish; running batches are cancelled."""
        if self.status in ("loading", "ready"):
            self.status = "draining"
        self.batches.stop(timeout=0)

    def end_requests_at(self, when: float) -> None:
        """Stopping: requests still in flight at `when` (time.monotonic()) end with a 503 (a stream with an
        error event), so that the worker can exit before it is killed mid-write."""
        self.end_at = when if self.end_at is None else min(self.end_at, when)

    @property
    def ending(self) -> bool:
        return self.end_at is not None and time.monotonic() >= self.end_at

    def shutdown(self, timeout: float | None = None) -> None:
        self.begin_drain()
        if self.background is not None:
            self.background.cancel_all()
        self.batches.stop(timeout)
        if self.loop is not None:
            self.loop.shutdown(timeout)
        self.files.close()


def _kv_text(engine) -> str:
    s = engine.stats()
    per_block = getattr(engine, "_kv_block_bytes", lambda: 0)()
    states = s.get("recurrent_state_bytes", 0)
    return f"{s.get('kv_blocks_total', 0)} blocks x {engine.args.block_size} tokens = " \
           f"{s.get('kv_blocks_total', 0) * per_block / 2**20:.0f} MiB" + \
           (f" + recurrent state slots {states / 2**20:.0f} MiB" if states else "")


def _rss_text() -> str:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return f"{int(line.split()[1]) / 1024:.0f} MiB"
    except OSError:
        pass
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (peak)"

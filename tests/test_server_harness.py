"""Starts real servers (`scripts/serve.py` in a subprocess on a free 127.0.0.1 port, SmolLM2, on the CPU
unless POCKETCUPY_TEST_SERVER_DEVICE says otherwise)
for the server tests, and small raw-HTTP helpers. The session-wide `server` fixture is shared by
the test_server_*.py modules so the model loads once."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = "smollm2"
# the servers' backend: cpu here and in CI; POCKETCUPY_TEST_SERVER_DEVICE=cuda runs the same tests against
# servers on the GPU
DEVICE = os.environ.get("POCKETCUPY_TEST_SERVER_DEVICE", "cpu")
# on a GPU each server would size its KV pool from the memory left free, starving the next one
GPU_SHARE = () if DEVICE == "cpu" else ("--kv-cache-memory", str(1 << 30))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, model_path: str, *extra: str, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(tempfile.mkdtemp(prefix="pocketcupy-serve-"), "serve.log")
        self.log = open(self.log_path, "w+b")
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "serve.py"), "--model", model_path, "--device", DEVICE,
               "--port", str(self.port), "--served-model-name", MODEL, "--http-threads", "48", *GPU_SHARE, *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env=dict(os.environ, **(env or {})))

    def output(self) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_alive(self, timeout=60.0) -> None:
        self._wait("/alive", timeout)

    def wait_ready(self, timeout=120.0) -> None:
        self._wait("/ready", timeout)

    def _wait(self, path, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.output()}")
            try:
                if request(self, "GET", path)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{path} not 200 after {timeout}s:\n{self.output()}")

    def stop(self, sig=signal.SIGTERM, timeout=30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def request(server, method, path, body=None, headers=None, raw: bytes | None = None, timeout=120.0):
    """-> (status, parsed JSON or text, headers)."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        h = {"Content-Type": "application/json", **(headers or {})}
        c.request(method, path, data, h)
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        return r.status, parsed, dict(r.getheaders())
    finally:
        c.close()


def sse_events(server, path, body, headers=None, timeout=120.0):
    """POST and read a server-sent-events body -> (status, [parsed data objects, and 'DONE'])."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        if r.status != 200:
            return r.status, json.loads(r.read())
        events = []
        for line in r:
            line = line.strip()
            if line.startswith(b"data:"):
                data = line[5:].strip()
                events.append("DONE" if data == b"[DONE]" else json.loads(data))
        return r.status, events
    finally:
        c.close()


def metrics(server) -> dict:
    """{(name, frozenset(labels.items())): value} of /metrics, parsed by prometheus-client."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text, _ = request(server, "GET", "/metrics")
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(m: dict, name: str, **labels) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


_shared: list = []


@pytest.fixture(scope="session")
def server(smollm2_gguf):
    """One server for the whole session (a singleton: modules importing this fixture share it)."""
    if not _shared:
        s = ServerProcess(smollm2_gguf)
        _shared.append(s)
        s.wait_ready()
    yield _shared[0]
    if _shared:
        _shared.pop().stop()


@pytest.fixture(scope="session")
def client(server):
    return openai_client(server)


def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def serving(model_path: str, *extra: str):
    """A module fixture's body: a server of its own (e.g. with another --chat-template), stopped after."""
    s = ServerProcess(model_path, *extra)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()

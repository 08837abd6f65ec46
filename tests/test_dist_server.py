"""scripts/serve.py --tensor-parallel-size N on the CPU: the server (gunicorn worker = rank 0)
starts the other ranks, serves the same text as one rank, and any rank's death (or rank 0's)
brings the whole server down within seconds with the rank named in the log; SIGTERM stops every
rank cleanly. No process of the tree outlives the server."""
import os
import re
import signal
import time

import pytest

from tests.test_server_harness import MODEL, ServerProcess, request, server  # noqa: F401

from .conftest import FIXTURES

TINY = os.path.join(FIXTURES, "tiny_llama")


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent to collect it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, timeout=10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.05)
    return {p for p in pids if running(p)}


def rank_pids(s: ServerProcess) -> dict[int, int]:
    return {int(r): int(p) for r, p in re.findall(r"started rank (\d+) of \d+ \(pid (\d+)\)", s.output())}


def start(model, tp) -> ServerProcess:
    s = ServerProcess(model, "--tensor-parallel-size", str(tp))
    try:
        s.wait_ready()
    except BaseException:
        s.stop()
        raise
    return s


@pytest.fixture(scope="module")
def tp_server(smollm2_gguf):
    s = start(smollm2_gguf, 3)
    yield s
    s.stop()


def test_same_text_as_one_rank(tp_server, server):  # noqa: F811 - the session's one-rank server
    assert "3 ranks ready" in tp_server.output() and len(rank_pids(tp_server)) == 2
    comp = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 24, "temperature": 0}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Name three fruits."}], "max_tokens": 24,
            "temperature": 0}
    for path, body, key in (("/v1/completions", comp, "text"), ("/v1/chat/completions", chat, "message")):
        got = [request(s, "POST", path, body) for s in (tp_server, server)]
        assert [g[0] for g in got] == [200, 200]
        texts = [g[1]["choices"][0][key] for g in got]
        texts = [t["content"] if key == "message" else t for t in texts]
        assert texts[0] == texts[1] and texts[0]


def test_a_killed_rank_stops_the_server(tp_server):
    tree = descendants(tp_server.proc.pid)
    victim = rank_pids(tp_server)[1]
    assert victim in tree and len(tree) >= 4      # gunicorn worker (rank 0), ranks 1 and 2, resource tracker
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    assert tp_server.proc.wait(30) == 1
    elapsed = time.monotonic() - t0
    log = tp_server.output()
    assert re.search(r"tensor-parallel rank 1 failed: killed by signal SIGKILL \(pid \d+\); stopping all 3", log)
    assert "exiting: tensor-parallel rank 1 failed" in log and "Shutting down" in log
    assert elapsed < 10, f"server took {elapsed:.1f}s to stop"
    assert not wait_gone(tree), "processes outlived the server"


def test_sigterm_stops_every_rank():
    s = start(TINY, 2)
    tree = descendants(s.proc.pid)
    assert request(s, "POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4})[0] == 200
    assert s.stop() == 0
    assert not wait_gone(tree)


def test_a_killed_rank_zero_stops_the_server():
    s = start(TINY, 2)
    tree = descendants(s.proc.pid)
    worker = int(re.search(r"Booting worker with pid: (\d+)", s.output()).group(1))
    os.kill(worker, signal.SIGKILL)
    assert s.proc.wait(30) == 1
    assert "tensor-parallel rank 0 (the worker, pid %d) exited" % worker in s.output()
    assert not wait_gone(tree)
    s.stop()

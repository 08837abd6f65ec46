"""The shared real server while its engine is busy: the probes and /metrics answer at once, however
long the step in progress takes."""
import json
import socket
import threading
import time

import pytest

from tests.test_server_api import _wait_idle
from tests.test_server_harness import MODEL, metric, metrics, request, server, serving  # noqa: F401

STEP_TOKENS = 512   # --max-num-batched-tokens of short_steps: a prompt of 1,500 tokens takes 3 prefill steps


@pytest.fixture(scope="module")
def short_steps(smollm2_gguf):
    """A server whose prefill takes several short steps (the shared one's 2,048-token steps made the
    test below prefill 5,000 tokens, 20 s on a CPU)."""
    yield from serving(smollm2_gguf, "--max-num-batched-tokens", str(STEP_TOKENS))


def test_metrics_answer_during_a_long_step(server):
    """A scrape took the engine's lock, so it waited out the step in progress: a 2048-token prefill
    chunk held /metrics 20 s on a CPU (Prometheus gives up after 10 s). It reports the step as it began."""
    _wait_idle(server)
    done = []
    body = {"model": MODEL, "prompt": "word " * 1900, "max_tokens": 1}   # one prefill step
    t = threading.Thread(target=lambda: done.append(request(server, "POST", "/v1/completions", body)[0]))
    slowest, seen = 0.0, 0

    def scrape():
        nonlocal slowest
        s0 = time.monotonic()
        m = metrics(server)
        slowest = max(slowest, time.monotonic() - s0)
        return m
    t0 = time.monotonic()
    t.start()
    while t.is_alive() and not metric(scrape(), "pocketcupy_requests_in_flight"):
        time.sleep(0.01)
    while t.is_alive():
        m = scrape()
        if t.is_alive():
            seen += metric(m, "pocketcupy_num_requests_running") + metric(m, "pocketcupy_num_requests_waiting") == 1
        time.sleep(0.05)
    t.join()
    took = time.monotonic() - t0
    print(f"request {took:.1f} s; slowest scrape {slowest:.2f} s")
    assert done == [200]
    assert slowest < max(0.5, took / 4) and seen > 0
    _wait_idle(server)



def _post(server, body: dict) -> socket.socket:
    data = json.dumps(dict(body, model=MODEL)).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return s


def _engine(m) -> tuple:
    return (metric(m, "pocketcupy_num_requests_running") + metric(m, "pocketcupy_num_requests_waiting"),
            metric(m, "pocketcupy_requests_in_flight"), metric(m, "pocketcupy_kv_blocks_used"))


def test_a_gone_call_of_several_prompts_is_aborted_at_once(short_steps):
    """Closing a call of several prompts aborted them one at a time, each taking the engine's lock after
    a step: while another request prefilled in long steps, the call's prompts went on decoding (and its
    HTTP thread waited) one such step a prompt. Now the first step after the client went away runs the
    other request alone, the call closed. (Aborted one a step, the 8 prompts would outlast the 3
    prefill steps: the long request would never be alone.)"""
    srv = short_steps
    _wait_idle(srv)
    base = 1000 + int(time.time() * 1000) % 20000   # (a prompt no earlier run left in the prefix cache)
    call = _post(srv, {"prompt": ["a", "b", "c", "d", "e", "f", "g", "h"], "max_tokens": 2000,
                       "ignore_eos": True, "stream": True})
    assert call.recv(100).startswith(b"HTTP/1.1 200")
    while _engine(metrics(srv))[0] < 8:
        time.sleep(0.01)
    long = _post(srv, {"prompt": [base] * 1500, "max_tokens": 1})   # 3 prefill steps
    while _engine(metrics(srv))[0] < 9:
        time.sleep(0.01)
    call.close()
    alone = False
    while not alone and _engine(m := metrics(srv))[0]:
        # the long request alone in the engine (its blocks: half a step's and more), the call's HTTP side done
        alone = _engine(m)[:2] == (1, 1) and _engine(m)[2] > STEP_TOKENS // 32
        time.sleep(0.02)
    long.settimeout(120)
    assert long.recv(100).startswith(b"HTTP/1.1 200")
    long.close()
    _wait_idle(srv)
    assert alone

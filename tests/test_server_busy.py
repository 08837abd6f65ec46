"""The shared real server while its engine is busy: the probes and /metrics answer at once, however
long the step in progress takes."""
import threading
import time

from tests.test_server_api import _wait_idle
from tests.test_server_harness import MODEL, metric, metrics, request, server  # noqa: F401


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

"""Clients that misbehave at the HTTP level against a real server of their own (two HTTP threads, a
one-second --client-timeout): none of them holds the server's threads, requests or KV blocks for good.
And stopping a server (servers of their own) whose requests outlast it."""
import http.client
import json
import signal
import socket
import time

import pytest

from tests.test_server_harness import MODEL, ServerProcess, request, serving

BIG_ANSWER = json.dumps({"tokens": [46778] * 200_000}).encode()   # 46778: "\n" and 80 spaces; a 16 MB answer


@pytest.fixture(scope="module")
def tight(smollm2_gguf):
    yield from serving(smollm2_gguf, "--client-timeout", "1", "--http-threads", "2", "--max-num-seqs", "2")


def _send(server, path: str, body: bytes) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)   # (no receive-buffer autotuning)
    s.connect(("127.0.0.1", server.port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % (path.encode(), len(body)) + body)
    return s


def _read_to_end(s: socket.socket) -> int:
    n = 0
    try:
        while data := s.recv(1 << 20):
            n += len(data)
    except ConnectionResetError:
        pass
    return n


def test_a_client_that_stops_reading_is_dropped(tight):
    """Clients that stop reading their answer (their socket buffers full) held an HTTP thread each for good:
    --http-threads of them blocked every route. After --client-timeout without progress they are dropped."""
    dropped = "a client stalled reading its response past --client-timeout; dropped"
    before = tight.output().count(dropped)
    stalled = [_send(tight, "/detokenize", BIG_ANSWER) for _ in range(2)]
    try:
        t0 = time.monotonic()
        assert request(tight, "GET", "/v1/models", timeout=15)[0] == 200
        assert time.monotonic() - t0 < 10
        while tight.output().count(dropped) < before + 2:
            assert time.monotonic() - t0 < 15, tight.output()[-2000:]
            time.sleep(0.1)
        for s in stalled:
            s.settimeout(30)
            assert _read_to_end(s) < 16_000_000   # cut short
    finally:
        for s in stalled:
            s.close()


def test_idle_connections_take_no_http_thread(tight):
    """A connection that sends nothing took an HTTP thread for 5 s (gunicorn waits for its first bytes in
    one): --http-threads such connections, opened again and again, held every request back that long."""
    idle = [socket.create_connection(("127.0.0.1", tight.port)) for _ in range(2)]
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        assert request(tight, "GET", "/v1/models", timeout=30)[0] == 200
        assert time.monotonic() - t0 < 2
    finally:
        for s in idle:
            s.close()


def _post(server, path: str, body: dict) -> http.client.HTTPConnection:
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return c


@pytest.mark.parametrize("sig,graceful_timeout", [(signal.SIGINT, 30), (signal.SIGTERM, 6)], ids=["SIGINT", "SIGTERM"])
def test_stopping_ends_the_requests_that_outlast_it(smollm2_gguf, sig, graceful_timeout):
    """SIGINT (stop now), or SIGTERM with a stream longer than --graceful-timeout: the stream ends with an error
    event and [DONE], a request still queued gets a 503, and the worker exits by itself. The arbiter killed it at
    the end of --graceful-timeout (SIGINT: "Worker was sent SIGKILL! Perhaps out of memory?" after 30 s), and
    the clients were left with a cut chunked body, or no answer at all."""
    s = ServerProcess(smollm2_gguf, "--graceful-timeout", str(graceful_timeout), "--max-num-seqs", "1")
    try:
        s.wait_ready()
        stream = _post(s, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                                   "max_tokens": 4000, "ignore_eos": True, "stream": True})
        r = stream.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data:")
        queued = _post(s, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 4})
        time.sleep(0.5)
        t0 = time.monotonic()
        s.proc.send_signal(sig)
        rest = r.read()
        stream.close()
        assert rest.rstrip().endswith(b"data: [DONE]") and b"shutting down" in rest, rest[-300:]
        error = json.loads(rest.rstrip().split(b"\n\n")[-2].removeprefix(b"data: "))["error"]
        assert (error["type"], error["code"]) == ("service_unavailable_error", "service_unavailable"), error  # a 503's
        answer = queued.getresponse()
        assert answer.status == 503 and "shutting down" in json.loads(answer.read())["error"]["message"]
        queued.close()
        assert s.proc.wait(20) == 0 and time.monotonic() - t0 < graceful_timeout
        print(f"exited {time.monotonic() - t0:.1f} s after {sig.name}")
        assert "SIGKILL" not in s.output()
    finally:
        s.stop()

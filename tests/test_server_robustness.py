"""Clients that misbehave at the HTTP level against a real server of their own (two HTTP threads, a
one-second --client-timeout): none of them holds the server's threads, requests or KV blocks for good."""
import json
import socket
import time

import pytest

from tests.test_server_harness import request, serving

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

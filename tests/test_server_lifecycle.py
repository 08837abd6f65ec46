"""A server of its own: /ready is 503 while the model loads, API keys (401 everywhere but the
probes), the body limit (413), a stalled request (408), the startup log, and SIGTERM letting an open
stream finish while new connections are refused."""
import http.client
import json
import signal
import socket
import time

import pytest

from tests.test_server_harness import MODEL, ServerProcess, request

KEY = "sk-test-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def keyed(smollm2_gguf):
    s = ServerProcess(smollm2_gguf, "--startup-delay", "2", "--max-request-bytes", "4096", "--graceful-timeout", "60",
                      "--client-timeout", "1", "--http-threads", "2",
                      env={"POCKETCUPY_API_KEY": KEY})
    try:
        yield s
    finally:
        s.stop(timeout=60)


def test_ready_is_503_until_loaded(keyed):
    keyed.wait_alive()
    status, body, _ = request(keyed, "GET", "/ready")
    assert status == 503 and body == {"status": "loading"}
    assert request(keyed, "GET", "/health")[0] == 503
    status, body, _ = request(keyed, "GET", "/v1/models", headers=AUTH)
    assert status == 503 and body["error"]["type"] == "service_unavailable_error"
    # Anthropic's body: an api_error (its overloaded_error, which this was, comes with a 529, not a 503)
    status, body, _ = request(keyed, "POST", "/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "user", "content": "Hi"}]}, headers={"x-api-key": KEY})
    assert status == 503 and body["error"]["type"] == "api_error" and "loading" in body["error"]["message"], body
    keyed.wait_ready()
    assert request(keyed, "GET", "/health")[0] == 200
    log = keyed.output()
    assert "listening on http://127.0.0.1:" in log and "loading" in log  # the loading progress line
    assert f"ready on {keyed.url}" in log and "KV cache" in log and "RSS" in log


@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/metrics"),
                                         ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                                         ("GET", "/v1/unknown")])
def test_api_key_required(keyed, method, path):
    keyed.wait_ready()
    body = {"/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 1}}.get(path)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, resp, _ = request(keyed, method, path, body, headers=headers)
        assert status == 401 and resp["error"]["code"] == "invalid_api_key"
    assert request(keyed, method, path, body, headers=AUTH)[0] == (404 if path == "/v1/unknown" else 200)
    for probe in ("/health", "/alive", "/ready"):
        assert request(keyed, "GET", probe)[0] == 200


def test_openai_client_with_key(keyed):
    import openai

    keyed.wait_ready()
    good = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_anthropic_client_with_key(keyed):
    """Anthropic's clients send the key as x-api-key; a wrong one is a 401 in Anthropic's body."""
    anthropic = pytest.importorskip("anthropic")
    keyed.wait_ready()
    good = anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0)
    msg = good.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert msg.usage.output_tokens >= 1
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=keyed.url, api_key="nope", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["error"]["type"] == "authentication_error"


def test_body_limit_413(keyed):
    keyed.wait_ready()
    big = {"model": MODEL, "prompt": "x" * 5000, "max_tokens": 1}
    status, resp, _ = request(keyed, "POST", "/v1/completions", big, headers=AUTH)
    assert status == 413 and resp["error"]["code"] == "request_too_large"
    # chunked, without a Content-Length
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=30) as s:
        data = json.dumps(big).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.sendall(b"%x\r\n" % len(data) + data + b"\r\n0\r\n\r\n")
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413")
    assert request(keyed, "GET", "/health")[0] == 200


def test_stalled_request_times_out(keyed):
    """A client that stops sending its body mid-way gets 408, one that stops mid-headers is dropped,
    instead of holding an HTTP thread for good."""
    keyed.wait_ready()
    upload = (b"--b\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--b\r\n"
              b"Content-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\r\n{")
    for path, kind, start in (("/v1/completions", b"application/json", b"{"),   # a JSON body, a file upload's
                              ("/v1/files", b"multipart/form-data; boundary=b", upload)):
        with socket.create_connection(("127.0.0.1", keyed.port), timeout=30) as s:
            s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: " + kind + b"\r\n"
                      b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n" + start)
            t0 = time.monotonic()
            head, _, body = s.recv(65536).partition(b"\r\n\r\n")
            body += s.recv(65536) if not body else b""
        assert head.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 10, (path, head)
        assert json.loads(body)["error"]["code"] == "request_timeout"
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=30) as s:  # stalled mid-headers: dropped
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        assert s.recv(65536) == b"" and time.monotonic() - t0 < 10
    assert request(keyed, "GET", "/health")[0] == 200
    log = keyed.output()  # the drop is what --client-timeout asks for: one line, not an error's traceback
    assert "client stalled sending its request headers" in log
    assert "Socket error processing request" not in log and "BlockingIOError" not in log, log


def test_clients_that_do_not_close_do_not_stall_others(keyed):
    """Closing a connection lingers (up to 2 s) for the client to close too; that must not hold up
    the server's other connections (it ran on gunicorn's main thread, one client after the other)."""
    keyed.wait_ready()
    idle = [socket.create_connection(("127.0.0.1", keyed.port), timeout=30) for _ in range(3)]
    try:
        for s in idle:
            s.sendall(b"GET /alive HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")  # never read, never closed
        time.sleep(0.3)
        t0 = time.monotonic()
        assert request(keyed, "GET", "/health", timeout=30)[0] == 200
        assert time.monotonic() - t0 < 2.5   # (lingering one after the other: ~6 s)
    finally:
        for s in idle:
            s.close()


def _open_stream(server, max_tokens):
    body = {"model": MODEL, "prompt": "Count to fifty:", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True}
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json", **AUTH})
    r = c.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data:")
    return c, r


def test_probes_answer_while_every_http_thread_streams(keyed):
    """With both HTTP threads (--http-threads 2) held by streams, probes and /metrics are still
    answered at once (they queued behind the streams), and other requests wait for a thread (one
    freed here by a stream's client going away: waiting for a 120-token stream's end took 15 s)."""
    keyed.wait_ready()
    streams = [_open_stream(keyed, 120) for _ in range(2)]
    try:
        for path, headers in (("/health", {}), ("/ready", {}), ("/alive", {}), ("/metrics", AUTH)):
            t0 = time.monotonic()
            assert request(keyed, "GET", path, headers=headers, timeout=60)[0] == 200
            assert time.monotonic() - t0 < 3, path
        for _, r in streams:  # still streaming
            assert json.loads(_next_event(r))["choices"][0]["finish_reason"] is None
        streams[0][1].close()
        streams[0][0].close()
        assert request(keyed, "GET", "/v1/models", headers=AUTH, timeout=120)[0] == 200  # after a stream ends
    finally:
        for c, _ in streams:
            c.close()


def _next_event(r) -> bytes:
    while not (line := r.readline()).startswith(b"data:"):
        assert line, "stream ended"
    return line[5:]


def test_sighup_keeps_the_worker(keyed):
    """A hang-up (logrotate) reopens the logs; gunicorn's reload booted a second worker, loading a
    second copy of the model beside the first."""
    keyed.wait_ready()
    booted = keyed.output().count("Booting worker")
    keyed.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "Hang up" not in keyed.output():
        assert time.monotonic() < deadline, keyed.output()
        time.sleep(0.05)
    time.sleep(1.0)   # (a reload boots its worker at once)
    log = keyed.output()
    assert "the model is not reloaded" in log and log.count("Booting worker") == booted
    assert request(keyed, "GET", "/health")[0] == 200


def test_sigterm_lets_streams_finish(keyed):
    keyed.wait_ready()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 60,
            "ignore_eos": True, "temperature": 0, "stream": True}
    c = http.client.HTTPConnection("127.0.0.1", keyed.port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json", **AUTH})
    r = c.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data:")
    t0 = time.monotonic()
    keyed.proc.send_signal(signal.SIGTERM)
    while True:  # a new connection is refused at once, not held in the backlog for the whole drain
        try:
            socket.create_connection(("127.0.0.1", keyed.port), timeout=5).close()
        except (ConnectionRefusedError, ConnectionResetError):   # reset: caught as the listener closed
            break
        assert time.monotonic() - t0 < 3, "new connections still accepted while draining"
        time.sleep(0.05)
    rest = r.read().decode()
    events = [json.loads(x[5:]) for x in rest.split("\n") if x.startswith("data:") and "[DONE]" not in x]
    assert rest.rstrip().endswith("data: [DONE]")
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert keyed.proc.wait(60) == 0
    print(f"stream finished {time.monotonic() - t0:.1f}s after SIGTERM")

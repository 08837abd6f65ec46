"""Requests gunicorn itself refuses (a request line or headers over its limits, an unparsable request line,
method, version or header) answered with OpenAI's JSON error body and gunicorn's status, not its HTML
page; the connection closes, as before. And every POST route's answer to a body that is no JSON object."""
import json
import socket

import pytest

from tests.test_server_harness import request, server  # noqa: F401

HOST = b"Host: x\r\n"
PROTOCOL = [  # (request bytes, status)
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + HOST + b"\r\n", 414),                      # LimitRequestLine
    (b"GET /health HTTP/1.1\r\n" + HOST + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),     # a field too large
    (b"GET /health HTTP/1.1\r\n" + HOST + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n", 431),
    (b"GARBAGE\r\n\r\n", 400),                                                              # request line
    (b"G(T /health HTTP/1.1\r\n" + HOST + b"\r\n", 400),                                     # method
    (b"GET /health HTTP/9.9\r\n" + HOST + b"\r\n", 400),                                     # HTTP version
    (b"GET /health HTTP/1.1\r\n" + HOST + b"Bad Name: 1\r\n\r\n", 400),                      # header name
    (b"GET /health HTTP/1.1\r\n" + HOST + b"NoColon\r\n\r\n", 400),                          # header
    (b"POST /tokenize HTTP/1.1\r\n" + HOST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
    (b"POST /tokenize HTTP/1.1\r\n" + HOST + b"Content-Length: -1\r\n\r\n{}", 400),
    (b"POST /tokenize HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n", 400),
    (b"POST /tokenize HTTP/1.1\r\n" + HOST + b"Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}", 417),
]


def exchange(server, raw: bytes) -> tuple[bytes, dict, bytes]:
    """Sends raw bytes and reads until the server closes -> (status line, headers, body)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(raw)
        reply = b""
        while data := s.recv(65536):  # the server closes the connection (a timeout fails the test)
            reply += data
    head, _, body = reply.partition(b"\r\n\r\n")
    line, *fields = head.decode("latin-1").split("\r\n")
    return line.encode(), {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}, body


@pytest.mark.parametrize("raw,status", PROTOCOL, ids=[f"{i}-{s}" for i, (_, s) in enumerate(PROTOCOL)])
def test_refused_by_gunicorn_is_an_openai_error(server, raw, status):
    line, headers, body = exchange(server, raw)
    assert line.startswith(b"HTTP/1.1 %d " % status), (line, body)
    assert headers["content-type"] == "application/json" and headers["connection"] == "close", headers
    assert int(headers["content-length"]) == len(body)
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] is None, err
    assert err["type"] == "invalid_request_error" and err["message"] and err["code"], err


def test_serving_after_refused_requests(server):
    for raw, _ in PROTOCOL[:3]:
        exchange(server, raw)
    assert request(server, "GET", "/health")[0] == 200


@pytest.mark.parametrize("framing", [b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n"])
def test_bad_chunks_of_an_unread_body_no_second_answer(server, framing):
    """A GET's body is not read by the app; gunicorn reads it off after the answer, and its bad chunked
    framing got a second, unasked-for answer (a 400) on the connection behind the first."""
    raw = b"GET /health HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: chunked\r\n\r\n" + framing
    line, headers, body = exchange(server, raw)
    assert line.startswith(b"HTTP/1.1 200 ") and json.loads(body) == {"status": "ready"}, body


POST_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/score", "/v1/score",
               "/rerank", "/v1/rerank", "/v2/rerank", "/tokenize", "/detokenize", "/v1/messages",
               "/v1/messages/count_tokens"]
JSON, FORM = "application/json", "application/x-www-form-urlencoded"
NOT_AN_OBJECT = [(b'{"model": ', JSON), (b"[1, 2]", JSON), (b"null", JSON), (b"", JSON), (b"a=1&b=2", FORM),
                 (b"\x00\x01", "text/plain"),
                 (b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--x--\r\n',
                  "multipart/form-data; boundary=x")]


@pytest.mark.parametrize("path", POST_ROUTES)
def test_a_body_that_is_no_json_object_is_a_400(server, path):
    """Whatever the Content-Type (the body is read as JSON regardless, as `curl -d` sends it form-encoded),
    a body that is not a JSON object is a 400 with the route's JSON error body."""
    for raw, ctype in NOT_AN_OBJECT:
        status, resp, headers = request(server, "POST", path, raw=raw, headers={"Content-Type": ctype})
        assert status == 400 and headers["Content-Type"] == "application/json", (raw, ctype, resp)
        err = resp["error"]
        assert err["type"] == "invalid_request_error" and err["message"], (raw, ctype, resp)
        assert (resp["type"] == "error") if path.startswith("/v1/messages") else (err["param"] is None), resp

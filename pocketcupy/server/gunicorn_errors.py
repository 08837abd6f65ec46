"""gunicorn's own answers to requests it cannot take (a request line or headers over its limits, an invalid
request line, method, version or header, ...) as OpenAI error bodies in JSON, instead of its HTML page.

gunicorn's Worker.handle_error picks the status, logs and writes the access-log line; it writes its answer
to a recorder here, which keeps the status line, and the worker sends the JSON answer with that status
(and Connection: close: gunicorn closes the connection, as before).
"""
from __future__ import annotations

from .protocol import ApiError
from .responses import json_bytes


class ErrorRecorder:
    """Stands in for the client's socket in gunicorn's handle_error: what it would have sent, kept."""

    def __init__(self):
        self.sent = b""

    def gettimeout(self):
        return 0.0   # (gunicorn's write_nonblock leaves a non-blocking socket's mode alone)

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def status(self) -> tuple[int, str]:
        """gunicorn's status line: (code, reason); (500, Internal Server Error) if it wrote none."""
        line = self.sent.split(b"\r\n", 1)[0].decode("latin-1")
        _, code, reason = (line.split(" ", 2) + ["", ""])[:3]
        return (int(code), reason) if code.isdigit() else (500, "Internal Server Error")


def error_reply(status: int, reason: str, exc: BaseException) -> bytes:
    """The whole HTTP answer: status line, headers, OpenAI's JSON body. (gunicorn has not parsed the route,
    or not made it known: Anthropic's clients read this body's error.message and error.type as well.)"""
    code = "_".join(reason.lower().split()) or "error"
    if status >= 500 and status != 501:   # an exception of the server's, not a request it refuses
        err = ApiError(status, f"internal server error: {type(exc).__name__}", code="internal_error")
    else:
        err = ApiError(status, f"{reason}: {exc}", code=code, type="invalid_request_error")
    body = json_bytes(err.body())
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body

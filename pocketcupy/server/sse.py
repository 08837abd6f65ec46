"""A server-sent-events body over a generator of chunk dicts.

It ends with `data: [DONE]` (after an error object if the engine failed mid-stream; the Responses
API's streams, as OpenAI's, without it), and closing it - gunicorn does when the client's socket
breaks, or when the response is done - aborts the engine requests that are still running, so their
KV blocks go back to the pool.
"""
from __future__ import annotations

import logging

from .generation import ClientGone
from .protocol import ApiError
from .responses import SSE_DONE, sse

log = logging.getLogger("pocketcupy.server")


class SSEStream:
    """chunks: dicts, each written by `fmt` (the Responses and Anthropic APIs': sse_event, named by
    its type); error: the chunk (or list of chunks) that ends a failed generation, of its ApiError (by
    default the OpenAI error body the response would have had, whose `{"error": ...}` the client raises,
    as vLLM's; a failure of the server's own is a 500's; the Responses and Anthropic APIs' own events)."""

    def __init__(self, chunks, job, fmt=sse, done: bool = True, error=ApiError.body):
        self.chunks, self.job, self.fmt, self.done, self.error = chunks, job, fmt, done, error

    def __iter__(self):
        try:
            for c in self.chunks:
                yield self.fmt(c)
        except ClientGone:
            log.info("client of %s went away; request aborted", self.job.request_id)
            return
        except ApiError as e:   # the server is stopping, or the engine failed the request for its input
            log.info("stream %s ended: %s", self.job.request_id, e.message)
            yield from self._ending(e)
        except Exception as e:  # noqa: BLE001 - the stream must end cleanly whatever happened
            log.exception("stream %s failed", self.job.request_id)
            self.job.close("error")
            yield from self._ending(ApiError(500, f"generation failed: {type(e).__name__}: {e}"))
        finally:
            self.job.close()
        if self.done:
            yield SSE_DONE

    def _ending(self, e: ApiError):
        out = self.error(e)
        for c in out if isinstance(out, list) else [out]:
            yield self.fmt(c)

    def close(self) -> None:
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()
        self.job.close()

"""Offline batch jobs in the OpenAI Batch API's file format (as vLLM's run_batch): each input line,
{"custom_id", "method": "POST", "url", "body"}, is answered by the server's own route in this process
(Flask's in-process client: no socket), many lines at once so that the engine batches them; each
result is a line {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}, in
the input's order. A request the route refuses is a response with its status and OpenAI error body;
a line that is no request at all (not JSON, no custom_id, another method or url) has "response":
null and "error": {"code", "message"}, as OpenAI's batch output files do. The server's Batches API
(batch_jobs.py) runs its batches through the same run_batch, with its own app, its endpoint and a
cancellation event."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from .generation import GONE_PROBE, GONE_STATUS
from .protocol import bad
from .responses import new_id

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/score", "/v1/rerank")


def run_batch(state, lines: Iterable[str | bytes], write: Callable[[str, dict], None], concurrency: int,
              app=None, urls: tuple[str, ...] = URLS, cancelled: threading.Event | None = None) -> dict:
    """Answers the input lines (blank ones skipped), at most `concurrency` at once, through `app`'s routes (by
    default an app of its own); write(text, result) gets each result line as soon as it and those before it
    are done. Lines of bytes are decoded as json.loads does (UTF-8, with or without a BOM; one that is none is
    an error line); a line whose url is not one of `urls` is an error line. Once `cancelled` is set, the lines
    in flight are aborted and the rest are not begun: each is an error line "batch_cancelled". Returns the
    counts."""
    if app is None:
        from .app import create_app   # (here: the app's batch routes import this module)
        app = create_app(state)
    cancelled = cancelled or threading.Event()
    headers = {"Authorization": f"Bearer {state.config.api_key}"} if state.config.api_key else {}
    seen: dict[str, int] = {}   # custom_id -> the line that first gave it
    jobs = [_parse(n, line, seen, urls) for n, line in enumerate(lines, 1) if line.strip()]   # (the file's numbers)
    counts = {"requests": len(jobs), "succeeded": 0, "failed": 0}
    pool = ThreadPoolExecutor(max(1, concurrency))
    try:
        for result in pool.map(lambda job: job if isinstance(job, dict) else _answer(app, headers, cancelled, *job),
                               jobs):
            counts["succeeded" if succeeded(result) else "failed"] += 1
            write(_json_line(result), result)
    except BaseException:   # Ctrl-C, a write that failed: the lines not begun are dropped, those in flight end
        cancelled.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return counts


def default_concurrency(args) -> int:
    """How many lines run at once unless told: enough to keep max_num_seqs busy while others queue."""
    return max(64, 2 * args.max_num_seqs)


def succeeded(result: dict) -> bool:
    """Whether a result line is an answer with status 200 (OpenAI's output file), not a failure (its error file)."""
    return result["response"] is not None and result["response"]["status_code"] == 200


def error_line(custom_id: str | None, code: str, message: str) -> dict:
    return {"id": new_id("batch_req"), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def _json_line(result: dict) -> str:
    """The result as a line of UTF-8 text; escaped (ASCII) where a lone surrogate from a \\ud800 escape in the
    input (a custom_id, say) would make the text no UTF-8 at all."""
    text = json.dumps(result, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(result)
    return text + "\n"


def _parse(number: int, line: str | bytes, seen: dict, urls: tuple[str, ...]) -> tuple | dict:
    """(custom_id, url, body) of a line that is a request, else its error line."""
    custom_id = None
    try:
        try:
            req = json.loads(line)
        except RecursionError:   # nested deeper than the parser's recursion limit
            raise ValueError("the JSON nests too deep") from None
        if not isinstance(req, dict):
            raise ValueError("a line must be a JSON object")
        custom_id = req.get("custom_id")
        url, body = req.get("url"), req.get("body")
        if not isinstance(custom_id, str) or not custom_id:
            raise ValueError("'custom_id' must be a non-empty string")
        if custom_id in seen:
            raise ValueError(f"'custom_id' {custom_id!r} is line {seen[custom_id]}'s too; "
                             "each request needs its own")
        seen[custom_id] = number
        if req.get("method") != "POST":
            raise ValueError(f"'method' must be 'POST', got {req.get('method')!r}")
        if url not in urls:
            raise ValueError(f"'url' must be {'one of ' * (len(urls) > 1)}{', '.join(urls)}, got {url!r}")
        if not isinstance(body, dict):
            raise ValueError("'body' must be a JSON object")
    except ValueError as e:   # (json.JSONDecodeError and UnicodeDecodeError are)
        return error_line(custom_id if isinstance(custom_id, str) else None, "invalid_request", f"line {number}: {e}")
    return custom_id, url, body


def _answer(app, headers: dict, cancelled: threading.Event, custom_id: str, url: str, body: dict) -> dict:
    if cancelled.is_set():
        return error_line(custom_id, "batch_cancelled", "the batch was cancelled before this request ran")
    if body.get("stream"):
        status, answer = 400, bad("stream", "a batch request cannot stream; leave 'stream' out").body()
    else:   # (the route's probe for a gone client tells it that the batch was cancelled: generation.py)
        resp = app.test_client().post(url, json=body, headers=headers,
                                      environ_overrides={GONE_PROBE: cancelled.is_set})
        if cancelled.is_set() and resp.status_code == GONE_STATUS:
            return error_line(custom_id, "batch_cancelled", "the batch was cancelled while this request ran")
        status, answer = resp.status_code, resp.get_json()
    request_id = answer.get("id") if status == 200 else None
    return {"id": new_id("batch_req"), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id or new_id("req"), "body": answer},
            "error": None}

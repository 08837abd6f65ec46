"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API on the chat path
(anthropic_input translates the request), for clients and tools written against it (as vLLM and
llama-server serve it). The reply's content is blocks in the order the model wrote them --
thinking (with a reasoning parser), text, tool_use -- streamed as the API's named events
(message_start ... message_stop). Errors have Anthropic's body (app.py picks it by route)."""
from __future__ import annotations

import json
import uuid

from .anthropic_input import as_chat_body, renamed
from .chat import chat_updates, count_prompt_tokens, parse_chat, start_chat_job
from .output_segments import Segments
from .protocol import ApiError, Fields
from .responses import sse_event
from .sse import SSEStream

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def _input(arguments: str) -> dict:
    """A call's arguments as tool_use input (an object; text that is not one, e.g. cut by max_tokens,
    under '_raw' rather than lost)."""
    try:
        v = json.loads(arguments)
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return v if isinstance(v, dict) else {"_raw": arguments}


class ContentBlocks:
    """The reply's content blocks, one a segment (output_segments.Segments); every change also
    comes back as the stream events announcing it."""

    def __init__(self):
        self.segments = Segments()
        self.ids: dict[int, str] = {}

    def feed(self, events: list) -> list[dict]:
        return [e for change in self.segments.feed(events) for e in self._announce(change)]

    def finish(self) -> list[dict]:
        return [e for change in self.segments.close() for e in self._announce(change)]

    def block(self, i: int) -> dict:
        s = self.segments.segs[i]
        if s["kind"] == "call":
            return {"type": "tool_use", "id": self.ids[i], "name": s["name"], "input": _input(s["text"])}
        if s["kind"] == "reasoning":
            return {"type": "thinking", "thinking": s["text"], "signature": ""}
        return {"type": "text", "text": s["text"]}

    def whole(self) -> list[dict]:
        return [self.block(i) for i in range(len(self.segments.segs))]

    def _announce(self, change: tuple) -> list[dict]:
        what, i = change[0], change[1]
        kind = self.segments.segs[i]["kind"]
        if what == "open":
            if kind == "call":
                self.ids[i] = f"toolu_{uuid.uuid4().hex[:24]}"
                start = {"type": "tool_use", "id": self.ids[i], "name": self.segments.segs[i]["name"], "input": {}}
            else:
                start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "reasoning" \
                    else {"type": "text", "text": ""}
            return [{"type": "content_block_start", "index": i, "content_block": start}]
        if what == "close":
            return [{"type": "content_block_stop", "index": i}]
        delta = {"call": {"type": "input_json_delta", "partial_json": change[2]},
                 "reasoning": {"type": "thinking_delta", "thinking": change[2]},
                 "content": {"type": "text_delta", "text": change[2]}}[kind]
        return [{"type": "content_block_delta", "index": i, "delta": delta}]


def _stop(last) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of the last update."""
    if last is None or last.finish_reason is None:
        return None, None
    if last.finish_reason == "stop" and isinstance(last.stop_reason, str):
        return "stop_sequence", last.stop_reason
    return STOP_REASONS.get(last.finish_reason, "end_turn"), None


def _usage(prompt_len: int, last, output: bool = True) -> dict:
    """Anthropic's usage: input_tokens are the prompt tokens the prefix cache did not hold, the ones
    it held are cache_read_input_tokens (the API's total input is the sum of these and
    cache_creation_input_tokens, 0 here: the prefix cache has no explicit writes; vLLM's /v1/messages
    reports them so too). output=False: none generated yet (the stream's message_start)."""
    cached = last.num_cached_tokens if last else 0
    return {"input_tokens": prompt_len - cached, "output_tokens": last.num_tokens if last and output else 0,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def handle_messages(state, body, gone):
    chat_body, origin = as_chat_body(Fields(body))
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    with renamed(origin) as names:
        req = parse_chat(state, chat_body)
        job, forced, ids = start_chat_job(state, req, mid, gone, names.error)
    prompt_len = len(ids)
    head = {"id": mid, "type": "message", "role": "assistant", "model": req.model}
    blocks = ContentBlocks()
    if req.stream:
        return SSEStream(_stream(state, job, req, forced, head, blocks, prompt_len), job, sse_event, done=False,
                         error=ApiError.anthropic_body)
    last = None
    with job:
        for u in chat_updates(state, req, job, forced):
            blocks.feed(u.events)
            last = u
    blocks.finish()
    stop_reason, stop_sequence = _stop(last)
    return dict(head, content=blocks.whole(), stop_reason=stop_reason, stop_sequence=stop_sequence,
                usage=_usage(prompt_len, last))


def _start(head: dict, prompt_len: int, first) -> dict:
    return {"type": "message_start", "message": dict(head, content=[], stop_reason=None, stop_sequence=None,
                                                    usage=_usage(prompt_len, first, output=False))}


def _stream(state, job, req, forced, head: dict, blocks: ContentBlocks, prompt_len: int):
    """message_start waits for the engine's first output: only then (the prompt scheduled) is it known
    how much of the prompt the prefix cache held, so its usage and message_delta's (the cumulative
    totals, as Anthropic's API sends them) agree with each other and with the whole response's. A ping
    follows the first content_block_start, as in Anthropic's streams."""
    last, pinged = None, False
    for u in chat_updates(state, req, job, forced):
        if last is None:
            yield _start(head, prompt_len, u)
        for e in blocks.feed(u.events):
            yield e
            if not pinged and e["type"] == "content_block_start":   # where Anthropic's streams send it
                yield {"type": "ping"}
                pinged = True
        last = u
    if last is None:
        yield _start(head, prompt_len, None)
    yield from blocks.finish()
    stop_reason, stop_sequence = _stop(last)
    yield {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
           "usage": _usage(prompt_len, last)}
    yield {"type": "message_stop"}


def handle_count_tokens(state, body) -> dict:
    """The prompt's token count as /v1/messages would render it."""
    chat_body, origin = as_chat_body(Fields(body), count_only=True)
    return {"input_tokens": count_prompt_tokens(state, chat_body, renamed(origin))}

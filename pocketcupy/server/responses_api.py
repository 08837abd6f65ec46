"""POST /v1/responses: OpenAI's Responses API on the chat path (responses_input translates the
request). The output is a list of typed items -- reasoning (with a reasoning parser), message,
function_call -- in the order the model wrote them; streamed, as the API's named events
(response.created ... response.completed). Responses are kept only with the server's response
store (`--responses-store N`, responses_store.py), failed ones too; without it `store` is reported
false, as vLLM does without its store, and `previous_response_id` and `background` are a 400. A
`background` response runs in a thread of its own (responses_background.py); `truncation: "auto"` drops
the oldest input items that do not fit (responses_truncation.py). POST /v1/responses/input_tokens
counts a request's prompt tokens."""
from __future__ import annotations

import copy
import itertools
import time
from functools import partial

from .chat import chat_updates, encode_prompt, start_chat_job
from .output_segments import Segments
from .protocol import Fields, bad
from .responses import sse_event
from .responses_background import BackgroundResponse, followed
from .responses_input import as_chat_body, renamed
from .responses_items import item_id
from .responses_truncation import fitted
from .sse import SSEStream

# the Responses fields a response object repeats from its request (absent: null)
ECHOED = ("instructions", "max_output_tokens", "metadata", "prompt_cache_key", "safety_identifier", "service_tier",
          "top_logprobs", "user")


class OutputItems:
    """The response's output items, one a segment of the reply (output_segments.Segments): message,
    reasoning or function_call. Every change also comes back as the stream events announcing it
    (without sequence numbers)."""

    def __init__(self, call_id):
        self.segments = Segments()
        self.items: list[dict] = []
        self.call_id = call_id
        self.logprobs: list = []             # tokens' logprobs not yet given to an output_text

    def feed(self, events: list, logprobs: list | None) -> list[dict]:
        self.logprobs += logprobs or []
        return [e for change in self.segments.feed(events) for e in self._announce(change, "completed")]

    def finish(self, status: str) -> list[dict]:
        """Closes the last item ('incomplete' when the response is); its events."""
        return [e for change in self.segments.close() for e in self._announce(change, status)]

    def _ref(self, i: int) -> dict:
        return {"item_id": self.items[i]["id"], "output_index": i}

    def _announce(self, change: tuple, status: str) -> list[dict]:
        what, i = change[0], change[1]
        kind = self.segments.segs[i]["kind"]
        if what == "open":
            return self._open(i, kind)
        if what == "close":
            return self._close(i, status)
        text, item = change[2], self.items[i]
        if kind == "call":
            item["arguments"] += text
            return [{"type": "response.function_call_arguments.delta", **self._ref(i), "delta": text}]
        item["content"][0]["text"] += text
        if kind == "reasoning":
            return [{"type": "response.reasoning_text.delta", **self._ref(i), "content_index": 0, "delta": text}]
        lps, self.logprobs = self.logprobs, []
        item["content"][0]["logprobs"] += lps
        return [{"type": "response.output_text.delta", **self._ref(i), "content_index": 0, "delta": text,
                 "logprobs": lps}]

    def _open(self, i: int, kind: str) -> list[dict]:
        if kind == "call":
            item = {"id": item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": self.call_id(),
                    "name": self.segments.segs[i]["name"], "arguments": ""}
            self.items.append(item)
            return [{"type": "response.output_item.added", "output_index": i, "item": copy.deepcopy(item)}]
        if kind == "content":
            item = {"id": item_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
        else:
            item = {"id": item_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}
        self.items.append(item)
        return [{"type": "response.output_item.added", "output_index": i, "item": dict(item, content=[])},
                {"type": "response.content_part.added", **self._ref(i), "content_index": 0,
                 "part": copy.deepcopy(item["content"][0])}]

    def _close(self, i: int, status: str) -> list[dict]:
        item = self.items[i]
        item["status"] = status
        ref = self._ref(i)
        if item["type"] == "function_call":
            out = [{"type": "response.function_call_arguments.done", **ref, "name": item["name"],
                    "arguments": item["arguments"]}]
        else:
            part = item["content"][0]
            if item["type"] == "message":
                part["logprobs"] += self.logprobs
                self.logprobs = []
                done = {"type": "response.output_text.done", "text": part["text"], "logprobs": part["logprobs"]}
            else:
                done = {"type": "response.reasoning_text.done", "text": part["text"]}
            out = [dict(done, **ref, content_index=0),
                   {"type": "response.content_part.done", **ref, "content_index": 0, "part": copy.deepcopy(part)}]
        return out + [{"type": "response.output_item.done", "output_index": i, "item": copy.deepcopy(item)}]


def handle_responses(state, body, gone):
    chat_body, origin, items, first = as_chat_body(Fields(body), state.responses)
    rid = item_id("resp")
    store = state.responses if body.get("store") is not False else None    # OpenAI's default: stored
    background = _background(state, body, store)
    if background is not None:
        gone = background.cancelled.is_set     # (its job is not the HTTP request's)
    truncation = body.get("truncation") or "disabled"
    req, origin = fitted(state, chat_body, origin, truncation == "auto")
    with renamed(origin) as names:
        job, forced, ids = start_chat_job(state, req, rid, gone, names.error)
    prompt_len = len(ids)
    text, reasoning = body.get("text") or {}, body.get("reasoning") or {}
    text_format = text.get("format") or {"type": "text"}
    base = {"id": rid, "object": "response", "created_at": int(time.time()), "completed_at": None,
            "status": "in_progress", "background": background is not None, "error": None, "incomplete_details": None,
            "model": req.model, "output": [],
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": reasoning.get("effort"),
                          "summary": reasoning.get("summary") or reasoning.get("generate_summary")},
            "store": store is not None,
            "temperature": req.params.temperature, "text": {"format": text_format, "verbosity": text.get("verbosity")},
            "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
            "top_p": 0.0 if body.get("top_p") == 0 else req.params.top_p, "truncation": truncation, "usage": None,
            **{k: body.get(k) for k in ECHOED}}
    output = OutputItems(req.style.call_id)
    kept = (store, items, first)
    if req.stream or background is not None:
        numbered = Numbered()
        events = _stream(state, job, req, forced, base, output, prompt_len, kept, numbered)
        failed = partial(_failed, base, output, numbered=numbered, kept=kept)
        if background is None:
            return SSEStream(events, job, sse_event, done=False, error=failed)
        return _in_background(state, background, SSEStream(events, job, lambda e: e, done=False, error=failed),
                              base, output, kept, req.stream)
    with job:
        last = None
        for u in chat_updates(state, req, job, forced):
            output.feed(u.events, u.logprobs)
            last = u
    output.finish(_status(last))
    return _final(state, base, output.items, last, prompt_len, kept)


def _background(state, body: dict, store):
    """The BackgroundResponse of a `background` request (None: an ordinary one). As OpenAI's API, it must
    be stored."""
    if not body.get("background"):
        return None
    if store is None:
        why = " and the server's response store (--responses-store N)" if state.responses is None else ""
        raise bad("background", f"Background mode requires store=true{why}")
    return BackgroundResponse()


def _in_background(state, background, events, base: dict, output: OutputItems, kept: tuple, stream: bool):
    """Runs a background response's events (an SSEStream of dicts) in its thread; the POST's answer: the
    response, queued, or the stream of its events (the client going away leaves it running)."""
    queued = dict(base, status="queued")
    _keep(kept, queued)
    state.background.add(base["id"], background)
    background.start(events, lambda: _keep(kept, dict(base, status="cancelled", output=copy.deepcopy(output.items))))
    return followed(background, base["id"]) if stream else queued


def _status(last) -> str:
    return "incomplete" if last is not None and last.finish_reason == "length" else "completed"


def _final(state, base: dict, output: list, last, prompt_len: int, kept: tuple) -> dict:
    """The whole response, stored (see _keep)."""
    status = _status(last)
    reasoning = "".join(it["content"][0]["text"] for it in output if it["type"] == "reasoning")
    n_reasoning = len(state.engine.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
    n_out = last.num_tokens if last else 0
    usage = {"input_tokens": prompt_len,
             # (no prompt-cache writes are billed here: the prefix cache fills itself)
             "input_tokens_details": {"cached_tokens": last.num_cached_tokens if last else 0, "cache_write_tokens": 0},
             "output_tokens": n_out, "output_tokens_details": {"reasoning_tokens": min(n_reasoning, n_out)},
             "total_tokens": prompt_len + n_out}
    final = dict(base, status=status, output=output, usage=usage,
                 completed_at=int(time.time()) if status == "completed" else None,
                 incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None)
    _keep(kept, final)
    return final


def _keep(kept: tuple, response: dict) -> None:
    """Stores (a copy of) the response; kept: (the store it goes to, or None; the conversation's input
    items; the index of the request's first)."""
    store, items, first = kept
    if store is not None:
        store.put(copy.deepcopy(response), items, first)


def _failed(base: dict, output: OutputItems, e, numbered, kept: tuple) -> list[dict]:
    """A stream's ending when generation fails: the error event (naming the field, as the request's 400
    would), then response.failed, the response with status 'failed' and the output so far, as OpenAI's
    streams end a failed response (its error code one of the API's: 'invalid_prompt' for a 400's). The
    failed response is stored, as OpenAI keeps it."""
    error = {"code": "server_error" if e.status >= 500 else "invalid_prompt", "message": e.message,
             "param": e.param, "type": e.type}
    failed = dict(base, status="failed", error=error, output=copy.deepcopy(output.items))
    _keep(kept, failed)
    return [numbered(e.response_event()), numbered({"type": "response.failed", "response": failed})]


class Numbered:
    """Gives a stream's events their sequence_number (its error event's too)."""

    def __init__(self):
        self.seq = itertools.count()

    def __call__(self, event: dict) -> dict:
        event["sequence_number"] = next(self.seq)
        return event


def _stream(state, job, req, forced, base: dict, items: OutputItems, prompt_len: int, kept: tuple, numbered):
    # (a background response is queued until its thread runs it)
    yield numbered({"type": "response.created", "response": dict(base, status="queued") if base["background"]
                    else base})
    yield numbered({"type": "response.in_progress", "response": base})
    if base["background"]:
        _keep(kept, base)
    last = None
    for u in chat_updates(state, req, job, forced):
        for e in items.feed(u.events, u.logprobs):
            yield numbered(e)
        last = u
    for e in items.finish(_status(last)):
        yield numbered(e)
    final = _final(state, base, copy.deepcopy(items.items), last, prompt_len, kept)
    yield numbered({"type": f"response.{final['status']}", "response": final})


def handle_input_tokens(state, body) -> dict:
    """POST /v1/responses/input_tokens: the tokens of the prompt the same /v1/responses request renders
    (the model may be left out: the served one)."""
    chat_body, origin, _, _ = as_chat_body(Fields(body), state.responses)
    chat_body.setdefault("model", state.config.served_model_names[0])
    req, origin = fitted(state, chat_body, origin, body.get("truncation") == "auto")
    with renamed(origin):
        return {"object": "response.input_tokens", "input_tokens": len(encode_prompt(state, req.text))}

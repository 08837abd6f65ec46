"""Tool calls out of generated text, incrementally (the same parser serves streams and whole texts).

Styles understood:
  Hermes / Qwen   text <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...
  Qwen3.5 / Qwen3-Coder   text <tool_call><function=NAME><parameter=K>V</parameter>...</function></tool_call>
                  (tools_xml.py)
  Llama-3 JSON    [<|python_tag|>]{"name": ..., "parameters": {...}} [; {...}]   (the whole reply)
  Mistral         text [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
                  text [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}   (tools_mistral.py)
  DeepSeek-V3     text <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}
                  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>, or V3's function<｜tool▁sep｜>name
                  ```json {...}``` (tools_deepseek.py)
and the forced form used for tool_choice "required"/named: the prompt already ends with
'<tool_call>\\n{"name": "<fn>", "arguments": ' (Mistral templates: '[TOOL_CALLS] [{"name": "<fn>",
"arguments": ' or '[TOOL_CALLS]<fn>[ARGS]'; DeepSeek's: '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><fn>
<｜tool▁sep｜>' or V3's fenced form) and the model writes only the arguments.

A parser turns text deltas into events: ("content", text), ("call", index, name), ("args", index, text).
A tool call is only reported for a function of the request (unknown names stay content);
arguments are the JSON text the model wrote (OpenAI: "may not be valid JSON; validate it").
"""
from __future__ import annotations

import json
import re

from .tools_deepseek import CALLS_BEGIN, after_calls_begin
from .tools_mistral import BOT, after_marker
from .tools_xml import parse_xml_call

OPEN, CLOSE, PYTHON_TAG = "<tool_call>", "</tool_call>", "<|python_tag|>"
HERMES_FORCED = (OPEN + '\n{"name": "', '", "arguments": ')
_DECODER = json.JSONDecoder()


def forced_prefill(name: str, form: tuple[str, str] = HERMES_FORCED) -> str:
    """Appended to the prompt when the server makes the model call `name` (a valid function name,
    which needs no JSON escaping); form: the text before and after the name."""
    return form[0] + name + form[1]


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


def cut_at_tags(buf: str, tags: tuple[str, ...]) -> tuple[str, str, str | None]:
    """(the text before the first tag, the text after it, that tag) when buf holds one of tags; else
    (the text that cannot be part of a tag, the possible start of one held back, None)."""
    hits = [(i, t) for t in tags if (i := buf.find(t)) >= 0]
    if hits:
        i, tag = min(hits)
        return buf[:i], buf[i + len(tag):], tag
    keep = max(_held_prefix(buf, t) for t in tags)
    return buf[: len(buf) - keep], buf[len(buf) - keep:], None


def cut_at_tag(buf: str, tag: str) -> tuple[str, str, bool]:
    before, after, found = cut_at_tags(buf, (tag,))
    return before, after, found is not None


def _call_from_json(obj, names: set[str]):
    """(name, arguments JSON text) of a tool-call object, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        return obj["name"], args
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _parse_json_calls(text: str, names: set[str]):
    """Llama-3 style: the whole text is one or more call objects separated by ';'."""
    s = text.strip()
    if s.startswith(PYTHON_TAG):
        s = s[len(PYTHON_TAG):].lstrip()
    calls, pos = [], 0
    while pos < len(s):
        try:
            obj, end = _DECODER.raw_decode(s, pos)
        except json.JSONDecodeError:
            return None
        call = _call_from_json(obj, names)
        if call is None:
            return None
        calls.append(call)
        pos = end
        while pos < len(s) and s[pos] in " \t\r\n;":
            pos += 1
    return calls or None


class ToolParser:
    """Auto mode: content streams through; <tool_call> blocks, Mistral and DeepSeek calls are held
    until complete. schemas: each function's parameters' JSON schema, which types the XML form's
    values (None: none known, every value is text)."""

    def __init__(self, tool_names, parallel: bool = True, schemas: dict[str, dict] | None = None):
        self.names = set(tool_names)
        self.schemas = {n: (schemas or {}).get(n) or {} for n in self.names}
        self.parallel = parallel
        self.buf = ""          # text not yet classified
        self.mode = "start"    # start | text | call | json | mistral (after [TOOL_CALLS]) | deepseek
        self.num_calls = 0
        self._ws = ""          # leading whitespace held until real content or the end
        self._final = False    # finish(): what more text would decide is decided now

    def _content(self, text: str, events: list) -> None:
        if not text:
            return
        if self._ws is not None:
            if not text.strip():
                self._ws += text
                return
            text, self._ws = self._ws + text, None
        events.append(("content", text))

    @property
    def done(self) -> bool:
        """parallel_tool_calls false and the one call made: the reply ends there (nothing after it
        is looked at)."""
        return not self.parallel and self.num_calls > 0

    def _call(self, name: str, args: str, events: list) -> None:
        if self.done:
            return
        events += [("call", self.num_calls, name), ("args", self.num_calls, args)]
        self.num_calls += 1

    def feed(self, delta: str) -> list:
        events: list = []
        self.buf += delta
        while True:
            if self.done:
                self.buf = ""
                return events
            if self.mode == "start":  # decide between text and a Llama-3 style JSON reply
                s = self.buf.lstrip()
                if not s:
                    return events
                if s.startswith("{") or s.startswith(PYTHON_TAG):
                    self.mode = "json"
                elif PYTHON_TAG.startswith(s) or OPEN.startswith(s):
                    return events  # might still become a tag
                else:
                    self.mode = "text"
            if self.mode == "json":
                return events  # decided at the end
            if self.mode == "text":
                before, self.buf, tag = cut_at_tags(self.buf, (OPEN, BOT, CALLS_BEGIN))
                self._content(before, events)
                if tag is None:
                    return events
                self.mode = {OPEN: "call", BOT: "mistral", CALLS_BEGIN: "deepseek"}[tag]
            if self.mode in ("mistral", "deepseek"):
                marker, after = (BOT, after_marker) if self.mode == "mistral" else (CALLS_BEGIN, after_calls_begin)
                got = after(self.buf, self._final)
                if got is None:
                    return events
                items, used = got
                calls = [_call_from_json(o, self.names) for o in items]
                if calls and None not in calls:
                    for c in calls:
                        self._call(*c, events)
                    self.buf = self.buf[used:]
                else:  # no call of the request's functions: the marker is content, and the rest is text
                    self._content(marker, events)
                self.mode = "text"
                continue
            if self.mode == "call":
                j = self.buf.find(CLOSE)
                if j < 0:
                    return events
                self._block(self.buf[:j], True, events)
                self.buf, self.mode = self.buf[j + len(CLOSE):], "text"

    def _block(self, inner: str, closed: bool, events: list) -> None:
        call = None
        try:
            obj, end = _DECODER.raw_decode(inner.strip())
            if not inner.strip()[end:].strip():
                call = _call_from_json(obj, self.names)
        except json.JSONDecodeError:
            call = parse_xml_call(inner, self.schemas)
        if call is not None:
            self._call(*call, events)
        else:
            self._content(OPEN + inner + (CLOSE if closed else ""), events)

    def finish(self) -> list:
        if self.done:
            return []
        self._final = True
        events = self.feed("")
        buf, self.buf = self.buf, ""
        if self.mode == "json":
            calls = _parse_json_calls(buf, self.names)
            if calls:
                for c in calls:
                    self._call(*c, events)
            else:
                self._content(buf, events)
        elif self.mode == "call":
            self._block(buf, False, events)
        else:
            self._content(buf, events)
        if self._ws and not self.num_calls:
            events.append(("content", self._ws))
        self._ws = None
        return events


class ForcedCallParser:
    """The prompt ends inside a call to `name`: everything generated is its arguments, streamed as
    they come; a complete JSON object ends them (the rest, e.g. '}' and </tool_call>, is dropped)."""

    def __init__(self, name: str):
        self.name = name
        self.buf, self.sent, self.done, self.started = "", 0, False, False

    def feed(self, delta: str) -> list:
        events: list = []
        if not self.started:
            self.started = True
            events.append(("call", 0, self.name))
        if self.done:
            return events
        self.buf += delta
        s = self.buf.lstrip()
        offset = len(self.buf) - len(s)
        end = len(self.buf)
        if s.startswith("{"):
            try:
                _, e = _DECODER.raw_decode(s)
                end, self.done = offset + e, True
            except json.JSONDecodeError:
                pass
        if end > offset + self.sent:
            events.append(("args", 0, self.buf[offset + self.sent: end]))
            self.sent = end - offset
        return events

    def finish(self) -> list:
        return self.feed("")


def collect(parser, text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """Whole-text parse: (content or None, [(name, arguments)])."""
    content, calls = [], []
    for ev in parser.feed(text) + parser.finish():
        if ev[0] == "content":
            content.append(ev[1])
        elif ev[0] == "call":
            calls.append([ev[2], ""])
        else:
            calls[ev[1]][1] += ev[2]
    text_out = "".join(content)
    if calls and not text_out.strip():
        text_out = None
    return text_out, [tuple(c) for c in calls]


_NAME_RE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")


def valid_function_name(name) -> bool:
    return isinstance(name, str) and bool(_NAME_RE.match(name))

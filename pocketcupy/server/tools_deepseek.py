"""DeepSeek-V3's tool calls: the block its templates write after the reply's text, and the prefill
of a forced call in that form.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>CALL<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

where CALL is, by the template's version,
  V3.1 / V3.2   name<｜tool▁sep｜>{...}
  V3 / R1       function<｜tool▁sep｜>name\\n```json\\n{...}\\n```
The markers are special tokens of DeepSeek's vocabulary, which skip_special_tokens drops: the server
keeps them in the text of requests with tools (SamplingParams.preserved_token_ids).
"""
from __future__ import annotations

import json
import re

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
_V3_CALL = re.compile(r"\s*function\s*" + re.escape(SEP) + r"\s*(\S+?)\s*```(?:json)?\s*(.*?)\s*```\s*", re.S)


def writes_deepseek_calls(template: str | None) -> bool:
    return bool(template) and CALL_BEGIN in template


def forced_form(template: str) -> tuple[str, str]:
    """(text before, text after) the function's name when the server makes the model call it, in
    the template's form; the model writes the arguments after it."""
    if "```json" in template:   # V3 / R1
        return CALLS_BEGIN + CALL_BEGIN + "function" + SEP, "\n```json\n"
    return CALLS_BEGIN + CALL_BEGIN, SEP


def _call(text: str) -> dict | None:
    """{"name", "arguments"} of one call's text (between its begin and end markers), or None."""
    m = _V3_CALL.fullmatch(text)
    if m is not None:
        name, args = m.group(1), m.group(2)
    else:
        name, sep, args = text.partition(SEP)
        if not sep:
            return None
        name, args = name.strip(), args.strip()
    try:
        ok = isinstance(json.loads(args), dict)
    except json.JSONDecodeError:
        ok = False
    return {"name": name, "arguments": args} if ok else None


def after_calls_begin(buf: str, final: bool):
    """What the text after a <｜tool▁calls▁begin｜> marker holds (tools_mistral.after_marker's
    contract). None: not decided yet (never when final); else (items, used): the calls, {"name",
    "arguments"} to be checked by the caller, and the length of buf they took (through the block's
    end marker); items == [] when the text is no well-formed block of calls."""
    end = buf.find(CALLS_END)
    if end < 0 and not final:
        return None
    body = buf if end < 0 else buf[:end]
    pieces = body.split(CALL_BEGIN)
    if pieces[0].strip() or len(pieces) < 2:
        return [], 0
    items = []
    for piece in pieces[1:]:
        text, closed, rest = piece.partition(CALL_END)
        call = _call(text) if closed and not rest.strip() else None
        if call is None:
            return [], 0
        items.append(call)
    return items, (len(buf) if end < 0 else end + len(CALLS_END))

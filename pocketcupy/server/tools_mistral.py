"""Mistral's tool calls: the text after the [TOOL_CALLS] marker, the 9-character ids Mistral
templates insist on, and the prefill of a forced call in Mistral's form.

Forms (what follows [TOOL_CALLS], after optional whitespace):
  v3 / v7 tokenizers (Mistral-7B-Instruct-v0.3, Nemo, Small 2409/2501)
      [{"name": "f", "arguments": {...}}, ...]          (Nemo adds "id": "<9 chars>" to each object)
  v11+ tokenizers (Mistral-Small-3.2, Magistral, Devstral)
      f[ARGS]{...}   or   f[CALL_ID]<id>[ARGS]{...}    (one call per marker; several markers in a row)
The v11 form's [ARGS] may be missing (`f{...}`) where a detokenizer dropped it as a special token.

[TOOL_CALLS], [ARGS] and [CALL_ID] are control tokens, which skip_special_tokens drops: the server
keeps them in the text of requests with tools (SamplingParams.preserved_token_ids).
"""
from __future__ import annotations

import json
import re
import secrets
import string

BOT, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
MARKERS = (BOT, ARGS, CALL_ID)
_DECODER = json.JSONDecoder()
_NAME = re.compile(r"[A-Za-z0-9_\-]*")
_ID = re.compile(r"[A-Za-z0-9]*")
# a template's check of Mistral's ids: `tool_call.id|length != 9`, `... < 9`, or its error message
_ID_CHECK = re.compile(r"length\s*(?:!=|<)\s*9\b|alphanumeric strings with length")
_ALNUM = string.ascii_letters + string.digits


def writes_mistral_calls(template: str | None) -> bool:
    """The chat template writes tool calls after [TOOL_CALLS] or checks Mistral's 9-character ids."""
    return bool(template) and (BOT in template or _ID_CHECK.search(template) is not None)


def call_id() -> str:
    """A tool-call id Mistral templates accept: 9 random alphanumeric characters (as vLLM's)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def forced_form(template: str) -> tuple[str, str]:
    """(text before, text after) the function's name when the server makes the model call it, in
    the form the template writes calls in; the model writes the arguments after it."""
    if ARGS in template:
        return BOT, ARGS
    return BOT + (" [" if BOT + " [" in template else "[") + '{"name": "', '", "arguments": '


def _skip_ws(s: str, pos: int) -> int:
    while pos < len(s) and s[pos].isspace():
        pos += 1
    return pos


def _json_at(s: str, pos: int):
    """(value, end) of the JSON value at s[pos:], or None while it is incomplete (or malformed)."""
    try:
        return _DECODER.raw_decode(s, pos)
    except json.JSONDecodeError:
        return None


def after_marker(buf: str, final: bool):
    """What the text after a [TOOL_CALLS] marker holds. None: not decided yet (more text may decide;
    never when final); else (items, used): the call objects, {"name", "arguments"} (a list
    form's items as the model wrote them, to be checked by the caller), and the length of buf they
    took; items == [] when the text is no tool call."""
    pos = _skip_ws(buf, 0)
    if pos == len(buf):
        return None if not final else ([], 0)
    if buf[pos] in "[{":                                    # v3 / v7: a JSON array (or one object)
        got = _json_at(buf, pos)
        if got is None:
            return None if not final else ([], 0)
        obj, end = got
        return (obj if isinstance(obj, list) else [obj]), end
    name_end = _NAME.match(buf, pos).end()                 # v11: name [CALL_ID]id [ARGS] {...}
    if name_end == pos:
        return [], 0
    at = name_end
    if buf.startswith(CALL_ID, at):
        at = _ID.match(buf, at + len(CALL_ID)).end()
    rest = buf[at:]
    if buf.startswith(ARGS, at):
        at += len(ARGS)
    elif not rest.startswith("{"):
        undecided = not rest or ARGS.startswith(rest) or (at == name_end and CALL_ID.startswith(rest))
        return None if undecided and not final else ([], 0)
    at = _skip_ws(buf, at)
    got = _json_at(buf, at) if at < len(buf) else None
    if got is None:
        return None if not final else ([], 0)
    args, end = got
    if not isinstance(args, dict):
        return [], 0
    return [{"name": buf[pos:name_end], "arguments": buf[at:end]}], end

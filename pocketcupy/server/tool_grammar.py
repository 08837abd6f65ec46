"""The grammar of the tool calls that follow a call marker, for strict functions under tool_choice
"auto" (tool_prompt.strict_calls): each call names a function of the request, and its arguments
follow that function's schema. One grammar a call style, written as the style's templates write
calls (llguidance's Lark, JSON through %json with Python's separators). A marker that is a special
token of the tokenizer (Mistral's [ARGS], DeepSeek's <｜tool▁sep｜>) is matched as that token
(llguidance's <[id]>); one that is plain text (any marker in SmolLM2's vocabulary) as its text.
"""
from __future__ import annotations

import json

from ..structured.grammar import JSON_COMPACT
from .tools_deepseek import CALL_BEGIN, CALL_END, CALLS_END, SEP
from .tools_mistral import ARGS, CALL_ID

_WS = "/[ \\t\\r\\n]*/"


def _json(schema: dict) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_COMPACT})


def _marker(tokenizer, text: str) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and ids[0] in tokenizer.special_token_ids:
        return f"<[{ids[0]}]>"
    return json.dumps(text, ensure_ascii=False)


def _call_objects(arguments: dict[str, dict], extra: dict | None = None) -> list[dict]:
    """{"name": <the function>, "arguments": <its schema>} (and `extra`'s optional fields) for each function."""
    return [{"type": "object", "properties": {"name": {"const": name}, "arguments": args, **(extra or {})},
             "required": ["name", "arguments"], "additionalProperties": False} for name, args in arguments.items()]


def hermes(arguments: dict[str, dict]) -> str:
    """After <tool_call>: one JSON object {"name", "arguments"}."""
    return f"start: {_WS} {_json({'anyOf': _call_objects(arguments)})}"


def mistral_list(arguments: dict[str, dict], parallel: bool) -> str:
    """After [TOOL_CALLS] (v3 / v7 tokenizers): a space (v3's) or none (Nemo's), and a JSON array of
    call objects (Nemo's carry an "id"); one object where calls are not parallel."""
    item = {"anyOf": _call_objects(arguments, {"id": {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}})}
    array = {"type": "array", "items": item, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    return f"start: \" \"? {_json(array)}"


def _alternatives(arguments: dict[str, dict], call) -> tuple[str, str]:
    """(the choice between rules call_0 .. call_n, those rules): one a function, its body
    call(name literal, arguments grammar)."""
    rules = [f"call_{i}: {call(json.dumps(name), _json(args))}" for i, (name, args) in enumerate(arguments.items())]
    return " | ".join(f"call_{i}" for i in range(len(rules))), "\n".join(rules)


def mistral_v11(tokenizer, arguments: dict[str, dict], call_id: bool) -> str:
    """After [TOOL_CALLS] (v11+ tokenizers): name[ARGS]{...}, or name[CALL_ID]<id>[ARGS]{...} where the
    template writes ids; one call a marker."""
    cid = f'({_marker(tokenizer, CALL_ID)} /[A-Za-z0-9]{{9}}/)? ' if call_id else ""
    choice, rules = _alternatives(arguments, lambda name, args: f"{name} {cid}{_marker(tokenizer, ARGS)} {args}")
    return f"start: {choice}\n{rules}"


def deepseek(tokenizer, arguments: dict[str, dict], fenced: bool, parallel: bool) -> str:
    """After <｜tool▁calls▁begin｜>: <｜tool▁call▁begin｜>CALL<｜tool▁call▁end｜> (several where calls
    are parallel), then <｜tool▁calls▁end｜>; CALL is name<｜tool▁sep｜>{...} (V3.1), or V3's
    function<｜tool▁sep｜>name\\n```json\\n{...}\\n``` (fenced)."""
    sep = _marker(tokenizer, SEP)
    if fenced:
        body = lambda name, args: f'"function" {sep} {name} "\\n```json\\n" {args} "\\n```"'  # noqa: E731
    else:
        body = lambda name, args: f"{name} {sep} {args}"  # noqa: E731
    choice, rules = _alternatives(arguments, body)
    return (f"start: call{'+' if parallel else ''} {_marker(tokenizer, CALLS_END)}\n"
            f"call: {_marker(tokenizer, CALL_BEGIN)} ({choice}) {_marker(tokenizer, CALL_END)}\n{rules}")

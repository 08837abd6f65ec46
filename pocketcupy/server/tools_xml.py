"""Qwen3-Coder's and Qwen3.5's tool calls: XML inside the <tool_call> block,

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

Each value is text, typed by the function's JSON schema as vLLM's qwen3_coder parser types it:
strings stay as written (less the newline after the tag and before its end); integers, numbers
and booleans are converted; objects and arrays are parsed as JSON; "null" is null; a value that
does not convert is kept as text, as is a parameter the schema does not list. NaN and the
infinities are no JSON, so a value that would be one stays text too.
"""
from __future__ import annotations

import json
import math
import re

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def parse_xml_call(inner: str, schemas: dict[str, dict]) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a <tool_call> block's text in the XML form, for a function
    of schemas (name -> its parameters' JSON schema); None if it is not one."""
    m = _FUNCTION.fullmatch(inner)
    if m is None or m.group(1).strip() not in schemas:
        return None
    name, body = m.group(1).strip(), m.group(2)
    props = (schemas[name] or {}).get("properties") or {}
    args, pos = {}, 0
    for p in _PARAMETER.finditer(body):
        if body[pos:p.start()].strip():
            return None
        key, value = p.group(1).strip(), p.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        args[key] = _typed(value, props[key]) if key in props else value
        pos = p.end()
    if body[pos:].strip():
        return None
    return name, json.dumps(args, ensure_ascii=False)


def _typed(text: str, schema) -> object:
    kinds = schema.get("type") if isinstance(schema, dict) else None
    kinds = kinds if isinstance(kinds, list) else [kinds]
    s = text.strip()
    if s.lower() == "null":
        return None
    if "string" in kinds:
        return text
    for kind in kinds:
        try:
            if kind == "integer":
                return int(s)
            if kind == "number":
                return int(s) if re.fullmatch(r"[-+]?\d+", s) else _finite(float(s))
            if kind == "boolean" and s.lower() in ("true", "false"):
                return s.lower() == "true"
            if kind in ("object", "array", None):
                return json.loads(s, parse_constant=_not_json, parse_float=lambda f: _finite(float(f)))
        except ValueError:   # (json.JSONDecodeError is one)
            continue
    return text


def _finite(v: float) -> float:
    if not math.isfinite(v):   # (1e999 too)
        raise ValueError(v)
    return v


def _not_json(name: str):
    raise ValueError(name)

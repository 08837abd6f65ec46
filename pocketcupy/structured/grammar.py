"""A constraint (JSON schema, regex, choice, Lark/GBNF grammar) -> llguidance grammar text, checked.

The text is what `llguidance.LLMatcher` compiles against a tokenizer; it is checked here without a
tokenizer, so a bad schema, regex or grammar fails when the request's parameters are built."""
from __future__ import annotations

import json
import re
from functools import lru_cache

# JSON is written with Python's separators and no other whitespace: a model left free to add
# whitespace (llguidance's default) can spend its whole budget on newlines.
JSON_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SCHEMA_DATA = frozenset({"const", "enum", "default", "examples"})  # values, not schemas: no patterns inside
_BOUNDS = {"minimum": 1, "exclusiveMinimum": 1, "maximum": -1, "exclusiveMaximum": -1}  # lower: +1, upper: -1
_EXACT = 2 ** 53  # integers up to this are exact as 64-bit floats


def build_grammar(kind: str, text: str, whitespace_flexible: bool = False) -> str:
    """kind: json (schema as JSON text), regex, choice (JSON list of strings), grammar (Lark or GBNF).
    Raises ValueError('structured_outputs.<kind>: ...') when the constraint is invalid."""
    grammar, error = _build(kind, text, whitespace_flexible)
    if error:
        raise ValueError(f"structured_outputs.{kind}: {error}")
    return grammar


@lru_cache(maxsize=512)
def _build(kind: str, text: str, whitespace_flexible: bool) -> tuple[str, str]:
    """(grammar, error message or '')."""
    import llguidance

    LLMatcher = llguidance.LLMatcher
    try:
        _check_unsupported(kind, text)
        if kind == "json":
            grammar = LLMatcher.grammar_from_json_schema(
                text, defaults={"whitespace_flexible": True} if whitespace_flexible else JSON_COMPACT)
        elif kind == "regex":  # \d means [0-9] (the Rust regex crate would take any Unicode digit)
            grammar = LLMatcher.grammar_from_lark("start: /" + llguidance.regex_to_lark(text, "d") + "/")
        elif kind == "choice":
            grammar = LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(text)))
        elif kind == "grammar":  # GBNF is converted to Lark first
            grammar = llguidance.grammar_from("grammar", _gbnf_unicode_escapes(text) if "::=" in text else text)
        else:
            raise AssertionError(kind)
    except ValueError as e:
        return "", str(e)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return grammar, (messages[0].strip() if is_error else "")


_UNICODE_ESCAPE = re.compile(r"\\(\\|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def _gbnf_unicode_escapes(text: str) -> str:
    """GBNF's \\uXXXX and \\UXXXXXXXX escapes as llguidance's GBNF converter takes them: it wrote
    [\\u0041-\\u005A] as the invalid regex [\\u41-\\u5A] and failed on "\\u0041" (a 400 for a valid
    grammar). ASCII becomes \\xHH, the rest the character itself; an escaped backslash stays."""
    def one(m: re.Match) -> str:
        esc = m.group(1)
        if esc == "\\":
            return m.group(0)
        cp = int(esc[1:], 16)
        if cp < 0x80:
            return f"\\x{cp:02X}"
        return chr(cp) if cp <= 0x10FFFF and not 0xD800 <= cp < 0xE000 else m.group(0)
    return _UNICODE_ESCAPE.sub(one, text)


def _check_unsupported(kind: str, text: str) -> None:
    """llguidance drops a trailing unescaped backslash (regex 'a\\' constrained the output to 'a'):
    raise ValueError for one in a regex or in a JSON schema's patterns. Also refuses a schema's
    bounds that llguidance cannot honor (_check_bounds)."""
    if kind == "regex":
        regexes = [text]
    elif kind == "json":
        regexes, stack = [], [json.loads(text)]
        while stack:  # (no recursion: a schema may nest deeper than Python's stack)
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            elif isinstance(node, dict):
                _check_bounds(node)
                for k, v in node.items():
                    if k == "pattern" and isinstance(v, str):
                        regexes.append(v)
                    elif k == "patternProperties" and isinstance(v, dict):
                        regexes.extend(v)
                    if k not in _SCHEMA_DATA:
                        stack.append(v)
    else:
        return
    for r in regexes:
        if (len(r) - len(r.rstrip("\\"))) % 2:
            raise ValueError(f"invalid regex {r!r}: it ends with an unescaped backslash")


def _check_bounds(node: dict) -> None:
    """llguidance reads bounds as 64-bit floats and clamps integer ranges to 64-bit integers: a lower
    bound over 2^53 (or an upper one under -2^53) could let it write a number outside the range
    ({"type": "integer", "minimum": 1e308, "maximum": 1e308} gave 9223372036854775807, finish_reason
    "stop"). Upper bounds that high (an int64's maximum) only narrow the range, and stay allowed."""
    for k, sign in _BOUNDS.items():
        v = node.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v * sign > _EXACT:
            raise ValueError(f"'{k}': {v!r} is not supported: bounds beyond ±2^53 (9007199254740992) "
                             "cannot be honored exactly")

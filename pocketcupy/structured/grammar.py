"""A constraint (JSON schema, regex, choice, Lark/GBNF grammar) -> llguidance grammar text, checked.

The text is what `llguidance.LLMatcher` compiles against a tokenizer; it is checked here without a
tokenizer, so a bad schema, regex or grammar fails when the request's parameters are built."""
from __future__ import annotations

import json
from functools import lru_cache

# JSON is written with Python's separators and no other whitespace: a model left free to add
# whitespace (llguidance's default) can spend its whole budget on newlines.
JSON_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


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
        if kind == "json":
            grammar = LLMatcher.grammar_from_json_schema(
                text, defaults={"whitespace_flexible": True} if whitespace_flexible else JSON_COMPACT)
        elif kind == "regex":  # \d means [0-9] (the Rust regex crate would take any Unicode digit)
            grammar = LLMatcher.grammar_from_lark("start: /" + llguidance.regex_to_lark(text, "d") + "/")
        elif kind == "choice":
            grammar = LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(text)))
        elif kind == "grammar":
            grammar = llguidance.grammar_from("grammar", text)  # GBNF is converted to Lark first
        else:
            raise AssertionError(kind)
    except ValueError as e:
        return "", str(e)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return grammar, (messages[0].strip() if is_error else "")

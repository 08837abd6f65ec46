"""StructuredOutputsParams: the structure a request's output must have (vLLM's names)."""
from __future__ import annotations

import json as _json
from dataclasses import dataclass, field

from .grammar import build_grammar

KINDS = ("json", "regex", "choice", "grammar")


@dataclass
class StructuredOutputsParams:
    """Exactly one of: `json` (a JSON schema as a dict or JSON text, or True for any JSON object),
    `regex` (the whole output matches it), `choice` (the output is one of these strings),
    `grammar` (Lark, in llguidance's dialect, or GBNF text). `whitespace_flexible` lets JSON have
    any whitespace between tokens (default: none but ', ' and ': '). `start_after` (token ids, e.g. a
    reasoning end marker's) delays the constraint: the output is free until it holds these ids in a row,
    and the constraint applies from the next token on (the structure is what follows them); with `repeat`,
    each complete structure makes the output free again until the trigger's next time (a tool call's
    arguments after each call marker)."""

    json: dict | str | bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    whitespace_flexible: bool = False
    start_after: list[int] | None = None
    repeat: bool = False
    kind: str = field(init=False, repr=False, compare=False)
    ll_grammar: str = field(init=False, repr=False, compare=False)  # llguidance grammar text

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"structured_outputs: exactly one of {', '.join(KINDS)} must be given, "
                             f"got {', '.join(given) or 'none'}")
        if not isinstance(self.whitespace_flexible, bool):
            raise ValueError("structured_outputs.whitespace_flexible: must be a bool, got "
                             f"{self.whitespace_flexible!r}")
        self.start_after = _trigger_ids(self.start_after)
        if not isinstance(self.repeat, bool) or (self.repeat and not self.start_after):
            raise ValueError(f"structured_outputs.repeat: must be a bool, and true only with start_after, got "
                             f"{self.repeat!r}")
        self.kind = kind = given[0]
        self.ll_grammar = build_grammar(kind, self._text(kind), self.whitespace_flexible)

    def _text(self, kind: str) -> str:
        v = getattr(self, kind)
        name = f"structured_outputs.{kind}"
        if kind == "json":
            return _schema_text(v, name)
        if kind == "choice":
            if not isinstance(v, (list, tuple)) or not v:
                raise ValueError(f"{name}: must be a non-empty list of strings, got {v!r}")
            if any(not isinstance(c, str) or not c for c in v):
                raise ValueError(f"{name}: entries must be non-empty strings, got {v!r}")
            self.choice = list(v)
            return _json.dumps(self.choice)
        if not isinstance(v, str) or not v:
            raise ValueError(f"{name}: must be a non-empty string, got {v!r}")
        return v


def _trigger_ids(ids) -> list[int] | None:
    """start_after as a list of token ids (None or [] -> None: no delay)."""
    if ids is None:
        return None
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                     for i in ids):
        raise ValueError(f"structured_outputs.start_after: must be a list of token ids (ints >= 0), got {ids!r:.60}")
    return [int(i) for i in ids] or None


def _schema_text(v, name: str) -> str:
    if v is True:
        return '{"type": "object"}'
    if isinstance(v, str):
        try:
            v = _json.loads(v)
        except ValueError as e:
            raise ValueError(f"{name}: not valid JSON: {e}") from None
    if not isinstance(v, dict):
        raise ValueError(f"{name}: must be a JSON schema object (or True for any JSON object), got {v!r:.60}")
    try:
        return _json.dumps(v)  # property order kept: it is the order the model writes them in
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: the schema is not JSON-serializable: {e}") from None


def as_structured_outputs(value) -> StructuredOutputsParams | None:
    """SamplingParams.structured_outputs: None, a StructuredOutputsParams or a dict of its fields."""
    if value is None or isinstance(value, StructuredOutputsParams):
        return value
    if isinstance(value, dict):
        unknown = set(value) - {"json", "regex", "choice", "grammar", "whitespace_flexible", "start_after",
                                 "repeat"}
        if unknown:
            raise ValueError(f"structured_outputs: unknown field(s) {', '.join(sorted(unknown))}")
        return StructuredOutputsParams(**value)
    raise ValueError(f"structured_outputs: must be a StructuredOutputsParams, a dict or None, got "
                     f"{type(value).__name__}")

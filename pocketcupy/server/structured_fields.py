"""Structured-output request fields -> StructuredOutputsParams: OpenAI's `response_format`
(json_object, json_schema) and vLLM's extensions `guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar` and `structured_outputs`. At most one of them; a bad one is a 400 naming it."""
from __future__ import annotations

import re

from ..structured import StructuredOutputsParams, as_structured_outputs
from ..structured.params import KINDS
from .protocol import Fields, bad, from_value_error

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ENGINE_FIELD = re.compile(r"\bstructured_outputs\b(?!\.\w)")   # (not its own fields: structured_outputs.json)


def _response_format(f: Fields):
    """-> (StructuredOutputsParams kwargs, field to blame) or None for text."""
    rf = f.obj("response_format")
    if rf is None:
        return None
    r = Fields(rf, "response_format")
    r.require("type")
    kind = r.str("type")
    spec = None
    if kind == "json_object":
        spec = ({"json": True}, "response_format")
    elif kind == "json_schema":
        r.require("json_schema")
        j = Fields(r.obj("json_schema"), "response_format.json_schema")
        j.require("name")
        name = j.str("name")
        if not SCHEMA_NAME.fullmatch(name):
            raise bad("response_format.json_schema.name", "'response_format.json_schema.name' must be 1-64 "
                                                          f"letters, digits, '_' or '-', got {name!r}")
        j.str("description")
        j.bool("strict")
        schema = j.obj("schema")
        j.reject_unknown()
        spec = ({"json": True if schema is None else schema}, "response_format.json_schema.schema")
    elif kind != "text":
        raise bad("response_format.type", "'response_format.type' must be one of 'text', 'json_object', "
                                          f"'json_schema', got {kind!r}")
    r.reject_unknown()
    return spec


def engine_renames(param: str | None) -> dict:
    """Job's param_names for a constraint given in `param`: the engine's errors when it compiles the
    constraint against the tokenizer ('structured_outputs.json: ...') name that field instead."""
    return {} if param is None else {"structured_outputs": param,
                                     **{f"structured_outputs.{kind}": param for kind in KINDS}}


def engine_mentions(param: str | None) -> list:
    """Job's mentions for a constraint given in `param`: the engine's errors that mention it within the
    message ('bad_words: with structured_outputs, ...') name that field instead."""
    return [] if param is None else [(ENGINE_FIELD, param)]


def parse_structured_field(f: Fields) -> tuple[StructuredOutputsParams | None, str | None]:
    """(the constraint, the request field it came from), or (None, None)."""
    specs = []
    rf = _response_format(f)
    if rf is not None:
        specs.append(rf)
    for name, kind in GUIDED.items():
        if f.get(name) is not None:
            specs.append(({kind: f.get(name)}, name))
    if f.get("structured_outputs") is not None:
        specs.append((f.get("structured_outputs"), "structured_outputs"))
    if len(specs) > 1:
        raise bad(specs[1][1], "give only one of response_format (json_object, json_schema), structured_outputs, "
                               + ", ".join(GUIDED))
    if not specs:
        return None, None
    spec, param = specs[0]
    try:
        return as_structured_outputs(spec), param
    except ValueError as e:   # 'structured_outputs.json: ...' -> the field the client sent
        raise from_value_error(e, param, engine_renames(param), engine_mentions(param)) from None

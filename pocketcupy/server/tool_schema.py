"""The checks a function's `parameters` JSON schema gets whatever `tool_choice` is, as OpenAI's API
checks every function's schema: only what makes a schema invalid JSON Schema (a `type` that is no
JSON type, `properties` that are not an object of schemas, `required` that is not a list of names).
A forced call's schema is also compiled by the structured-output engine (tool_prompt.forced_call_arguments),
which refuses more: features it cannot enforce, which a call the model makes by itself needs not."""
from __future__ import annotations

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMAS = ("additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
           "additionalItems", "unevaluatedProperties", "unevaluatedItems")


def schema_problem(schema, where: str = "") -> str | None:
    """What makes `schema` (a subschema at JSON path `where`) invalid, or None."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{where or 'the schema'} must be an object or a boolean"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is not None and (not kinds or any(k not in TYPES for k in kinds)):
        return f"{where}.type {kind!r:.40} is not one of {', '.join(TYPES)}"
    required = schema.get("required")
    if required is not None and (not isinstance(required, list) or not all(isinstance(r, str) for r in required)):
        return f"{where}.required must be an array of property names"
    subs = []
    for k, v in schema.items():
        if k in SCHEMAS or (k == "items" and not isinstance(v, list)):
            subs.append((f"{where}.{k}", v))
        elif k in SCHEMA_MAPS:
            if not isinstance(v, dict):
                return f"{where}.{k} must be an object of schemas"
            subs += [(f"{where}.{k}.{name}", sub) for name, sub in v.items()]
        elif k in SCHEMA_LISTS or k == "items":
            if not isinstance(v, list):
                return f"{where}.{k} must be an array of schemas"
            subs += [(f"{where}.{k}[{j}]", sub) for j, sub in enumerate(v)]
    for path, sub in subs:
        problem = schema_problem(sub, path)
        if problem:
            return problem
    return None

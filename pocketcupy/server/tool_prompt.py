"""`tools`, `tool_choice` and chat `messages`: validation, what the chat template is given, and
what the server must know of how the template writes tool calls (ToolStyle).

A template that knows about tools (its source mentions them) gets OpenAI's shapes, with
tool-call arguments decoded to objects as Hugging Face templates expect. For a template that
does not (SmolLM2's), the server renders the Hermes convention itself, as other servers do: a
system message listing the functions as JSON and asking for <tool_call>{...}</tool_call>,
assistant tool calls written as such blocks, and tool results as <tool_response> user turns.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..chat_template import validate_messages
from ..structured import StructuredOutputsParams
from .protocol import bad, short_repr
from .responses import new_id
from .tool_schema import schema_problem
from .tools import CLOSE, HERMES_FORCED, OPEN, valid_function_name
from . import tool_grammar, tools_deepseek
from .tools_deepseek import CALLS_BEGIN
from .tools_mistral import ARGS, BOT, CALL_ID, MARKERS, forced_form, writes_mistral_calls
from .tools_mistral import call_id as mistral_call_id

ROLES = ("system", "developer", "user", "assistant", "tool")

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


def parse_tools(raw) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise bad("tools", "'tools' must be a non-empty array of tool objects")
    names = set()
    for i, t in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise bad(where, f"'{where}' must be {{'type': 'function', 'function': {{...}}}}")
        fn = t["function"]
        if not valid_function_name(fn.get("name")):
            raise bad(f"{where}.function.name", "function names must match ^[A-Za-z0-9_-]{1,64}$")
        if fn["name"] in names:
            raise bad(f"{where}.function.name", f"duplicate function name {fn['name']!r}")
        names.add(fn["name"])
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad(f"{where}.function.description", "'description' must be a string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise bad(f"{where}.function.parameters", "'parameters' must be a JSON schema object")
        if (fn.get("parameters") or {}).get("type", "object") != "object":   # arguments are an object
            raise bad(f"{where}.function.parameters", "'parameters' must be a JSON schema of type 'object', got "
                                                      f"type {short_repr(fn['parameters']['type'])}")
        problem = schema_problem(fn.get("parameters") or {}, "parameters")
        if problem:
            raise bad(f"{where}.function.parameters", f"Invalid schema for function {fn['name']!r}: {problem}")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad(f"{where}.function.strict", "'strict' must be a boolean")
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise bad(f"{where}.function.{sorted(unknown)[0]}", "unrecognized function field")
    return raw


def _arguments_schema(fn: dict) -> dict:
    """A function's parameters as the schema of its arguments, an object: a schema that names no type
    (which would allow any JSON value) gets it; no parameters: {}."""
    if fn.get("parameters"):
        return {"type": "object", **fn["parameters"]}
    return {"type": "object", "properties": {}, "additionalProperties": False}


def _checked(i: int, schema: dict, what: str) -> StructuredOutputsParams:
    """The arguments' constraint of tools[i]; a schema the structured-output engine refuses is a 400
    naming it."""
    try:
        return StructuredOutputsParams(json=schema)
    except ValueError as e:
        msg = str(e).removeprefix("structured_outputs.json: ")
        raise bad(f"tools[{i}].function.parameters", f"{what}'s parameters: {msg}") from None


def forced_call_arguments(tools: list[dict], mode) -> dict[str, StructuredOutputsParams]:
    """For tool_choice "required" or a named function: each function the server may make the model
    call -> its parameters' JSON schema as the constraint on the arguments the model writes (as
    vLLM guides forced calls)."""
    if mode in ("none", "auto"):
        return {}
    return {t["function"]["name"]: _checked(i, _arguments_schema(t["function"]), "a forced call")
            for i, t in enumerate(tools) if not isinstance(mode, tuple) or t["function"]["name"] == mode[1]}


def strict_calls(tools: list[dict], mode, template: str | None, tokenizer,
                 parallel: bool = True) -> StructuredOutputsParams | None:
    """tool_choice "auto" with `strict` functions: OpenAI's guarantee that a strict function's
    arguments follow its parameters. Each time the model opens calls (the style's marker: <tool_call>,
    [TOOL_CALLS], <｜tool▁calls▁begin｜>), what follows is constrained to the style's calls of the
    request's functions, the arguments per the parameters for a strict function (any object
    otherwise); the text around the calls stays free; not `parallel`: one call a marker. None where
    calls have no marker that a grammar of a JSON call follows (Llama-3's bare JSON, Qwen3-Coder's XML)."""
    if mode != "auto" or not any(t["function"].get("strict") for t in tools):
        return None
    arguments = {}
    for i, t in enumerate(tools):
        fn = t["function"]
        arguments[fn["name"]] = _arguments_schema(fn) if fn.get("strict") else {"type": "object"}
        if fn.get("strict"):
            _checked(i, arguments[fn["name"]], "a strict function")
    family = call_family(template)
    if family == "mistral":
        marker, grammar = BOT, (tool_grammar.mistral_v11(tokenizer, arguments, CALL_ID in template)
                                if ARGS in template else tool_grammar.mistral_list(arguments, parallel))
    elif family == "deepseek":
        marker, grammar = CALLS_BEGIN, tool_grammar.deepseek(tokenizer, arguments, "```json" in template,
                                                                  parallel)
    elif not template_knows_tools(template) or (OPEN in template and "<function=" not in template):
        marker, grammar = OPEN, tool_grammar.hermes(arguments)
    else:
        return None
    return StructuredOutputsParams(grammar=grammar, start_after=tokenizer.encode(marker, add_special_tokens=False),
                                   repeat=True)


def parse_tool_choice(raw, tools: list[dict] | None):
    """-> "none" | "auto" | "required" | ("function", name)."""
    if raw is None:
        return "auto" if tools else "none"
    if tools is None and raw != "none":   # "none" (what no tools mean anyway) stands alone, as in vLLM
        raise bad("tool_choice", "'tool_choice' is only allowed when 'tools' are specified")
    if raw in ("none", "auto", "required"):
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise bad("tool_choice", f"tool_choice names function {name!r}, which is not in 'tools'")
        return ("function", name)
    raise bad("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}")


def parse_messages(raw) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "'messages' must be a non-empty array")
    try:
        msgs = validate_messages(raw)
    except ValueError as e:
        param = str(e).split(":", 1)[0]
        raise bad(param, str(e)) from None
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if m["role"] not in ROLES:
            raise bad(f"{where}.role", f"role must be one of {', '.join(ROLES)}; got {m['role']!r}")
        if m["role"] == "developer":
            m["role"] = "system"
        calls = m.get("tool_calls") or []
        if m["role"] != "assistant" and calls:
            raise bad(f"{where}.tool_calls", "only assistant messages carry tool_calls")
        if m["content"] is None and not calls:      # an assistant's: validate_messages refused the others
            raise bad(f"{where}.content", "'content' is required (it may be null only for assistant tool calls)")
        if m.get("name") is not None and not isinstance(m["name"], str):   # (a template may write it out)
            raise bad(f"{where}.name", f"'{where}.name' must be a string")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise bad(f"{where}.tool_call_id", "tool messages need a string 'tool_call_id'")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not isinstance(fn.get("arguments"), str):
                raise bad(f"{where}.tool_calls[{j}]", "tool calls need function.name and function.arguments strings")
            if not isinstance(c.get("id"), str):
                raise bad(f"{where}.tool_calls[{j}].id", f"'{where}.tool_calls[{j}].id' must be a string")
            if c.get("type") != "function":
                raise bad(f"{where}.tool_calls[{j}].type", f"'{where}.tool_calls[{j}].type' must be 'function', "
                                                           f"got {short_repr(c.get('type'))}")
    _check_tool_results(msgs)
    return msgs


def _check_tool_results(msgs: list[dict]) -> None:
    """OpenAI's rule: a tool message answers a call of the assistant message before it (with only
    tool messages, answering its other calls, in between)."""
    calls = None            # the call ids of the assistant message the tool messages so far follow
    for i, m in enumerate(msgs):
        if m["role"] != "tool":     # (only assistant messages carry tool_calls)
            calls = {c["id"] for c in m.get("tool_calls") or []} or None
            continue
        where = f"messages[{i}].tool_call_id"
        if calls is None:
            raise bad(where, f"'{where}': messages with role 'tool' must be a response to a preceding message "
                             "with 'tool_calls'")
        if m["tool_call_id"] not in calls:
            raise bad(where, f"'{where}' {short_repr(m['tool_call_id'])} is not the id of a tool call of the "
                             "preceding assistant message")


class _Arguments(dict):
    """Tool-call arguments handed to a chat template: the decoded object that Hugging Face templates
    iterate (`arguments|items`, `|tojson`), which also reads as the JSON text the client sent where a
    template writes it out or joins it to strings (DeepSeek's: `... + arguments + ...`)."""

    def __init__(self, obj: dict, text: str):
        super().__init__(obj)
        self._text = text   # (private: a template's `arguments.text` must find an argument named text)

    def __str__(self) -> str:
        return self._text

    def __add__(self, other):
        return self._text + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other):
        return other + self._text if isinstance(other, str) else NotImplemented


def _decoded(arguments: str):
    try:
        obj = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return _Arguments(obj, arguments) if isinstance(obj, dict) else obj


def template_knows_tools(template: str | None) -> bool:
    return bool(template) and "tool" in template


@dataclass(frozen=True)
class ToolStyle:
    """How a request's template writes tool calls, as far as the server must know."""
    forced: tuple[str, str] = HERMES_FORCED  # a forced call of f: the prompt ends with forced[0] + f + forced[1]
    short_ids: bool = False                  # call ids of 9 alphanumeric characters (Mistral's templates
                                             # reject others when the calls come back in the conversation)
    markers: tuple[int, ...] = ()            # the tokenizer's tool-call marker tokens that skip_special_tokens drops

    def call_id(self) -> str:
        return mistral_call_id() if self.short_ids else new_id("call")


def call_family(template: str | None) -> str:
    """The call form a template writes, as the server tells them apart: "mistral" ([TOOL_CALLS]),
    "deepseek" (<｜tool▁calls▁begin｜>), else "hermes" (the server's own <tool_call> JSON; templates
    writing other forms, Llama-3's bare JSON or Qwen3-Coder's XML, fall here too)."""
    if template_knows_tools(template) and BOT in template:
        return "mistral"
    if tools_deepseek.writes_deepseek_calls(template):
        return "deepseek"
    return "hermes"


def tool_style(tokenizer, tools: list | None) -> ToolStyle:
    """The style of a request offering tools (None: none offered). Mistral's: the template writes
    [TOOL_CALLS] (or checks Mistral's ids), or the tokenizer has Mistral's marker tokens.
    DeepSeek's: the template writes <｜tool▁call▁begin｜>. Either's marker tokens are kept in the text."""
    if tools is None:
        return ToolStyle()
    template = tokenizer.chat_template_for(tools)
    mistral_markers = tuple(tokenizer.hidden_token_ids(MARKERS))
    markers = mistral_markers + tuple(tokenizer.hidden_token_ids(tools_deepseek.MARKERS))
    family = call_family(template)
    if family == "mistral":
        forced = forced_form(template)
    elif family == "deepseek":
        forced = tools_deepseek.forced_form(template)
    else:
        forced = HERMES_FORCED
    return ToolStyle(forced, writes_mistral_calls(template) or bool(mistral_markers), markers)


def for_template(msgs: list[dict], tools: list[dict] | None, native: bool) -> tuple[list[dict], list | None]:
    """(messages, tools) to hand to the chat template."""
    if native:
        out = []
        for m in msgs:
            if m.get("tool_calls"):
                m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=_decoded(
                    c["function"]["arguments"]))) for c in m["tool_calls"]])
            out.append(m)
        return out, tools
    out = []
    for m in msgs:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
            continue
        if m.get("tool_calls"):
            blocks = [f"{OPEN}\n" + json.dumps({"name": c["function"]["name"],
                                                 "arguments": _decoded(c["function"]["arguments"])},
                                                ensure_ascii=False) + f"\n{CLOSE}" for c in m["tool_calls"]]
            text = "\n".join(([m["content"]] if m["content"] else []) + blocks)
            m = dict(m, content=text)
        # the message's other fields (name, reasoning_content) stay for the template, as vLLM passes them
        out.append({k: v for k, v in m.items() if k != "tool_calls"})
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        system = HERMES_SYSTEM.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = dict(out[0], content=out[0]["content"] + "\n\n" + system)
        else:
            out.insert(0, {"role": "system", "content": system})
    return out, None

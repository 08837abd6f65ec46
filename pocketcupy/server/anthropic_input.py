"""An Anthropic Messages API request (POST /v1/messages) as the chat request it asks for: `system`
and content blocks (text, tool_use, tool_result) become chat messages, `tools` with `input_schema`
chat's function tools, `tool_choice` auto / any / tool / none chat's, `thinking` the template's
`enable_thinking` and its `budget_tokens` chat's `thinking_token_budget`, `output_config.format` chat's
json_schema response_format. The sampling fields the current API dropped (temperature, top_p, top_k) are
still taken, as older clients send them. A 400 from the chat parser is renamed to the field the client sent."""
from __future__ import annotations

import json
import re

from .protocol import Fields, RenamedErrors, bad, short_repr

# passed to the chat parser under the same name (vLLM's sampling extensions among them)
SAME_FIELDS = ("model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
               "frequency_penalty", "repetition_penalty", "stream", "priority", "structured_outputs",
               "chat_template_kwargs", "ignore_eos", "min_tokens")
TOOL_KEYS = ("name", "description", "input_schema", "type", "cache_control")
EFFORTS = ("low", "medium", "high", "xhigh", "max")


def _blocks(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(f"{where}.content", f"'{where}.content' must be a string or an array of content blocks")
    for j, b in enumerate(content):
        if not isinstance(b, dict):
            raise bad(f"{where}.content[{j}]", f"'{where}.content[{j}]' must be an object")
    return content


MEDIA = ("image", "document")     # blocks a text-only model cannot read


def _no_media(kind, where: str) -> None:
    if kind in MEDIA:
        raise bad(where, f"'{where}': {kind} blocks are not supported: this model takes text only")


def _text(b: dict, where: str, nonempty: bool = False) -> str:
    """nonempty: a turn's text block, which Anthropic's API refuses empty."""
    if not isinstance(b.get("text"), str):
        raise bad(f"{where}.text", f"'{where}.text' must be a string")
    if nonempty and not b["text"]:
        raise bad(f"{where}.text", f"'{where}.text': text content blocks must be non-empty")
    return b["text"]


def _tool_result(b: dict, where: str) -> dict:
    if not isinstance(b.get("tool_use_id"), str):
        raise bad(f"{where}.tool_use_id", f"'{where}.tool_use_id' must be a string")
    content = b.get("content", "")
    parts = _blocks(content, where)
    for k, p in enumerate(parts):
        _no_media(p.get("type"), f"{where}.content[{k}]")
        if p.get("type") != "text":
            raise bad(f"{where}.content[{k}]", f"'{where}.content[{k}]': only text is supported in tool results, "
                                               f"got {short_repr(p.get('type'))}")
    text = "".join(_text(p, f"{where}.content[{k}]") for k, p in enumerate(parts))
    if not isinstance(b.get("is_error", False), bool):
        raise bad(f"{where}.is_error", f"'{where}.is_error' must be a boolean")
    if b.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": b["tool_use_id"], "content": text}


def chat_messages(raw, system) -> tuple[list[dict], list[str]]:
    """(chat messages, the request field each came from). A user turn's tool_result blocks become
    tool messages ahead of its text; an assistant turn's tool_use blocks its tool_calls, its thinking
    blocks its `reasoning`, which templates such as Qwen3's write back (as vLLM passes them on);
    redacted_thinking, which only Anthropic can read, and a turn of thinking alone are dropped."""
    msgs, origin = [], []
    if system is not None:
        if not isinstance(system, (str, list)) or any(not isinstance(p, dict) for p in system if not isinstance(system, str)):
            raise bad("system", "'system' must be a string or an array of text blocks")
        for k, p in enumerate(system if isinstance(system, list) else ()):
            if p.get("type") != "text":     # (an image block's text was taken as the system prompt)
                raise bad(f"system[{k}].type", f"'system[{k}].type' must be 'text', got {short_repr(p.get('type'))}")
        text = system if isinstance(system, str) else "".join(_text(p, f"system[{k}]") for k, p in enumerate(system))
        msgs.append({"role": "system", "content": text})
        origin.append("system")
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "'messages' must be a non-empty array")
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad(f"{where}.role", f"'{where}.role' must be 'user' or 'assistant'")
        if m.get("content") in ("", []):
            if m["role"] == "assistant" and i == len(raw) - 1:
                continue        # an empty final assistant turn: no prefill
            raise bad(where, f"'{where}': all messages must have non-empty content except for the optional final "
                             "assistant message")
        texts, calls, thoughts = [], [], []
        for j, b in enumerate(_blocks(m.get("content"), where)):
            at, kind = f"{where}.content[{j}]", b.get("type")
            if kind == "text":     # (an empty one is taken in the final assistant turn, as an empty prefill)
                texts.append(_text(b, at, nonempty=not (m["role"] == "assistant" and i == len(raw) - 1)))
            elif kind == "tool_result" and m["role"] == "user":
                msgs.append(_tool_result(b, at))
                origin.append(where)
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) \
                        or not isinstance(b.get("input"), dict):
                    raise bad(at, f"'{at}': tool_use blocks need a string id and name and an object input")
                calls.append({"id": b["id"], "type": "function",
                              "function": {"name": b["name"], "arguments": json.dumps(b["input"], ensure_ascii=False)}})
            elif kind == "thinking" and m["role"] == "assistant":
                if not isinstance(b.get("thinking"), str):
                    raise bad(f"{at}.thinking", f"'{at}.thinking' must be a string")
                thoughts.append(b["thinking"])
            elif kind == "redacted_thinking" and m["role"] == "assistant":
                continue
            else:
                _no_media(kind, at)
                raise bad(at, f"'{at}': a {m['role']} turn may hold text"
                              f"{', tool_result' if m['role'] == 'user' else ', tool_use, thinking'} blocks here, "
                              f"got {short_repr(kind)}")
        if texts or calls:
            msg = {"role": m["role"], "content": "".join(texts) if texts or not calls else None}
            if calls:
                msg["tool_calls"] = calls
            if "".join(thoughts):
                msg["reasoning"] = "".join(thoughts)
            msgs.append(msg)
            origin.append(where)
    return msgs, origin


def _tools(raw) -> list | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad("tools", "'tools' must be an array of tools")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad(f"tools[{i}]", f"'tools[{i}]': only custom tools (name, input_schema) are supported, got type "
                                     f"{short_repr(kind)}")
        unknown = sorted(set(t) - set(TOOL_KEYS))
        if unknown:
            raise bad(f"tools[{i}].{unknown[0]}", f"Unrecognized tool field: tools[{i}].{unknown[0]}")
        if not isinstance(t.get("input_schema"), dict):     # chat's parameters may be left out
            raise bad(f"tools[{i}].input_schema", f"'tools[{i}].input_schema' is required and must be an object")
        fn = {"name": t.get("name"), "parameters": t["input_schema"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw) -> tuple[object, bool | None]:
    """(chat's tool_choice, parallel_tool_calls)."""
    if raw is None:
        return None, None
    c = Fields(raw, "tool_choice")
    kind = c.str("type")
    parallel = c.bool("disable_parallel_tool_use")
    name = c.str("name")
    c.reject_unknown()
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind == "tool":
        if name is None:
            raise bad("tool_choice.name", "'tool_choice.name' is required with type 'tool'")
        mode = {"type": "function", "function": {"name": name}}
    elif kind in modes:
        mode = modes[kind]
    else:
        raise bad("tool_choice.type", f"'tool_choice.type' must be one of auto, any, tool, none, got {short_repr(kind)}")
    return mode, None if parallel is None else not parallel


def _thinking(raw, max_tokens) -> tuple[bool | None, int | None]:
    """(whether the template is asked to let the model think (None: not said), the thinking token budget).
    budget_tokens is required with 'enabled' and below max_tokens (max_tokens None: count_tokens, which has
    none), as Anthropic's API checks it, and enforced (chat's thinking_token_budget); Anthropic's least
    budget, 1024, is not required: a smaller one is cut there too."""
    if raw is None:
        return None, None
    t = Fields(raw, "thinking")
    kind = t.str("type")
    budget = t.int("budget_tokens", None, 1, None)
    t.reject_unknown()
    if kind not in ("enabled", "disabled", "adaptive"):
        raise bad("thinking.type", f"'thinking.type' must be 'enabled', 'disabled' or 'adaptive', got {short_repr(kind)}")
    if kind == "enabled" and budget is None:
        raise bad("thinking.budget_tokens", "Missing required parameter: 'thinking.budget_tokens'")
    if budget is not None and type(max_tokens) is int and budget >= max_tokens:
        raise bad("thinking.budget_tokens", f"'max_tokens' must be greater than 'thinking.budget_tokens' "
                                            f"({max_tokens} <= {budget})")
    return kind != "disabled", None if kind == "disabled" else budget


def _output_config(raw) -> tuple[dict | None, str | None]:
    """(chat's response_format, reasoning effort) of `output_config`."""
    if raw is None:
        return None, None
    o = Fields(raw, "output_config")
    effort = o.str("effort")
    if effort is not None and effort not in EFFORTS:
        raise bad("output_config.effort", f"'output_config.effort' must be one of {', '.join(EFFORTS)}, "
                                          f"got {short_repr(effort)}")
    fmt = o.obj("format")
    o.reject_unknown()
    if fmt is None:
        return None, effort
    f = Fields(fmt, "output_config.format")
    if f.str("type") != "json_schema":
        raise bad("output_config.format.type", "'output_config.format.type' must be 'json_schema'")
    schema = f.obj("schema")
    f.reject_unknown()
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}, effort


def as_chat_body(f: Fields, count_only: bool = False) -> tuple[dict, list[str]]:
    """(the chat body, the request field each of its messages came from); count_only: the fields of
    /v1/messages/count_tokens (no max_tokens)."""
    msgs, origin = chat_messages(f.require("messages"), f.get("system"))
    body = {"messages": msgs}
    if msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
        # a last assistant turn is a prefill: the reply continues it
        body.update(continue_final_message=True, add_generation_prompt=False)
    if not count_only:
        f.require("max_tokens")
        # Anthropic's ranges, narrower than chat's (temperature up to 1e6, top_k -1 for no limit)
        f.num("temperature", lo=0, hi=1)
        f.num("top_p", lo=0, hi=1)
        f.int("top_k", lo=0)
        for name in SAME_FIELDS:
            if f.get(name) is not None:
                body[name] = f.get(name)
        stops = f.get("stop_sequences")
        if stops is not None:
            if not isinstance(stops, list):     # chat's stop also takes a lone string
                raise bad("stop_sequences", "'stop_sequences' must be an array of strings")
            body["stop"] = stops
        meta = f.obj("metadata")
        if meta is not None:
            m = Fields(meta, "metadata")
            user = m.str("user_id")
            m.reject_unknown()
            if user is not None:
                body["user"] = user
        for hint in ("service_tier", "speed", "inference_geo"):   # no effect on the output here
            f.str(hint)
        response_format, effort = _output_config(f.get("output_config"))
        if response_format is not None:
            body["response_format"] = response_format
        if effort is not None:        # a template variable, as chat's reasoning_effort
            body["chat_template_kwargs"] = {"reasoning_effort": effort, **(body.get("chat_template_kwargs") or {})}
    else:
        body["model"] = f.get("model")
    tools = _tools(f.get("tools"))
    if tools is not None:
        body["tools"] = tools
    mode, parallel = _tool_choice(f.get("tool_choice"))
    if mode is not None:
        body["tool_choice"] = mode
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    f.obj("cache_control")      # prefix caching is automatic
    think, budget = _thinking(f.get("thinking"), None if count_only else f.get("max_tokens"))
    if think is not None:
        body["chat_template_kwargs"] = {"enable_thinking": think, **(body.get("chat_template_kwargs") or {})}
    if budget is not None and not count_only:
        body["thinking_token_budget"] = budget
    f.reject_unknown()
    return body, origin


# chat's field names in its errors -> the Messages request's
_RENAMES = [(re.compile(r"'stop' must be a string or an array"), "'stop' must be an array"),   # (no lone string)
            (re.compile(r"\bstop\b"), "stop_sequences"),
            (re.compile(r"\bresponse_format\.json_schema\.schema\b"), "output_config.format.schema"),
            (re.compile(r"\btools\[(\d+)\]\.function\.parameters\b"), r"tools[\1].input_schema"),
            (re.compile(r"'parameters'"), "'input_schema'"),
            (re.compile(r"\btools\[(\d+)\]\.function\b"), r"tools[\1]"),
            (re.compile(r"\btool_choice\.function\b"), "tool_choice"),
            (re.compile(r"\btool_call_id\b"), "tool_use_id")]


def renamed(origin: list[str]) -> RenamedErrors:
    """The chat parser's and engine's errors about this request, naming its fields."""
    return RenamedErrors(origin, _RENAMES)

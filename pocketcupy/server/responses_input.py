"""A Responses API request (POST /v1/responses) as the chat request it asks for: `input` items and
`instructions` become messages, flat function tools and `text.format` become chat's `tools` and
`response_format`, so that one parser, template and tool path serve both endpoints. A 400 from the
chat parser is renamed to the field the client sent."""
from __future__ import annotations

import re

from .protocol import MAX_LOGPROBS, Fields, RenamedErrors, bad, short_repr
from .responses_items import listed

# Responses fields passed to the chat parser under the same name (vLLM's sampling extensions among them)
SAME_FIELDS = ("model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "presence_penalty",
               "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "ignore_eos", "priority",
               "user", "metadata", "service_tier", "parallel_tool_calls", "skip_special_tokens",
               "chat_template_kwargs", "prompt_cache_key", "safety_identifier", "truncate_prompt_tokens",
               "structured_outputs", "thinking_token_budget")
# OpenAI fields this server cannot honour: a 400 naming them rather than a response without them
UNSUPPORTED = {"conversation": "stored conversations (send the whole conversation in 'input')",
               "prompt": "stored prompt templates", "max_tool_calls": "a cap on tool calls",
               "context_management": "context management"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# the API's other include values: taken, with nothing to add here (no such tool calls or images; a
# reasoning item carries its text, not OpenAI's encrypted_content, which clients such as Codex ask for)
INCLUDABLE = (LOGPROBS_INCLUDE, "reasoning.encrypted_content", "file_search_call.results", "web_search_call.results",
              "web_search_call.action.sources", "message.input_image.image_url",
              "computer_call_output.output.image_url", "code_interpreter_call.outputs")
TEXT_PARTS = ("input_text", "output_text", "text")
TRUNCATIONS = ("disabled", "auto")


def _text_content(content, where: str, field: str = "content") -> str:
    """A message's content (a function_call_output's output): a string, or text parts (input_text /
    output_text) joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where}.{field}", f"'{where}.{field}' must be a string or an array of text parts")
    texts = []
    for j, part in enumerate(content):
        p = f"{where}.{field}[{j}]"
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS + ("refusal",):
            kind = part.get("type") if isinstance(part, dict) else None
            raise bad(p, f"'{p}': only text parts (input_text, output_text) are supported, got {short_repr(kind)}")
        text = part.get("refusal" if part["type"] == "refusal" else "text")
        if not isinstance(text, str):
            raise bad(p, f"'{p}' needs a string '{'refusal' if part['type'] == 'refusal' else 'text'}'")
        texts.append(text)
    return "".join(texts)


def _string(item: dict, name: str, where: str) -> str:
    v = item.get(name)
    if not isinstance(v, str):
        raise bad(f"{where}.{name}", f"'{where}.{name}' must be a string, got {short_repr(v)}")
    return v


REASONING_PARTS = {"content": "reasoning_text", "summary": "summary_text"}


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text: its reasoning_text parts, else its summary_text parts (vLLM's order);
    encrypted_content, which only OpenAI can read, is ignored."""
    texts = {}
    for field, kind in REASONING_PARTS.items():
        parts = item.get(field)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise bad(f"{where}.{field}", f"'{where}.{field}' must be an array of {kind} parts")
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("type") != kind or not isinstance(part.get("text"), str):
                raise bad(f"{where}.{field}[{j}]", f"'{where}.{field}[{j}]' must be {{'type': '{kind}', 'text': str}}")
        texts[field] = "".join(part["text"] for part in parts)
    return texts.get("content") or texts.get("summary") or ""


def input_messages(items: list, instructions: str | None, first: int = 0) -> tuple[list[dict], list[str]]:
    """(chat messages, the request field each message came from) of input items; items before
    `first` are a stored conversation's (previous_response_id). Consecutive function_call items
    become one assistant message's tool_calls; a reasoning item (a previous response's output sent
    back) is the `reasoning` of the assistant message or calls that follow it, which templates such as
    Qwen3's write back (vLLM hands reasoning items to the template too); one that no assistant output
    follows is dropped."""
    msgs, origin = [], []
    if instructions is not None:
        msgs.append({"role": "system", "content": instructions})
        origin.append("instructions")
    calls = None                            # the assistant message that function_call items join
    thought = ""                            # reasoning items' text, for the assistant output that follows
    for i, item in enumerate(items):
        where = f"input[{i - first}]" if i >= first else "previous_response_id"
        if not isinstance(item, dict):
            raise bad(where, f"'{where}' must be an object")
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought += _reasoning_text(item, where)
            continue
        if kind == "function_call":
            if calls is None:
                calls = {"role": "assistant", "content": None, "tool_calls": []}
                msgs.append(calls)
                origin.append(where)
            if thought:
                calls["reasoning"] = calls.get("reasoning", "") + thought
                thought = ""
            calls["tool_calls"].append({"id": _string(item, "call_id", where), "type": "function", "function": {
                "name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}})
            continue
        calls = None
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad(f"{where}.role", f"'{where}.role' must be one of user, system, developer, assistant, "
                                           f"got {short_repr(role)}")
            msgs.append({"role": role, "content": _text_content(item.get("content"), where)})
            if role == "assistant" and thought:
                msgs[-1]["reasoning"] = thought
        elif kind == "function_call_output":
            text = _text_content(item.get("output"), where, "output")
            msgs.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": text})
        else:
            raise bad(f"{where}.type", f"'{where}.type' must be one of message, function_call, "
                                       f"function_call_output, reasoning, got {short_repr(kind)}")
        origin.append(where)
        thought = ""
    if not msgs:
        raise bad("input", "'input' holds no message")
    return msgs, origin


def _tools(raw) -> list | None:
    """Flat function tools ({'type': 'function', 'name', 'parameters', ...}) in chat's nesting."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad("tools", "'tools' must be an array of function tools")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad(f"tools[{i}]", f"'tools[{i}]': only function tools are supported, got type {short_repr(kind)}")
        out.append({"type": "function", "function": {k: v for k, v in t.items() if k != "type"}})
    return out


def _tool_choice(raw):
    if isinstance(raw, dict) and raw.get("type") == "function":
        return {"type": "function", "function": {k: v for k, v in raw.items() if k != "type"}}
    if isinstance(raw, dict):
        raise bad("tool_choice", f"'tool_choice' of type {short_repr(raw.get('type'))} is not supported: "
                                 "only 'none', 'auto', 'required' or a function")
    if raw is not None and raw not in ("none", "auto", "required"):   # (chat's message shows chat's shape)
        raise bad("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                                 f"{{'type': 'function', 'name': ...}}, got {short_repr(raw)}")
    return raw


def _response_format(text: dict | None):
    """`text.format` as chat's response_format (None: plain text)."""
    if text is None:
        return None
    t = Fields(text, "text")
    fmt = t.obj("format")
    t.str("verbosity")
    t.reject_unknown()
    if fmt is None:
        return None
    if fmt.get("type") != "json_schema":  # text (checked by chat's parser like the rest: no other keys)
        return fmt
    if fmt.get("schema") is None:  # (chat's json_schema.schema is optional; Responses' is not)
        raise bad("text.format.schema", "Missing required parameter: 'text.format.schema'")
    spec = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": spec}


def _referenced(item, where: str, store):
    """An item_reference input item as the stored item it names (an input or output item of a stored
    response); any other item as it is."""
    if not isinstance(item, dict) or item.get("type") != "item_reference":
        return item
    if store is None:
        raise bad(where, f"'{where}': item_reference items need the server's response store (--responses-store N); "
                         "without it, send the item itself")
    ref = item.get("id")
    found = store.item(ref) if isinstance(ref, str) else None
    if found is None:
        raise bad(f"{where}.id", f"'{where}.id': no stored item with id {short_repr(ref)}")
    return found


def conversation(f: Fields, store) -> tuple[list, int]:
    """(the conversation's input items, the index of this request's first): a stored response's
    (previous_response_id; store: the server's ResponseStore, None without one) before `input`, whose
    item_reference items are the stored items they name."""
    raw = f.require("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    elif not isinstance(raw, list) or not raw:
        raise bad("input", "'input' must be a string or a non-empty array of input items")
    raw = [_referenced(item, f"input[{i}]", store) for i, item in enumerate(raw)]
    previous = f.str("previous_response_id")
    history = []
    if previous is not None:
        if store is None:
            raise bad("previous_response_id", "'previous_response_id' needs the server's response store "
                                              "(--responses-store N); without it, send the whole conversation in "
                                              "'input'")
        history = store.history(previous)
        if history is None:
            raise bad("previous_response_id", f"Previous response with id {short_repr(previous)} not found")
    _no_duplicates(history, raw)
    return history + raw, len(history)


def _no_duplicates(history: list, raw: list) -> None:
    """OpenAI's 400 for an item given twice: an id of the stored conversation's, or of an earlier input
    item (an item_reference to an item previous_response_id already brings in, say)."""
    seen = {it.get("id") for it in history}
    for i, item in enumerate(raw):
        ref = item.get("id") if isinstance(item, dict) else None
        if isinstance(ref, str) and ref in seen:
            raise bad(f"input[{i}]", f"Duplicate item found with id {short_repr(ref)}. Remove duplicate items from "
                                     "your input and try again.")
        seen.add(ref)


def as_chat_body(f: Fields, store=None) -> tuple[dict, list[str], list, int]:
    """(the chat body, the request field each of its messages came from, the conversation's input
    items, the index of this request's first, each of its own with an id as input_items lists it);
    store: the server's ResponseStore (None: none)."""
    for name, what in UNSUPPORTED.items():
        if f.has(name):
            raise bad(name, f"'{name}' is not supported by this server ({what})")
        f.get(name)
    f.bool("background", False)         # (the handler reads it: it needs the server's store)
    truncation = f.str("truncation", "disabled")
    if truncation not in TRUNCATIONS:
        raise bad("truncation", f"'truncation' must be 'disabled' (a prompt over the context is a 400) or 'auto' "
                                f"(the oldest input items are dropped to fit), got {short_repr(truncation)}")
    include = f.get("include")
    if include is not None and (not isinstance(include, list) or any(v not in INCLUDABLE for v in include)):
        raise bad("include", f"'include' must be an array of {', '.join(INCLUDABLE)}, got {short_repr(include)}")
    # as OpenAI's API: logprobs only when included; top_logprobs says how many alternatives
    logprobs = LOGPROBS_INCLUDE in (include or [])
    top = f.int("top_logprobs", None, 0, MAX_LOGPROBS)
    items, first = conversation(f, store)
    msgs, origin = input_messages(items, f.str("instructions"), first)
    items = items[:first] + [listed(item) for item in items[first:]]
    body = {"messages": msgs}
    for name in SAME_FIELDS:
        if f.get(name) is not None:
            body[name] = f.get(name)
    f.bool("store")                     # (the handler reads it: kept only with the server's store)
    opts = f.obj("stream_options")      # include_obfuscation: no obfuscation is added either way
    if opts is not None:
        o = Fields(opts, "stream_options")
        o.bool("include_obfuscation")
        o.reject_unknown()
    reasoning = f.obj("reasoning")
    effort = None
    if reasoning is not None:
        r = Fields(reasoning, "reasoning")
        effort = r.str("effort")
        r.str("summary")
        r.str("generate_summary")
        r.reject_unknown()
    tools, choice = _tools(f.get("tools")), _tool_choice(f.get("tool_choice"))
    if not tools and choice in ("auto", "none", None):   # tools [] is the API's default (the Agents SDK sends it)
        tools = choice = None
    extra = {"stream": f.get("stream"), "max_completion_tokens": f.get("max_output_tokens"),
             "tools": tools, "tool_choice": choice,
             "response_format": _response_format(f.obj("text")), "reasoning_effort": effort,
             "logprobs": logprobs or None, "top_logprobs": top if logprobs else None}
    body.update({k: v for k, v in extra.items() if v is not None})
    f.reject_unknown()
    return body, origin, items, first


# chat's field names in its errors -> the Responses request's
_RENAMES = [(re.compile(r"\bmax_completion_tokens\b"), "max_output_tokens"),
            (re.compile(r"\bresponse_format\.json_schema\b"), "text.format"),
            (re.compile(r"\bresponse_format\b"), "text.format"),
            (re.compile(r"\btools\[(\d+)\]\.function\b"), r"tools[\1]"),
            (re.compile(r"\btool_choice\.function\b"), "tool_choice"),
            (re.compile(r"\breasoning_effort\b"), "reasoning.effort"),
            (re.compile(r"\btool_call_id\b"), "call_id"),
            (re.compile(r"\bmessages\b"), "input")]


def renamed(origin: list[str]) -> RenamedErrors:
    """The chat parser's and engine's errors about this request, naming its fields."""
    return RenamedErrors(origin, _RENAMES)

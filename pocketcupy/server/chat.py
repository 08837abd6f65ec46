"""POST /v1/chat/completions: request -> prompt (chat template, tools) -> engine -> response or SSE."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..sampling import MAX_LOGPROBS, SamplingParams, truncate_prompt
from .generation import Job
from .protocol import (Fields, bad, check_context, check_model, make_params, parse_common, parse_stream,
                       short_repr)
from .reasoning import ReasoningParser, after_reasoning, message_texts
from .responses import chat_logprobs, chunk_usage, finish_reason, new_id, prompt_logprobs_json, usage
from .sse import SSEStream
from .structured_fields import engine_mentions, engine_renames, parse_structured_field
from .tool_prompt import (ToolStyle, for_template, forced_call_arguments, parse_messages, parse_tool_choice,
                          parse_tools, strict_calls, template_knows_tools, tool_style)
from .tools import ForcedCallParser, ToolParser, forced_prefill


@dataclass
class ChatRequest:
    model: str
    text: str                       # the rendered prompt (without a forced-call prefill)
    params: SamplingParams
    priority: int
    stream: bool
    include_usage: bool
    continuous_usage: bool          # the usage so far in every chunk (vLLM's continuous_usage_stats)
    top_logprobs: int | None        # None: no logprobs
    tools: list | None
    tool_mode: object               # "none" | "auto" | "required" | ("function", name)
    forced_arguments: dict          # function the server may force -> the constraint on its arguments
    parallel_tool_calls: bool
    max_tokens: tuple | None
    style: ToolStyle                # how the template writes calls: forced prefill, id form, marker tokens
    return_token_ids: bool          # vLLM's: the prompt's and each choice's token ids in the response
    structured_param: str | None = None  # the field of the structured-output constraint, if any
    add_special_tokens: bool = False  # vLLM's: the tokenizer's BOS (and EOS suffix) around the rendered prompt
    prompt_logprobs: int | None = None  # vLLM's: the prompt tokens' logprobs in the response (None: none)


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
VERBOSITIES = ("low", "medium", "high")
# OpenAI fields whose feature this server does not have: a 400 naming them rather than a reply without it
UNSUPPORTED = {"audio": "audio output", "web_search_options": "web search",
               "functions": "the deprecated functions; use 'tools'",
               "function_call": "the deprecated function_call; use 'tool_choice'"}


def _one_of(f: Fields, name: str, options: tuple) -> str | None:
    v = f.str(name)
    if v is not None and v not in options:
        raise bad(name, f"'{name}' must be one of {', '.join(options)}, got {short_repr(v)}")
    return v


def parse_template_fields(f: Fields, generation_prompt: bool = True) -> dict:
    """The chat-template options of a request (chat completions, /tokenize, chat embeddings; generation_prompt:
    add_generation_prompt's default). OpenAI's
    reasoning_effort reaches the template as a variable of that name, as vLLM passes it, unless
    chat_template_kwargs sets it."""
    kwargs = f.obj("chat_template_kwargs")
    effort = _one_of(f, "reasoning_effort", REASONING_EFFORTS)
    if effort is not None:
        kwargs = {"reasoning_effort": effort, **(kwargs or {})}
    return {"chat_template_kwargs": kwargs,
            "add_generation_prompt": f.bool("add_generation_prompt", generation_prompt),
            "continue_final_message": f.bool("continue_final_message", False)}


def check_hint_fields(f: Fields) -> None:
    """OpenAI chat fields that change no output here (hints and bookkeeping), checked and accepted as
    vLLM accepts them; those asking for a feature the server lacks are a 400."""
    f.str("prompt_cache_key")       # prefix caching is automatic
    f.str("safety_identifier")
    _one_of(f, "verbosity", VERBOSITIES)
    modalities = f.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad("modalities", f"'modalities' must be [\"text\"]: this server writes text only, got "
                                f"{short_repr(modalities)}")
    prediction = f.obj("prediction")  # predicted output: a speed hint, the output does not depend on it
    if prediction is not None and prediction.get("type") != "content":
        raise bad("prediction", "'prediction' must be an object of type 'content'")
    for name, what in UNSUPPORTED.items():
        if f.has(name):
            raise bad(name, f"'{name}' is not supported by this server ({what})")
        f.get(name)


def render_messages(engine, msgs: list, tools: list | None, template: dict) -> str:
    """The prompt text of parsed messages and tools (None: none offered) through the model's template."""
    tmsgs, ttools = for_template(msgs, tools, template_knows_tools(engine.tokenizer.chat_template_for(tools)))
    try:
        return engine.render_chat(tmsgs, ttools, template["add_generation_prompt"], template["chat_template_kwargs"],
                                  template["continue_final_message"])
    except ValueError as e:
        msg = str(e)
        head = msg.split(":", 1)[0]
        raise bad(head if head in ("continue_final_message", "chat_template_kwargs") else "messages", msg) from None


def parse_chat(state, body) -> ChatRequest:
    engine = state.engine
    f = Fields(body)
    model = check_model(f, state.config.served_model_names)
    msgs = parse_messages(f.require("messages"))
    tools = parse_tools(f.get("tools"))
    mode = parse_tool_choice(f.get("tool_choice"), tools)
    parallel = f.bool("parallel_tool_calls", True)
    kw, priority = parse_common(f, engine.tokenizer.vocab_size, ("max_completion_tokens", "max_tokens"),
                                engine.default_sampling)
    logprobs = f.bool("logprobs", False)
    top = f.int("top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not logprobs:
        raise bad("top_logprobs", "'logprobs' must be true when 'top_logprobs' is used")
    kp = f.int("prompt_logprobs", None, 0, MAX_LOGPROBS)
    stream, include_usage, continuous_usage = parse_stream(f)
    if kp is not None and stream:   # (as vLLM)
        raise bad("prompt_logprobs", "'prompt_logprobs' is not available with 'stream': true")
    return_ids = f.bool("return_token_ids", False)
    kw["structured_outputs"], structured_param = parse_structured_field(f)
    template = parse_template_fields(f)
    add_special = f.bool("add_special_tokens", False)   # vLLM's: the template writes them by default
    check_hint_fields(f)
    f.reject_unknown()
    # tool_choice "none" keeps the tools in the prompt (OpenAI's and vLLM's default): the model only may not
    # call them, and nothing is parsed as a call; --exclude-tools-when-tool-choice-none leaves them out
    callable_tools = tools if mode != "none" else None
    dropped = mode == "none" and state.config.exclude_tools_when_tool_choice_none
    text = render_messages(engine, msgs, None if dropped else tools, template)
    mt = kw["max_tokens"]
    if kw["structured_outputs"] is not None and mode not in ("none", "auto"):
        raise bad("tool_choice", "a forced tool call cannot be combined with a structured-output constraint")
    forced = forced_call_arguments(tools, mode)
    style = tool_style(engine.tokenizer, callable_tools)
    if kw["structured_outputs"] is None and callable_tools:
        kw["structured_outputs"] = strict_calls(tools, mode, engine.tokenizer.chat_template_for(callable_tools),
                                                engine.tokenizer, parallel)
    # The tool parser must see the tokenizer's tool-call markers (Mistral's [TOOL_CALLS], [ARGS]),
    # which are control tokens that skip_special_tokens drops. vLLM turns skip_special_tokens off
    # for such requests, which also writes every other control token the model emits (Magistral's
    # [THINK], a stray [INST]) into the content of tool requests only; here just the markers are kept
    # (as llama.cpp's preserved tokens), so content stays what it is without tools.
    params = make_params(dict(kw, preserved_token_ids=list(style.markers)), (top or 0) if logprobs else None, kp)
    return ChatRequest(model, text, params, priority, stream, include_usage, continuous_usage,
                       (top or 0) if logprobs else None,
                       tools, mode, forced, parallel, mt, style, return_ids, structured_param, add_special, kp)


def encode_prompt(state, text: str, add_special_tokens: bool = False) -> list[int]:
    """The token ids of a rendered prompt (with the tokenizer's BOS / EOS suffix only if asked: the
    template writes them); text the tokenizer refuses (a lone surrogate from the messages or tools)
    is a 400 naming messages."""
    try:
        return state.engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    except ValueError as e:
        raise bad("messages", str(e)) from None


def count_prompt_tokens(state, chat_body: dict, names) -> int:
    """The tokens of the prompt a chat request renders (the Anthropic and Responses APIs' token-count
    routes); names: the RenamedErrors naming that API's fields in the errors."""
    with names:
        return len(encode_prompt(state, parse_chat(state, chat_body).text))


def _forced_name(state, req: ChatRequest, rid: str, gone) -> str | None:
    """The function the server makes the model call (tool_choice 'required' or named), if any."""
    mode = req.tool_mode
    if isinstance(mode, tuple):
        return mode[1]
    if mode != "required":
        return None
    names = [t["function"]["name"] for t in req.tools]
    if len(names) == 1:
        return names[0]
    # several functions: the model's most likely name among them (summed log-probs of the name tokens)
    base = encode_prompt(state, req.text + req.style.forced[0], req.add_special_tokens)
    full = [encode_prompt(state, req.text + forced_prefill(n, req.style.forced), req.add_special_tokens)
            for n in names]
    cands = [truncate_prompt(c, req.params.truncate_prompt_tokens, state.engine.max_model_len) for c in full]
    for c in cands:
        check_context(state.engine.max_model_len, len(c), (req.max_tokens or ("max_tokens", 1)), "messages",
                      "messages")
    scoring = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    with Job(state, rid + "-choose", cands, scoring, req.priority, gone, metered=False) as job:
        outs = job.results()
    scores = []
    for whole, c, out in zip(full, cands, outs):
        start = next((j for j, (a, b) in enumerate(zip(base, whole)) if a != b), min(len(base), len(whole)))
        start -= len(whole) - len(c)   # in the kept tokens
        scores.append(sum(out.prompt_logprobs[j][c[j]].logprob for j in range(max(start, 1), len(c))))
    return names[max(range(len(names)), key=scores.__getitem__)]


def _parser(req: ChatRequest, forced: str | None, reasoning: str | None):
    """A choice's parser of generated text (None: it is all content). A forced call's output is the
    call's arguments, so no reasoning parser looks at it; otherwise tool calls are parsed from the
    content after the reasoning (whether the output starts inside it: the prompt's end decides first)."""
    if forced is not None:
        return ForcedCallParser(forced)
    tools = None
    if req.tools and req.tool_mode != "none":
        tools = ToolParser([t["function"]["name"] for t in req.tools], req.parallel_tool_calls,
                           {t["function"]["name"]: t["function"].get("parameters") for t in req.tools})
    return tools if reasoning is None else ReasoningParser(reasoning, tools, req.text)


@dataclass
class ChatUpdate:
    """What one engine step added to one choice."""
    index: int
    events: list                    # parser events: ("content", t) | ("reasoning", t) | ("call", k, name)
                                    # | ("args", k, t)
    logprobs: list | None
    finish_reason: str | None
    stop_reason: object
    num_tokens: int
    num_cached_tokens: int          # prompt tokens whose KV came from the prefix cache
    token_ids: list                 # the choice's generated token ids so far
    prompt_logprobs: list | None    # the engine's prompt logprobs (params.prompt_logprobs), else None


def chat_updates(state, req: ChatRequest, job: Job, forced):
    """Engine outputs -> per-choice updates, shared by the streaming and the whole response. A forced
    call ends its choice as soon as its arguments form a JSON object, and so does the first call under
    parallel_tool_calls false; once every choice has ended the engine request is aborted rather than
    left generating."""
    tok, n = state.engine.tokenizer, req.params.n
    parsers = [_parser(req, forced, state.config.reasoning_parser) for _ in range(n)]
    sent, ended, called = [0] * n, [False] * n, [False] * n
    for _, out in job.outputs():
        for o in out.outputs:
            i, p = o.index, parsers[o.index]
            if ended[i]:
                continue
            events = [("content", o.delta_text)] if p is None else p.feed(o.delta_text)
            forced_call = isinstance(p, ForcedCallParser)
            complete = getattr(p, "done", False)    # a forced call's arguments, or the one call of
                                                    # parallel_tool_calls false, are complete
            if p is not None and (o.finished() or complete):
                events += p.finish()
            events = [e for e in events if e[0] not in ("content", "reasoning") or e[1]]
            called[i] = called[i] or any(e[0] == "call" for e in events)
            lps = None
            if req.top_logprobs is not None and o.logprobs is not None and len(o.logprobs) > sent[i]:
                lps = chat_logprobs(tok, o.token_ids[sent[i]:], o.logprobs[sent[i]:], req.top_logprobs)
                sent[i] = len(o.logprobs)
            # a forced call's arguments cut short by a stop string or token are no finished call
            cut = forced_call and o.stop_reason is not None
            fr = "tool_calls" if complete else finish_reason(o, called[i] and not cut)
            ended[i] = fr is not None
            yield ChatUpdate(i, events, lps, fr, None if complete else o.stop_reason, len(o.token_ids),
                             out.num_cached_tokens or 0, o.token_ids, out.prompt_logprobs)
        if all(ended):
            job.close("tool_calls")
            return


def _chat_finish(req: ChatRequest, reason: str | None) -> str | None:
    """A chat choice's finish_reason as OpenAI's API gives it: a call of the function tool_choice
    names ends with "stop" (vLLM's too); calls the model chose ("auto", "required") with "tool_calls"."""
    return "stop" if reason == "tool_calls" and isinstance(req.tool_mode, tuple) else reason


def start_chat_job(state, req: ChatRequest, rid: str, gone, rename=None) -> tuple[Job, str | None, list[int]]:
    """The running engine job of a parsed chat request (also the Responses and Anthropic APIs', whose
    `rename` names their fields in the engine's errors), the function the server forces the model to
    call (None: none) and the prompt's token ids."""
    forced = _forced_name(state, req, rid, gone)
    text = req.text + (forced_prefill(forced, req.style.forced) if forced else "")
    if forced:   # (the prompt ends in the call's prefill: no reasoning)
        params = replace(req.params, structured_outputs=req.forced_arguments[forced])
    else:
        params = after_reasoning(req.params, state.engine.tokenizer, state.config.reasoning_parser, text)
    ids = truncate_prompt(encode_prompt(state, text, req.add_special_tokens), req.params.truncate_prompt_tokens,
                          state.engine.max_model_len)
    check_context(state.engine.max_model_len, len(ids), req.max_tokens, "messages", "messages")
    constraint = req.structured_param if not forced else next(
        f"tools[{i}].function.parameters" for i, t in enumerate(req.tools) if t["function"]["name"] == forced)
    job = Job(state, rid, [ids], params, req.priority, gone,
              {"max_tokens": req.max_tokens[0] if req.max_tokens else "max_tokens", "prompt": "messages",
               **engine_renames(constraint)}, mentions=engine_mentions(constraint), rename=rename)
    job.start()
    return job, forced, ids


def handle_chat(state, body, gone):
    req = parse_chat(state, body)
    rid = new_id("chatcmpl")
    job, forced, ids = start_chat_job(state, req, rid, gone)
    head = {"id": rid, "created": int(time.time()), "model": req.model, "system_fingerprint": "pocketcupy"}
    if req.stream:
        return SSEStream(_stream(state, req, job, head, forced, ids), job)
    n = req.params.n
    content, reasoning, calls = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
    lps, final = [[] for _ in range(n)], [None] * n
    with job:
        for u in chat_updates(state, req, job, forced):
            for ev in u.events:
                if ev[0] == "content":
                    content[u.index].append(ev[1])
                elif ev[0] == "reasoning":
                    reasoning[u.index].append(ev[1])
                elif ev[0] == "call":
                    calls[u.index].append({"id": req.style.call_id(), "type": "function",
                                           "function": {"name": ev[2], "arguments": ""}})
                else:
                    calls[u.index][ev[1]]["function"]["arguments"] += ev[2]
            lps[u.index] += u.logprobs or []
            final[u.index] = u
    choices = []
    for i in range(n):
        thought, text = message_texts("".join(reasoning[i]), "".join(content[i]))
        msg = {"role": "assistant", "content": None if calls[i] and not (text or "").strip() else text,
               "refusal": None}
        if state.config.reasoning_parser is not None:   # vLLM's name, and the older one clients still read
            msg["reasoning"] = msg["reasoning_content"] = thought
        if calls[i]:
            msg["tool_calls"] = calls[i]
        lp = None if req.top_logprobs is None else {"content": lps[i], "refusal": None}
        choices.append({"index": i, "message": msg, "logprobs": lp,
                        "finish_reason": _chat_finish(req, final[i].finish_reason),
                        "stop_reason": final[i].stop_reason})
        if req.return_token_ids:
            choices[-1]["token_ids"] = list(final[i].token_ids)
    extra = {"prompt_token_ids": ids} if req.return_token_ids else {}
    if req.prompt_logprobs is not None:   # (vLLM's place for them: the response's, not a choice's)
        extra["prompt_logprobs"] = prompt_logprobs_json(ids, final[0].prompt_logprobs, req.prompt_logprobs)
    return dict(head, object="chat.completion", choices=choices,
                usage=usage(len(ids), sum(u.num_tokens for u in final), max(u.num_cached_tokens for u in final)),
                **extra)


def _delta(events, call_ids: dict, style: ToolStyle) -> dict:
    delta, calls = {}, {}
    for ev in events:
        if ev[0] in ("content", "reasoning"):
            for key in ("content",) if ev[0] == "content" else ("reasoning", "reasoning_content"):
                delta[key] = delta.get(key, "") + ev[1]
        elif ev[0] == "call":
            call_ids[ev[1]] = style.call_id()
            calls[ev[1]] = {"index": ev[1], "id": call_ids[ev[1]], "type": "function",
                            "function": {"name": ev[2], "arguments": ""}}
        else:
            entry = calls.setdefault(ev[1], {"index": ev[1], "function": {"arguments": ""}})
            entry["function"]["arguments"] += ev[2]
    if calls:
        delta["tool_calls"] = list(calls.values())
    return delta


def _stream(state, req: ChatRequest, job: Job, head: dict, forced, prompt_ids: list[int]):
    n = req.params.n
    call_ids = [dict() for _ in range(n)]
    total, sent_ids = [0] * n, [0] * n
    cached = 0

    def chunk(choice, **extra):
        return dict(head, object="chat.completion.chunk", choices=[choice],
                    **chunk_usage(req.include_usage, req.continuous_usage, len(prompt_ids), sum(total)), **extra)

    for i in range(n):
        first = {"prompt_token_ids": prompt_ids} if req.return_token_ids and i == 0 else {}
        yield chunk({"index": i, "delta": {"role": "assistant", "content": None if forced else ""},
                     "logprobs": None, "finish_reason": None}, **first)
    for u in chat_updates(state, req, job, forced):
        total[u.index], cached = u.num_tokens, max(cached, u.num_cached_tokens)
        delta = _delta(u.events, call_ids[u.index], req.style)
        if delta or u.logprobs or u.finish_reason:  # one choice per chunk, as OpenAI does
            c = {"index": u.index, "delta": delta,
                 "logprobs": None if u.logprobs is None else {"content": u.logprobs, "refusal": None},
                 "finish_reason": _chat_finish(req, u.finish_reason)}
            if u.finish_reason:
                c["stop_reason"] = u.stop_reason
            if req.return_token_ids:   # the tokens since this choice's last chunk
                c["token_ids"] = list(u.token_ids[sent_ids[u.index]:])
                sent_ids[u.index] = len(u.token_ids)
            yield chunk(c)
    if req.include_usage:
        yield dict(head, object="chat.completion.chunk", choices=[],
                   usage=usage(len(prompt_ids), sum(total), cached))

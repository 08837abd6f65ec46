"""POST /v1/completions (legacy text completions): prompts -> engine -> response or SSE."""
from __future__ import annotations

import time

from ..infill import infill_prompt
from ..sampling import MAX_LOGPROBS, truncate_prompt
from .generation import Job
from .protocol import Fields, bad, check_context, check_model, make_params, parse_common, parse_stream
from .responses import CompletionLogprobs, chunk_usage, finish_reason, new_id, prompt_logprobs_json, usage
from .sse import SSEStream
from .structured_fields import engine_mentions, engine_renames, parse_structured_field

MAX_PROMPTS = 64
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint, where max_tokens is left out


def parse_prompts(raw, tok, name: str = "prompt", most: int = MAX_PROMPTS,
                  add_special_tokens: bool = True) -> list[tuple[list[int], str]]:
    """(token ids, text to echo) per prompt of field `name` (at most `most` of them); texts are
    encoded with the tokenizer's special tokens (BOS) unless add_special_tokens is False."""
    def is_ids(x):
        return isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(raw, str):
        items = [raw]
    elif is_ids(raw):
        items = [raw]
    elif isinstance(raw, list) and raw and (all(isinstance(x, str) for x in raw) or all(is_ids(x) for x in raw)):
        items = raw
    else:
        raise bad(name, f"'{name}' must be a string, an array of strings, an array of token ids or an "
                        "array of token-id arrays (non-empty)")
    if len(items) > most:
        raise bad(name, f"at most {most} prompts per request")
    out = []
    for x in items:
        if isinstance(x, str):
            if not x:
                raise bad(name, "prompts must not be empty")
            try:
                out.append((tok.encode(x, add_special_tokens), x))
            except ValueError as e:
                raise bad(name, str(e)) from None
        else:
            if any(not 0 <= t < tok.vocab_size for t in x):
                raise bad(name, f"token ids must be in [0, {tok.vocab_size - 1}]")
            out.append((list(x), tok.decode(x)))
    return out


def _added_tokens(tok, text_prompts: bool, add_special: bool) -> tuple[int, int]:
    """How many tokens the tokenizer added before and after each text prompt (its BOS, its suffix); none
    to token-id prompts."""
    if not (text_prompts and add_special):
        return 0, 0
    return int(tok.add_bos), len(tok.suffix_ids)


def _scores_only(body) -> bool:
    """echo with max_tokens 0: OpenAI's prompt scoring (lm-eval's loglikelihood requests): the
    prompt and its logprobs come back and nothing is generated (the engine computes one token,
    which is dropped)."""
    return isinstance(body, dict) and body.get("echo") is True and type(body.get("max_tokens")) is int \
        and body["max_tokens"] == 0


def handle_completion(state, body, gone):
    engine = state.engine
    tok = engine.tokenizer
    scores_only = _scores_only(body)
    f = Fields(dict(body, max_tokens=1) if scores_only else body)
    model = check_model(f, state.config.served_model_names)
    suffix = f.str("suffix", None)
    # vLLM's add_special_tokens (the tokenizer's BOS / EOS suffix around text prompts); a suffix's
    # fill-in-the-middle prompt writes its own
    add_special = f.bool("add_special_tokens", True) and suffix is None
    raw = f.require("prompt")
    prompts = parse_prompts(raw, tok, add_special_tokens=add_special)
    kw, priority = parse_common(f, tok.vocab_size, defaults=engine.default_sampling, best_of_over_n=True)
    n = kw["n"]
    best_of = kw.pop("best_of")
    echo = f.bool("echo", False)
    k = f.int("logprobs", None, 0, MAX_LOGPROBS)
    kp = f.int("prompt_logprobs", None, 0, MAX_LOGPROBS)   # vLLM's: per choice, in its own shape
    stream, include_usage, continuous_usage = parse_stream(f)
    return_ids = f.bool("return_token_ids", False)     # vLLM's: each choice's prompt and generated ids
    if kp is not None and stream:
        raise bad("prompt_logprobs", "'prompt_logprobs' is not available with 'stream': true")
    if best_of > n and stream:   # as OpenAI: the best are known only at the end
        raise bad("best_of", "'best_of' greater than 'n' is not available with 'stream': true")
    kw["structured_outputs"], structured_param = parse_structured_field(f)
    f.reject_unknown()

    if suffix is not None:   # fill in the middle: between each prompt and the suffix
        if kw["truncate_prompt_tokens"] is not None:
            raise bad("truncate_prompt_tokens", "'truncate_prompt_tokens' cannot be combined with 'suffix'")
        try:
            prompts = [(infill_prompt(tok, ids, suffix), text) for ids, text in prompts]
        except ValueError as e:
            raise bad("suffix", str(e).partition(": ")[2]) from None
        if echo and k is not None:   # its logprobs would be those of the markers and the suffix too, not the echo's
            raise bad("echo", "'echo' with 'logprobs' cannot be combined with 'suffix'")
    C = engine.max_model_len
    kept = [truncate_prompt(ids, kw["truncate_prompt_tokens"], C) for ids, _ in prompts]
    added = _added_tokens(tok, isinstance(raw, str) or isinstance(raw[0], str), add_special)
    # per prompt: the text to echo (a truncated prompt's: the tokens kept, decoded) and how many of its first
    # and last tokens that text leaves out
    echoes = [(text, added) if len(short) == len(ids) else (tok.decode(short), (0, 0))
              for short, (ids, text) in zip(kept, prompts)]
    prompts = [(short, text) for short, (text, _) in zip(kept, echoes)]
    if kw["max_tokens"] is None and "max_tokens" not in f.body:   # (null, as vLLM: up to the context)
        kw["max_tokens"] = ("max_tokens", min(DEFAULT_MAX_TOKENS, max(1, C - max(len(p) for p, _ in prompts))))
    for ids, _ in prompts:
        check_context(C, len(ids), kw["max_tokens"], "prompt", "prompt")
    echoes = echoes if echo else None
    echo_k = k if echo else None
    if best_of > n:   # sample best_of, keep the n of the highest log-probability per token (the sampled ones')
        kw["n"] = best_of
    params = make_params(kw, k if best_of == n else (k or 0),
                         None if echo_k is None and kp is None else max(echo_k or 0, kp or 0))
    rid = new_id("cmpl")
    job = Job(state, rid, [p for p, _ in prompts], params, priority, gone,
              {"prompt": "prompt", **engine_renames(structured_param)},
              generates=not scores_only, mentions=engine_mentions(structured_param))
    job.start()
    head = {"id": rid, "created": int(time.time()), "model": model, "system_fingerprint": "pocketcupy"}
    if stream:
        return SSEStream(_stream(tok, job, head, prompts, n, echoes, k, (include_usage, continuous_usage),
                                 scores_only, return_ids), job)
    with job:
        finals = job.results()
    choices, generated = [], 0
    for pi, out in enumerate(finals):
        generated += sum(len(_generated(o, scores_only)[0]) for o in out.outputs)   # best_of's all count
        for index, o in enumerate(_best(out.outputs, n)):
            ids, lps, text, fr = _generated(o, scores_only)
            lp = None
            if k is not None:
                cl = CompletionLogprobs(tok, k, out.prompt_token_ids, params.skip_special_tokens)
                lp = cl.echo(out.prompt_token_ids, out.prompt_logprobs, echoes[pi][1]) if echoes else None
                gen = cl.make(ids, lps)
                lp = gen if lp is None else {key: lp[key] + gen[key] for key in gen}
            choice = {"index": pi * n + index, "text": (echoes[pi][0] if echoes else "") + text,
                      "logprobs": lp, "finish_reason": fr, "stop_reason": None if scores_only else o.stop_reason}
            if kp is not None:
                choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_token_ids, out.prompt_logprobs, kp)
            if return_ids:
                choice.update(prompt_token_ids=list(out.prompt_token_ids), token_ids=list(ids))
            choices.append(choice)
    return dict(head, object="text_completion", choices=choices,
                usage=usage(sum(len(p) for p, _ in prompts), generated, sum(out.num_cached_tokens for out in finals)))


def _best(outputs: list, n: int) -> list:
    """The n of a prompt's outputs (best_of of them, in their order) whose sampled tokens have the highest
    mean log-probability, as OpenAI's best_of picks them; all of them, in their order, when there are n."""
    if len(outputs) <= n:
        return sorted(outputs, key=lambda o: o.index)

    def mean_logprob(o) -> float:
        lps = [pos[t].logprob for t, pos in zip(o.token_ids, o.logprobs or [])]
        return sum(lps) / len(lps) if lps else 0.0
    return sorted(outputs, key=mean_logprob, reverse=True)[:n]


def _generated(o, scores_only: bool):
    """(token ids, logprobs, text, finish reason) a choice reports of its output o so far."""
    if scores_only:
        return [], [], "", "length" if o.finished() else None
    return o.token_ids, o.logprobs or [], o.text, finish_reason(o)


def _stream(tok, job, head, prompts, n, echoes, k, usage_opts, scores_only, return_ids):
    """echoes: handle_completion's (None: no echo); usage_opts: (include_usage, continuous usage) of
    parse_stream; return_ids: a choice's first chunk carries its prompt's token ids, every chunk the tokens
    since its last one."""
    include_usage, continuous = usage_opts
    prompt_tokens = sum(len(p) for p, _ in prompts)
    logs = {}
    sent, sent_ids = {}, {}
    total, cached = {}, {}

    def chunk(choices):
        return dict(head, object="text_completion", choices=choices,
                    **chunk_usage(include_usage, continuous, prompt_tokens, sum(total.values())))

    echoed, ended = set(), set()
    for pi, out in job.outputs():
        for o in out.outputs:
            idx = pi * n + o.index
            if idx in ended:  # (n > 1: a choice that ended comes along with the others' later steps)
                continue
            if idx not in logs:
                logs[idx] = CompletionLogprobs(tok, k or 0, out.prompt_token_ids, job.params.skip_special_tokens)
                sent[idx], sent_ids[idx] = 0, None
            ids, lps, _, fr = _generated(o, scores_only)
            text, lp = "" if scores_only else o.delta_text, None
            if echoes and idx not in echoed:
                echoed.add(idx)
                text = echoes[pi][0] + text
                if k is not None:
                    lp = logs[idx].echo(out.prompt_token_ids, out.prompt_logprobs, echoes[pi][1])
            if k is not None and len(lps) > sent[idx]:
                gen = logs[idx].make(ids[sent[idx]:], lps[sent[idx]:])
                lp = gen if lp is None else {key: lp[key] + gen[key] for key in gen}
                sent[idx] = len(lps)
            total[idx], cached[pi] = len(ids), out.num_cached_tokens
            if text or lp or fr:  # one choice per chunk
                c = {"index": idx, "text": text, "logprobs": lp, "finish_reason": fr}
                if fr:
                    c["stop_reason"] = None if scores_only else o.stop_reason
                    ended.add(idx)
                if return_ids:
                    if sent_ids[idx] is None:
                        c["prompt_token_ids"], sent_ids[idx] = list(out.prompt_token_ids), 0
                    c["token_ids"], sent_ids[idx] = list(ids[sent_ids[idx]:]), len(ids)
                yield chunk([c])
    if include_usage:
        yield dict(head, object="text_completion", choices=[],
                   usage=usage(prompt_tokens, sum(total.values()), sum(cached.values())))

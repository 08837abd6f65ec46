"""OpenAI response pieces: ids, usage, log-probabilities in the chat and legacy shapes, SSE lines."""
from __future__ import annotations

import json
import math
import uuid

from ..tokenizer import IncrementalDetokenizer


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """cached_tokens: the prompt tokens whose KV came from the prefix cache, as OpenAI reports them
    (prompt_tokens_details), in a response's final usage."""
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
         "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return u


def chunk_usage(include_usage: bool, continuous: bool, prompt_tokens: int, completion_tokens: int) -> dict:
    """The usage field of a streamed chunk with choices (parse_stream's flags): none without
    include_usage, else null, or the usage so far with continuous usage stats."""
    if not include_usage:
        return {}
    return {"usage": usage(prompt_tokens, completion_tokens) if continuous else None}


def json_bytes(obj, **kw) -> bytes:
    """UTF-8 JSON. A lone surrogate a client sent (valid JSON as an escape, but not encodable as
    UTF-8), e.g. echoed in an error message, is written back as its escape."""
    try:
        return json.dumps(obj, ensure_ascii=False, **kw).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, **kw).encode()


def sse(obj) -> bytes:
    return b"data: " + json_bytes(obj, separators=(",", ":")) + b"\n\n"


def sse_event(obj) -> bytes:
    """An SSE message named by the object's type (an error chunk without one: 'error')."""
    return b"event: " + obj.get("type", "error").encode() + b"\n" + sse(obj)


SSE_DONE = b"data: [DONE]\n\n"


def _num(x: float) -> float:
    """JSON has no -inf: a token the model cannot produce gets the most negative float."""
    return x if math.isfinite(x) else -9999.0


def _entry(tokenizer, tid: int, lp) -> dict:
    b = tokenizer.token_bytes(tid)
    token = lp.decoded_token if lp.decoded_token is not None else tokenizer.logprob_token(tid)
    return {"token": token, "logprob": _num(lp.logprob), "bytes": list(b)}


def chat_logprobs(tokenizer, token_ids, positions, k: int) -> list[dict]:
    """[{'token', 'logprob', 'bytes', 'top_logprobs': [...]}] for generated tokens."""
    out = []
    for tid, pos in zip(token_ids, positions):
        items = list(pos.items())
        e = _entry(tokenizer, tid, pos[tid])
        e["top_logprobs"] = [_entry(tokenizer, t, lp) for t, lp in items[:k]]
        out.append(e)
    return out


class CompletionLogprobs:
    """The legacy {tokens, token_logprobs, top_logprobs, text_offset} shape of one choice, built
    incrementally so streamed chunks carry offsets that continue where the previous chunk stopped.
    text_offset is where each token's text starts in the choice's text (the echoed prompt's, then the
    generated): counted on that text as it is decoded, not by the length of each token's own string,
    which for a token holding part of a character is a whole U+FFFD (the offsets ran past the text)."""

    def __init__(self, tokenizer, k: int, prompt_ids, skip_special_tokens: bool = True):
        self.tokenizer, self.k, self.offset = tokenizer, k, 0
        self._generated = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)

    def echo(self, prompt_ids, positions, hidden: tuple[int, int] = (0, 0)) -> dict:
        """The echoed prompt's entries; its text is decode(prompt_ids), special tokens and all, but for
        the `hidden` (first, last) tokens: the BOS / suffix the tokenizer added to a text prompt, which
        the echoed text (the client's) leaves out. Those add nothing to the offsets, and the token after
        the BOS starts the text (SentencePiece's '\u2581' there is no space in it)."""
        lead, end = hidden[0], len(prompt_ids) - hidden[1]
        detok = IncrementalDetokenizer(self.tokenizer, None, skip_special_tokens=False)
        parts = [self._make(prompt_ids[:lead], positions[:lead], _NOTHING, at_start=True),
                 self._make(prompt_ids[lead:end], positions[lead:end], detok, at_start=True)]
        self.offset += len(detok.flush())
        parts.append(self._make(prompt_ids[end:], positions[end:], _NOTHING))
        return {key: [v for part in parts for v in part[key]] for key in parts[0]}

    def make(self, token_ids, positions) -> dict:
        """The generated tokens' entries."""
        return self._make(token_ids, positions, self._generated)

    def _make(self, token_ids, positions, detok, at_start: bool = False) -> dict:
        """at_start: the first token starts the text (its token string is as decode gives it there)."""
        d = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for j, (tid, pos) in enumerate(zip(token_ids, positions)):
            text = self.tokenizer.logprob_token(tid, at_start=at_start and j == 0)
            d["tokens"].append(text)
            d["text_offset"].append(self.offset)
            self.offset += len(detok.push(tid))
            if pos is None:  # the first prompt token has no logprob
                d["token_logprobs"].append(None)
                d["top_logprobs"].append(None)
                continue
            d["token_logprobs"].append(_num(pos[tid].logprob))
            top = {}
            for t, lp in list(pos.items())[: self.k]:
                top[self.tokenizer.logprob_token(t)] = _num(lp.logprob)
            top.setdefault(text, _num(pos[tid].logprob))
            d["top_logprobs"].append(top)
        return d


class _Nothing:
    """The detokenizer of tokens the echoed text leaves out."""

    @staticmethod
    def push(token_id) -> str:
        return ""


_NOTHING = _Nothing()


def prompt_logprobs_json(token_ids, positions, k: int) -> list:
    """vLLM's prompt_logprobs: per prompt token null (the first) or {token id: {logprob, rank,
    decoded_token}} of the k most likely tokens and the prompt's own (positions: the engine's, which
    may hold more than k)."""
    out = []
    for tid, pos in zip(token_ids, positions):
        if pos is None:
            out.append(None)
            continue
        out.append({str(t): {"logprob": _num(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
                    for t, lp in pos.items() if t == tid or (lp.rank is not None and lp.rank <= k)})
    return out


def finish_reason(o, tool_calls: bool = False) -> str | None:
    if o.finish_reason is None:
        return None
    if tool_calls and o.finish_reason == "stop":
        return "tool_calls"
    return o.finish_reason

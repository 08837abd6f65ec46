"""OpenAI error bodies and request-field validation shared by the endpoints.

Every client mistake becomes an `ApiError` (status, message, param) that the app renders as
OpenAI's body: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import math
import numbers
import re

from ..input_errors import names_a_field
from ..sampling import MAX_LOGIT_BIAS, MAX_LOGPROBS, SamplingParams

MAX_N = 16                      # choices per request
MAX_STOP = 32                   # stop strings per request
INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
          503: "service_unavailable_error"}
# (Anthropic's overloaded_error comes with its 529; a 503 here is a server loading or stopping, not
# overloaded -- requests queue in the engine without a limit -- so it is an api_error, as other 5xx)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    413: "request_too_large", 500: "api_error", 529: "overloaded_error"}
_CODES = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
          500: "internal_error", 503: "service_unavailable"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or _CODES.get(status, "invalid_value" if param else "invalid_request")
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response_event(self) -> dict:
        """The Responses API's stream error event (ResponseErrorEvent, less its sequence_number): a
        stream's events are typed; the chat body's {"error": ...} was none of them."""
        return {"type": "error", "code": self.code, "message": self.message, "param": self.param}

    def anthropic_body(self) -> dict:
        """The Anthropic Messages API's error body (its routes answer with it); it has no param
        field, so the message names the field, as Anthropic's do ('max_tokens: ...')."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        message = self.message if not self.param or self.param in self.message else f"{self.param}: {self.message}"
        return {"type": "error", "error": {"type": kind, "message": message}}


def bad(param: str | None, message: str) -> ApiError:
    return ApiError(400, message, param)


def apply_renames(text: str, renames) -> str:
    """`text` with each (compiled pattern, replacement) of `renames` applied in turn."""
    for pattern, repl in renames:
        text = pattern.sub(repl, text)
    return text


class RenamedErrors:
    """The errors about a request translated into a chat request (the Responses and Anthropic APIs),
    naming the field the client sent: messages[i] -> origin[i] (the item or turn message i came from),
    then each (compiled pattern, replacement) of `renames`. A context that renames the ApiErrors raised
    within it (the chat parser's, the engine's refusal at submission); its `error` renames those the
    engine raises later, while it generates (Job's rename)."""

    def __init__(self, origin: list[str], renames: list):
        self.origin, self.renames = origin, renames

    def _text(self, text: str) -> str:
        return apply_renames(re.sub(r"\bmessages\[(\d+)\]", lambda m: self.origin[int(m.group(1))], text),
                             self.renames)

    def error(self, e: ApiError) -> ApiError:
        return ApiError(e.status, self._text(e.message), self._text(e.param) if e.param else None, e.code, e.type)

    def __enter__(self) -> "RenamedErrors":
        return self

    def __exit__(self, kind, e, tb) -> None:
        if isinstance(e, ApiError):
            raise self.error(e) from None


def from_value_error(e: ValueError, default_param: str | None, rename: dict | None = None,
                     mentions=()) -> ApiError:
    """Our ValueErrors start with the field name ('max_tokens: ...'): that becomes `param`, renamed by
    `rename` (the engine's name -> the client's); `mentions` (as RenamedErrors' renames) rewrite the message."""
    msg = str(e)
    head = msg.split(":", 1)[0].strip()
    param = head if names_a_field(e) else default_param
    if rename and param in rename:
        if param == head:   # the message names the field as the engine knows it: name the client's
            msg = rename[param] + msg[len(head):]
        param = rename[param]
    return bad(param, apply_renames(msg, mentions))


def _kind(v) -> str:
    return "null" if v is None else {bool: "boolean", str: "string", list: "array", dict: "object"}.get(
        type(v), "number" if isinstance(v, numbers.Real) else type(v).__name__)


class Fields:
    """Typed access to a JSON request body; fields never read are reported as unrecognized."""

    def __init__(self, body: dict, where: str = ""):
        if not isinstance(body, dict):
            raise bad(where or None, f"{where or 'request body'} must be a JSON object, got {_kind(body)}")
        self.body, self.where, self.seen = body, where, set()

    def _name(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str, default=None):
        self.seen.add(name)
        return self.body.get(name, default)

    def has(self, name: str) -> bool:
        return self.body.get(name) is not None

    def require(self, name: str):
        if self.body.get(name) is None:
            raise bad(self._name(name), f"Missing required parameter: '{self._name(name)}'")
        return self.get(name)

    def _type_error(self, name, want, v):
        return bad(self._name(name), f"'{self._name(name)}' must be {want}, got {_kind(v)} {short_repr(v)}")

    def _value(self, name, nullable):
        v = self.get(name)
        if v is None and not nullable and name in self.body:
            raise bad(self._name(name), f"'{self._name(name)}' must not be null")
        return v

    def int(self, name, default=None, lo=None, hi=None, nullable=True):
        v = self._value(name, nullable)
        if v is None:
            return default
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self._type_error(name, "an integer", v)
        self._range(name, v, lo, hi)
        return v

    def num(self, name, default=None, lo=None, hi=None, lo_open=False, nullable=True):
        v = self._value(name, nullable)
        if v is None:
            return default
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise self._type_error(name, "a number", v)
        if lo_open and lo is not None and v <= lo:
            raise bad(self._name(name), f"'{self._name(name)}' must be > {lo}, got {v}")
        self._range(name, v, lo, hi)
        return float(v)

    def bool(self, name, default=None, nullable=True):
        v = self._value(name, nullable)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._type_error(name, "a boolean", v)
        return v

    def str(self, name, default=None, nullable=True, nonempty=False):
        v = self._value(name, nullable)
        if v is None:
            return default

        if not isinstance(v, str):
            raise self._type_error(name, "a string", v)
        if nonempty and not v:
            raise bad(self._name(name), f"'{self._name(name)}' must not be empty")
        return v

    def obj(self, name, nullable=True) -> dict | None:
        v = self._value(name, nullable)
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self._type_error(name, "an object", v)
        return v

    def _range(self, name, v, lo, hi):
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            span = f"[{lo}, {hi}]" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
            raise bad(self._name(name), f"'{self._name(name)}' must be {span}, got {v}")

    def reject_unknown(self) -> None:
        for k in self.body:
            if k not in self.seen:
                raise bad(self._name(k), f"Unrecognized request argument supplied: {self._name(k)}")


def short_repr(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def parse_stop(f: Fields) -> list[str]:
    v = f.get("stop")
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or len(items) > MAX_STOP:
        raise bad("stop", f"'stop' must be a string or an array of at most {MAX_STOP} strings")
    for s in items:
        if not isinstance(s, str) or not s:
            raise bad("stop", "'stop' entries must be non-empty strings")
    return list(items)


def parse_token_ids(f: Fields, name: str, vocab_size: int) -> list[int]:
    v = f.get(name)
    if v is None:
        return []
    if not isinstance(v, list) or any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size
                                      for t in v):
        raise bad(name, f"'{name}' must be an array of token ids in [0, {vocab_size - 1}]")
    return list(v)


def parse_logit_bias(f: Fields, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's map of token ids (JSON object keys, so strings) to biases in [-100, 100]."""
    v = f.obj("logit_bias")
    if not v:
        return None
    bias = {}
    for k, b in v.items():
        # (the length first: int() refuses more than 4300 digits)
        if not (k.isascii() and k.isdigit()) or len(k) > 20 or not int(k) < vocab_size:
            raise bad("logit_bias", f"'logit_bias' keys must be token ids in [0, {vocab_size - 1}], got {short_repr(k)}")
        if not isinstance(b, numbers.Real) or isinstance(b, bool) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
            raise bad("logit_bias", f"'logit_bias' values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                                    f"{MAX_LOGIT_BIAS:g}], got {short_repr(b)} for token {k}")
        bias[int(k)] = float(b)
    return bias


def parse_stream(f: Fields) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous usage: vLLM's continuous_usage_stats, the usage so far in
    every chunk, with include_usage). OpenAI's include_obfuscation is taken and changes nothing."""
    stream = f.bool("stream", False)
    opts = f.obj("stream_options")
    if opts is None:
        return stream, False, False
    if not stream:
        raise bad("stream_options", "'stream_options' is only allowed when 'stream' is true")
    o = Fields(opts, "stream_options")
    include_usage = o.bool("include_usage", False)
    continuous = o.bool("continuous_usage_stats", False)
    o.bool("include_obfuscation")   # OpenAI's padding of chunks: none is added either way
    o.reject_unknown()
    return stream, include_usage, include_usage and continuous


def parse_common(f: Fields, vocab_size: int, max_tokens_names=("max_tokens",),
                 defaults: dict | None = None, best_of_over_n: bool = False) -> tuple[dict, int]:
    """The sampling fields both endpoints share -> (SamplingParams kwargs, priority). defaults: the
    model's recommended settings (Engine.default_sampling) for the fields a request leaves out.
    best_of_over_n: best_of may exceed n (legacy completions: it is kw["best_of"], n where not given, for
    them to take out); else it must equal n."""
    d = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, **(defaults or {})}
    kw = {
        "n": f.int("n", 1, 1, MAX_N),
        # (temperature and repetition_penalty within SamplingParams' bounds, far past OpenAI's temperature 2:
        # vLLM's has none)
        "temperature": f.num("temperature", d["temperature"], 0.0, None),
        "top_p": f.num("top_p", d["top_p"], 0.0, 1.0),
        "top_k": f.int("top_k", d["top_k"], -1, None) or 0,
        "min_p": f.num("min_p", d["min_p"], 0.0, 1.0),
        "presence_penalty": f.num("presence_penalty", 0.0, -2.0, 2.0),
        "frequency_penalty": f.num("frequency_penalty", 0.0, -2.0, 2.0),
        "repetition_penalty": f.num("repetition_penalty", d["repetition_penalty"], 0.0, None, lo_open=True),
        "stop": parse_stop(f),
        "stop_token_ids": parse_token_ids(f, "stop_token_ids", vocab_size),
        "ignore_eos": f.bool("ignore_eos", False),
        "skip_special_tokens": f.bool("skip_special_tokens", True),
        "spaces_between_special_tokens": f.bool("spaces_between_special_tokens", True),
        "include_stop_str_in_output": f.bool("include_stop_str_in_output", False),
        "min_tokens": f.int("min_tokens", 0, 0, None) or 0,
        "thinking_token_budget": f.int("thinking_token_budget", None, 0, None),
    }
    if kw["top_p"] == 0:   # OpenAI takes 0 (the smallest nucleus: the most likely token alone); SamplingParams
        kw["top_p"], kw["top_k"] = 1.0, 1   # wants (0, 1], so it is top_k 1
    kw["seed"] = f.int("seed", None, *INT64)
    max_tokens = None
    for name in max_tokens_names:  # the first one given wins (max_completion_tokens over max_tokens)
        v = f.int(name, None, 1, None)
        if v is not None and max_tokens is None:
            max_tokens = (name, v)
    kw["max_tokens"] = max_tokens
    if max_tokens and kw["min_tokens"] > max_tokens[1]:
        raise bad("min_tokens", f"'min_tokens' ({kw['min_tokens']}) must be <= {max_tokens[0]} ({max_tokens[1]})")
    best_of = f.int("best_of", None, 1, MAX_N)
    if best_of is not None and best_of < kw["n"]:
        raise bad("best_of", f"'best_of' ({best_of}) must be >= 'n' ({kw['n']})")
    if best_of is not None and best_of != kw["n"] and not best_of_over_n:
        raise bad("best_of", "'best_of' is only supported equal to 'n' here (legacy completions take more)")
    if best_of_over_n:
        kw["best_of"] = best_of or kw["n"]
    kw["logit_bias"] = parse_logit_bias(f, vocab_size)
    # (an empty list, and bad_words' values, are SamplingParams' to reject: make_params names the field)
    kw["allowed_token_ids"] = (None if f.get("allowed_token_ids") is None
                               else parse_token_ids(f, "allowed_token_ids", vocab_size))
    kw["bad_words"] = f.get("bad_words")
    kw["truncate_prompt_tokens"] = f.int("truncate_prompt_tokens", None, -1, None)
    if f.bool("use_beam_search", False):   # (vLLM's; false, its default, is taken)
        raise bad("use_beam_search", "'use_beam_search' is not supported: this server has no beam search")
    f.num("length_penalty")   # vLLM's, for beam search alone: without it, as there, it changes nothing
    f.str("user")
    f.str("service_tier")
    f.bool("store")
    check_metadata(f.obj("metadata"))
    priority = f.int("priority", 0, *INT32)
    return kw, priority


def check_metadata(meta: dict | None) -> None:
    """OpenAI's metadata (kept with a response, not used here): up to 16 pairs, keys of up to 64
    characters, string values of up to 512."""
    if meta is None:
        return
    if len(meta) > 16:
        raise bad("metadata", f"'metadata' may hold at most 16 pairs, got {len(meta)}")
    for k, v in meta.items():
        if len(k) > 64 or not isinstance(v, str) or len(v) > 512:
            raise bad("metadata", f"'metadata' keys must be at most 64 characters and values strings of at most "
                                  f"512, got {short_repr(k)}: {short_repr(v)}")


def check_model(f: Fields, served_names: list[str]) -> str:
    model = f.require("model")
    if not isinstance(model, str):
        raise bad("model", f"'model' must be a string, got {_kind(model)}")
    if model not in served_names:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves "
                            f"{', '.join(repr(n) for n in served_names)}", "model", "model_not_found")
    return model


def optional_model(f: Fields, served_names: list[str]) -> str:
    """vLLM's own routes (tokenize, score, rerank): 'model' may be left out, meaning the first served name."""
    return served_names[0] if f.get("model") is None else check_model(f, served_names)


CONTEXT_CODE = "context_length_exceeded"   # OpenAI's code for it, which clients test to shorten and retry


def check_context(max_model_len: int, prompt_len: int, max_tokens, prompt_param: str, what: str) -> None:
    """OpenAI's context-length errors, naming both counts, with OpenAI's code. max_tokens: (field name,
    value) or None."""
    if prompt_len >= max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                            f"{what} resulted in {prompt_len} tokens, leaving no room for the completion.",
                       prompt_param, CONTEXT_CODE)
    if max_tokens and prompt_len + max_tokens[1] > max_model_len:
        name, mt = max_tokens
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                            f"{prompt_len + mt} tokens ({prompt_len} in the {what}, {mt} in the completion). "
                            f"Please reduce the length of the {what} or completion.", name, CONTEXT_CODE)


def make_params(kw: dict, logprobs: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
    kw = dict(kw)
    mt = kw.pop("max_tokens")
    try:
        return SamplingParams(max_tokens=mt[1] if mt else None, logprobs=logprobs,
                              prompt_logprobs=prompt_logprobs, **kw)
    except ValueError as e:
        raise from_value_error(e, None) from None


__all__ = ["ApiError", "Fields", "MAX_LOGPROBS", "bad", "check_context", "check_model", "from_value_error",
           "make_params", "parse_common", "parse_stream", "short_repr"]

"""Per-request sampling parameters (vLLM's names and defaults)."""

from __future__ import annotations

import dataclasses
import enum
import numbers
from dataclasses import dataclass

from .structured.params import StructuredOutputsParams, as_structured_outputs

GREEDY_EPS = 1e-5  # temperature below this means greedy (argmax)
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on a logit_bias value
# temperature's bound, and repetition_penalty's both ways (vLLM has none): past it the float32 logits the samplers
# divide or multiply overflow to inf and NaN, and a masked token could be drawn; the distribution is long flat there
MAX_SCALE = 1e6


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _fail(name: str, what: str, value) -> None:
    raise ValueError(f"{name}: {what}, got {value!r}")


class RequestOutputKind(enum.Enum):
    """What each RequestOutput of a request holds (vLLM's): step() and AsyncEngine honour it; Engine.generate
    returns the whole outputs whatever it is."""
    CUMULATIVE = 0   # the text, token ids and logprobs so far
    DELTA = 1        # only what is new since the last output (the prompt logprobs in the first)
    FINAL_ONLY = 2   # one output, once the request finished


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None  # -1: none (vLLM's)
    stop: str | list[str] | None = None  # normalised to list[str]
    stop_token_ids: list[int] | None = None  # normalised to list[int]
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to the context limit (or the KV pool's size when smaller)
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True  # False: token ids alone (text "", logprobs' decoded_token None), as vLLM's
    skip_special_tokens: bool = True
    # special tokens written into the text even with skip_special_tokens (llama.cpp's preserved
    # tokens): the server's tool-call markers, e.g. Mistral's [TOOL_CALLS], which its parser reads
    preserved_token_ids: list[int] | None = None  # normalised to list[int]
    # vLLM's; tokens are joined as their bytes (vLLM's fast detokenizer path), which puts no space
    # between special tokens either way, so it changes nothing here
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | dict | None = None  # json / regex / choice / grammar
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit; normalised, {} -> None
    allowed_token_ids: list[int] | None = None  # only these may be sampled (vLLM's); non-empty
    bad_words: list[str] | None = None  # words the output must not contain (vLLM's); normalised to a list
    truncate_prompt_tokens: int | None = None  # keep the prompt's last k tokens (-1: max_model_len)
    # vLLM's: the reasoning block (<think> ... </think>) ends after this many tokens (thinking_budget.py)
    thinking_token_budget: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            _fail("n", "must be an int >= 1", self.n)
        if self.best_of is not None and (not _is_int(self.best_of) or self.best_of != self.n):
            _fail("best_of", f"only None or equal to n ({self.n}) is supported", self.best_of)

        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2.0 <= v <= 2.0:
                _fail(name, "must be in [-2, 2]", v)
        rp = self.repetition_penalty
        if not _is_real(rp) or not 1 / MAX_SCALE <= rp <= MAX_SCALE:
            _fail("repetition_penalty", f"must be a number in [{1 / MAX_SCALE:g}, {MAX_SCALE:g}]", rp)
        t = self.temperature
        if not _is_real(t) or not 0 <= t <= MAX_SCALE:
            _fail("temperature", f"must be a number in [0, {MAX_SCALE:g}]", t)
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            _fail("top_p", "must be in (0, 1]", self.top_p)
        if not _is_int(self.top_k) or self.top_k < -1:
            _fail("top_k", "must be an int >= -1 (0 or -1 disables)", self.top_k)
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            _fail("min_p", "must be in [0, 1]", self.min_p)
        if self.seed is not None and not _is_int(self.seed):
            _fail("seed", "must be an int or None", self.seed)
        if self.seed == -1:   # vLLM's "no seed", which OpenAI clients send too
            self.seed = None

        stop = self.stop
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        elif isinstance(stop, (list, tuple)):
            stop = list(stop)
        else:
            _fail("stop", "must be a str, a list of str or None", stop)
        for s in stop:
            if not isinstance(s, str) or not s:
                _fail("stop", "stop strings must be non-empty strings", s)
        self.stop = stop

        self.stop_token_ids = _token_ids("stop_token_ids", [] if self.stop_token_ids is None else self.stop_token_ids)
        self.preserved_token_ids = _token_ids("preserved_token_ids",
                                              [] if self.preserved_token_ids is None else self.preserved_token_ids)

        for name in ("ignore_eos", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
                     "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, "must be a bool", getattr(self, name))
        if self.stop and not self.detokenize:
            _fail("stop", "stop strings need detokenize=True (stop_token_ids do not)", self.stop)

        mt = self.max_tokens
        if mt is not None and (not _is_int(mt) or mt < 1):
            _fail("max_tokens", "must be an int >= 1 or None", mt)
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            _fail("min_tokens", "must be an int >= 0", self.min_tokens)
        if mt is not None and self.min_tokens > mt:
            _fail("min_tokens", f"must be <= max_tokens ({mt})", self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is True:   # vLLM's: the sampled (or prompt) token and the most likely one
                setattr(self, name, 1)
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or not 0 <= v <= MAX_LOGPROBS):
                _fail(name, f"must be an int in [0, {MAX_LOGPROBS}] or None", v)
        self.structured_outputs = as_structured_outputs(self.structured_outputs)
        self.logit_bias = _logit_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _token_ids("allowed_token_ids", self.allowed_token_ids, nonempty=True)
        words = [] if self.bad_words is None else self.bad_words
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, str) and w.strip() for w in words):
            _fail("bad_words", "must be a list of non-blank strings or None", self.bad_words)
        self.bad_words = list(words)
        k = self.truncate_prompt_tokens
        if k is not None and (not _is_int(k) or not (k >= 1 or k == -1)):
            _fail("truncate_prompt_tokens", "must be an int >= 1, -1 (the context length) or None", k)
        b = self.thinking_token_budget
        if b is not None and (not _is_int(b) or b < 0):
            _fail("thinking_token_budget", "must be an int >= 0 or None", b)
        if not isinstance(self.output_kind, RequestOutputKind):
            _fail("output_kind", "must be a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY)", self.output_kind)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """Repetition, frequency or presence penalty: sampling reads the tokens so far."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def clone(self, **overrides) -> "SamplingParams":
        """A copy (its lists and dicts too), checked as construction checks: a field set since then
        to a bad value is a ValueError naming it."""
        base = {name: _copied(getattr(self, name)) for name in
                ("stop", "stop_token_ids", "preserved_token_ids", "logit_bias", "allowed_token_ids", "bad_words")}
        base.update(overrides)
        return dataclasses.replace(self, **base)


def _copied(value):
    return list(value) if isinstance(value, (list, tuple)) else dict(value) if isinstance(value, dict) else value


def _token_ids(name: str, ids, nonempty: bool = False) -> list[int]:
    """A list of token ids (ints >= 0) as plain ints."""
    if not isinstance(ids, (list, tuple)) or (nonempty and not ids):
        _fail(name, f"must be a {'non-empty ' if nonempty else ''}list of int or None", ids)
    for i in ids:
        if not _is_int(i) or i < 0:
            _fail(name, "token ids must be ints >= 0", i)
    return [int(i) for i in ids]


def _logit_bias(bias) -> dict[int, float] | None:
    """{token id (int >= 0): bias in [-100, 100]} as ints and floats; None or {} -> None."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        _fail("logit_bias", "must be a dict of token id -> bias or None", bias)
    out = {}
    for k, v in bias.items():
        if not _is_int(k) or k < 0:
            _fail("logit_bias", "token ids must be ints >= 0", k)
        if not _is_real(v) or not -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS:
            _fail("logit_bias", f"biases must be numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]", v)
        out[int(k)] = float(v)
    return out or None


def truncate_prompt(ids: list[int], k: int | None, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens: a prompt's last k tokens (-1: the last max_model_len; None: all)."""
    if k is None:
        return ids
    k = max_model_len if k == -1 else k
    return ids[-k:] if len(ids) > k else ids

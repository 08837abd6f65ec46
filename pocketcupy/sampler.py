"""Batched NumPy sampler over a [B, V] float32 logits matrix.

Logprob representation (vLLM's): one ``dict[int, Logprob]`` per position, for
generated tokens and prompt tokens alike. The dict holds the top-k tokens in
descending logprob order (ranks 1..k) followed by the actual token when it is
not among them; the actual token's ``rank`` is always 1 + the number of tokens
with a strictly higher logprob. Logprobs come from the model logits after the
request's ``logit_bias`` and the ``allowed_mask`` but before penalties/temperature/
min-p/top-k/top-p (vLLM v1's default "raw" logprobs; vLLM applies the grammar bitmask
before the sampler too; a biased token's logprob shows the bias, as OpenAI's do).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .sampling import SamplingParams


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None  # filled in later by the engine


PositionLogprobs = dict[int, Logprob]


def make_generator(seed: int | None = None) -> np.random.Generator:
    """Any int seed (vLLM takes negative ones too) as NumPy's non-negative seed: seed mod 2**64."""
    return np.random.default_rng(None if seed is None else int(seed) % 2**64)


@dataclass
class SamplingRow:
    """One request's state for a sampling step. Keep it (and its generator)
    alive across steps: a fresh generator from the seed would repeat draws."""

    params: SamplingParams
    prompt_ids: Sequence[int] | np.ndarray = ()
    output_ids: Sequence[int] | np.ndarray = field(default_factory=list)
    generator: np.random.Generator | None = None  # None: make_generator(params.seed)
    allowed_mask: np.ndarray | None = None  # bool [V]; False -> token forbidden
    packed_mask: np.ndarray | None = None  # uint32 [ceil(V/32)]: bit j of word w allows token 32w+j
    banned_ids: Sequence[int] = ()  # forbidden this step (bad words), like min_tokens' stop tokens

    def __post_init__(self) -> None:
        if self.generator is None:
            self.generator = make_generator(self.params.seed)


@dataclass
class SamplerOutput:
    token_ids: np.ndarray  # [B] int64
    logprobs: list[PositionLogprobs | None]  # None where params.logprobs is None


class PendingSample:
    """A sampling step launched on the backend. `tokens`: the sampled ids (int32 [B]; a device
    array on CUDA, possibly strided) for the next step's inputs before they reach the host;
    result() waits for the host copy."""

    def __init__(self, tokens, result):
        self.tokens = tokens
        self._result = result

    def result(self) -> SamplerOutput:
        return self._result()


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    s = x - m
    with np.errstate(divide="ignore"):
        return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0))
    return e / e.sum(axis=-1, keepdims=True)


def unpack_mask(words: np.ndarray, V: int) -> np.ndarray:
    """uint32 [ceil(V/32)] packed bits (bit j of word w = token 32w + j) -> bool [V]."""
    w = np.asarray(words).reshape(-1)
    if w.shape[0] != (V + 31) // 32:
        raise ValueError(f"packed_mask: expected {(V + 31) // 32} words for {V} tokens, got {w.shape[0]}")
    return np.unpackbits(w.astype("<u4").view(np.uint8), bitorder="little")[:V].astype(bool)


def logit_bias_entries(rows: Sequence[SamplingRow], V: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The rows' params.logit_bias as (row indices, token ids, biases) arrays; None where no row has one."""
    biased = [(i, r.params.logit_bias) for i, r in enumerate(rows) if r.params.logit_bias]
    if not biased:
        return None
    rows_idx = np.concatenate([np.full(len(b), i, np.int64) for i, b in biased])
    ids = np.concatenate([np.fromiter(b, np.int64, len(b)) for _, b in biased])
    vals = np.concatenate([np.fromiter(b.values(), np.float32, len(b)) for _, b in biased])
    if ids.max() >= V:
        raise ValueError(f"logit_bias: token id {ids.max()} is outside the vocabulary (0..{V - 1})")
    return rows_idx, ids, vals


def apply_logit_bias(logits: np.ndarray, rows: Sequence[SamplingRow]) -> None:
    """Each row's params.logit_bias added to its logits (before everything else, so the masks,
    the penalties and the returned logprobs see the biased logits)."""
    entries = logit_bias_entries(rows, logits.shape[1])
    if entries is not None:
        rows_idx, ids, vals = entries
        logits[rows_idx, ids] += vals


def apply_allowed_mask(logits: np.ndarray, rows: Sequence[SamplingRow]) -> None:
    V = logits.shape[1]
    for i, r in enumerate(rows):
        if r.allowed_mask is None and r.packed_mask is None:
            continue
        mask = np.ones(V, dtype=bool) if r.allowed_mask is None else np.asarray(r.allowed_mask, dtype=bool)
        if r.packed_mask is not None:
            mask = mask & unpack_mask(r.packed_mask, V)
        if not mask.any():
            raise ValueError(f"allowed_mask of row {i} allows no token")
        logits[i, ~mask] = -np.inf


def suppressed_tokens(row: SamplingRow, eos_token_ids: Sequence[int], V: int) -> list[int]:
    """The tokens a row forbids this step after the logprobs are taken: its banned_ids, and its stop
    tokens (and eos, unless ignore_eos) while len(output) < min_tokens."""
    ids = list(row.banned_ids)
    if len(row.output_ids) < row.params.min_tokens:
        ids += min_tokens_stops(row.params, eos_token_ids)
    return [t for t in ids if 0 <= t < V]


def min_tokens_stops(p, eos_token_ids: Sequence[int]) -> list[int]:
    """The tokens min_tokens forbids until it is reached: the stop tokens, and eos unless ignore_eos."""
    return list(p.stop_token_ids or ()) + ([] if p.ignore_eos else list(eos_token_ids))


def apply_suppressed(logits: np.ndarray, rows: Sequence[SamplingRow], eos_token_ids: Iterable[int]) -> None:
    """suppressed_tokens of each row set to -inf."""
    eos = list(eos_token_ids)
    for i, r in enumerate(rows):
        ids = suppressed_tokens(r, eos, logits.shape[1])
        if ids:
            logits[i, ids] = -np.inf


def has_constraints(row: SamplingRow) -> bool:
    """Whether the row's masks or suppressed tokens (bad words, min_tokens' stops) might forbid every token."""
    return (row.allowed_mask is not None or row.packed_mask is not None or len(row.banned_ids) > 0
            or len(row.output_ids) < row.params.min_tokens)


def no_token_left(row: SamplingRow) -> ValueError:
    """The error of a row whose constraints forbid every token this step, naming the request's fields that
    do; the first (the server's 400 names it as param) is one that forbids tokens this step, if any does."""
    fields = [name for name, on in (("bad_words", len(row.banned_ids) > 0),
                                    ("min_tokens", len(row.output_ids) < row.params.min_tokens),
                                    ("structured_outputs", row.packed_mask is not None),
                                    ("allowed_token_ids", row.allowed_mask is not None)) if on]
    together = f"with {', '.join(fields[1:])}, " if len(fields) > 1 else ""
    return ValueError(f"{fields[0]}: {together}it forbids every token after {len(row.output_ids)} generated "
                      "tokens (no token can be sampled)")


def check_token_left(logits: np.ndarray, rows: Sequence[SamplingRow]) -> None:
    """no_token_left() for the first row with constraints whose logits (masked) are all -inf: sampling it
    would draw from NaN probabilities."""
    for i, r in enumerate(rows):
        if has_constraints(r) and logits[i].max() == -np.inf:
            raise no_token_left(r)


def apply_penalties(logits: np.ndarray, rows: Sequence[SamplingRow]) -> None:
    """Repetition penalty over prompt+output (HF/vLLM), then frequency/presence over output."""
    V = logits.shape[1]
    for i, r in enumerate(rows):
        p = r.params
        if not p.has_penalties:
            continue
        out = np.asarray(r.output_ids, dtype=np.int64)
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.concatenate([np.asarray(r.prompt_ids, dtype=np.int64), out]))
            seen = seen[(seen >= 0) & (seen < V)]
            x = logits[i, seen]
            logits[i, seen] = np.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
        if (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0) and out.size:
            counts = np.bincount(out[(out >= 0) & (out < V)], minlength=V)[:V].astype(np.float32)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


def apply_top_k(logits: np.ndarray, top_k: np.ndarray) -> np.ndarray:
    """Keep tokens whose logit >= the k-th largest (ties at the threshold kept); k <= 0 disables."""
    V = logits.shape[1]
    k = np.where((top_k <= 0) | (top_k >= V), V, top_k).astype(np.int64)
    if (k == V).all():
        return logits
    kth = np.take_along_axis(-np.sort(-logits, axis=1), (k - 1)[:, None], axis=1)
    return np.where(logits < kth, -np.inf, logits)


def apply_top_p(logits: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Keep the smallest highest-probability set whose mass >= top_p: a token stays
    when the mass of the tokens ranked strictly before it is < top_p."""
    active = top_p < 1.0
    if not active.any():
        return logits
    probs = softmax(logits.astype(np.float64))
    order = np.argsort(-probs, axis=1, kind="stable")
    sp = np.take_along_axis(probs, order, axis=1)
    keep_sorted = (np.cumsum(sp, axis=1) - sp) < top_p[:, None]
    keep_sorted[:, 0] = True
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    keep |= ~active[:, None]
    return np.where(keep, logits, -np.inf)


def apply_min_p(logits: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """Drop tokens with prob < min_p * max prob (compared in logit space)."""
    if not (min_p > 0).any():
        return logits
    with np.errstate(divide="ignore"):
        floor = logits.max(axis=1, keepdims=True) + np.log(min_p)[:, None]
    return np.where(logits >= floor, logits, -np.inf)


def _position_logprobs(lp: np.ndarray, token: int, k: int) -> PositionLogprobs:
    """lp: [V] log-probabilities of one position."""
    out: PositionLogprobs = {}
    k = min(k, lp.shape[0])
    if k > 0:
        idx = np.argpartition(-lp, k - 1)[:k]
        idx = idx[np.lexsort((idx, -lp[idx]))]
        for j, t in enumerate(idx.tolist()):
            out[t] = Logprob(float(lp[t]), j + 1)
    token = int(token)
    out[token] = Logprob(float(lp[token]), int((lp > lp[token]).sum()) + 1)
    return out


def prompt_logprobs(logits: np.ndarray, prompt_ids: Sequence[int], k: int) -> list[PositionLogprobs | None]:
    """vLLM semantics: entry 0 is None; entry i describes prompt_ids[i] under logits[i-1]."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        return []
    if logits.shape[0] < len(ids) - 1:
        raise ValueError(f"need >= {len(ids) - 1} logits rows, got {logits.shape[0]}")
    lp = log_softmax(np.asarray(logits[: len(ids) - 1], dtype=np.float32))
    return [None] + [_position_logprobs(lp[i - 1], ids[i], k) for i in range(1, len(ids))]


class Sampler:
    def __init__(self, eos_token_ids: Iterable[int] = ()):
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)

    def launch(self, logits: np.ndarray, rows: Sequence[SamplingRow]) -> PendingSample:
        """The NumPy sampler is synchronous: the result is ready at once."""
        out = self(logits, rows)
        return PendingSample(out.token_ids.astype(np.int32), lambda: out)

    def __call__(
        self,
        logits: np.ndarray,
        rows: Sequence[SamplingRow],
        eos_token_ids: Iterable[int] | None = None,
    ) -> SamplerOutput:
        logits = np.array(logits, dtype=np.float32, copy=True)
        if logits.ndim != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [B={len(rows)}, V], got {logits.shape}")
        B = logits.shape[0]
        eos = self.eos_token_ids if eos_token_ids is None else tuple(eos_token_ids)

        apply_logit_bias(logits, rows)
        apply_allowed_mask(logits, rows)
        lp_rows = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        raw_lp = log_softmax(logits[lp_rows]) if lp_rows else None
        apply_suppressed(logits, rows, eos)
        check_token_left(logits, rows)
        apply_penalties(logits, rows)

        token_ids = np.empty(B, dtype=np.int64)
        greedy = np.array([r.params.greedy for r in rows], dtype=bool)
        if greedy.any():
            token_ids[greedy] = logits[greedy].argmax(axis=1)
        rnd = np.flatnonzero(~greedy)
        if rnd.size:
            ps = [rows[i].params for i in rnd]
            x = logits[rnd] / np.array([p.temperature for p in ps], dtype=np.float32)[:, None]
            # vLLM v1's order: min-p, then top-k, then top-p over what is left
            x = apply_min_p(x, np.array([p.min_p for p in ps], dtype=np.float64))
            # (a top_k past the vocabulary disables it; clamped first, as it may not fit an int64)
            x = apply_top_k(x, np.array([min(p.top_k, x.shape[1]) for p in ps], dtype=np.int64))
            x = apply_top_p(x, np.array([p.top_p for p in ps], dtype=np.float64))
            probs = softmax(x.astype(np.float64))
            # Exponential race: argmax(p_i / E_i), E_i ~ Exp(1), picks i with prob p_i.
            draws = np.stack([rows[i].generator.standard_exponential(x.shape[1]) for i in rnd])
            token_ids[rnd] = (probs / draws).argmax(axis=1)

        logprobs: list[PositionLogprobs | None] = [None] * B
        for j, i in enumerate(lp_rows):
            logprobs[i] = _position_logprobs(raw_lp[j], token_ids[i], rows[i].params.logprobs)
        return SamplerOutput(token_ids=token_ids, logprobs=logprobs)

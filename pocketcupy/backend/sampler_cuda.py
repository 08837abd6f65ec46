"""Batched sampling on the device (cuda_src/sampling.cu): the CUDA twin of pocketcupy.sampler.

`CudaSampler(eos_token_ids)(logits, rows)` takes device logits [B, V] float32 and the same
`SamplingRow`s as the NumPy `Sampler`, and returns the same `SamplerOutput`. Per step it makes
one host->device copy (row parameters, token-id lists for penalties, packed allowed-masks), one
kernel launch (one block per row), and one device->host copy of [B, SO_WORDS] int32 (token ids,
top-N logprobs, sampled-token logprob and rank); inside a decode graph (`graph_params`,
`sample_rows_at`, backend/graphs.py) the parameters travel with the graph's inputs and the kernel is
part of the graph, so only the copy down is left. Random rows draw a 64-bit seed from their numpy
Generator each step, so a request seed gives the same tokens run to run (not the NumPy sampler's
tokens: only the distribution is shared). Imports cupy lazily."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..sampler import (Logprob, PendingSample, PositionLogprobs, SamplerOutput, SamplingRow, logit_bias_entries,
                       no_token_left, suppressed_tokens, unpack_mask)
from .kernels import cuda_op, kernel
from .pinned_upload import upload

SRC = "sampling.cu"
NT = 1024
LP_MAX = 20
# Row parameter words (SP_* in sampling.cu).
SP_FLAGS, SP_TOPK, SP_NLP, SP_MASK, SP_SEED, SP_TEMP, SP_REP, SP_FREQ = 0, 1, 2, 3, 4, 6, 7, 8
SP_PRES, SP_TOPP, SP_MINP, SP_PROMPT, SP_OUTPUT, SP_SUPP, SP_CNT, SP_WORDS = 9, 11, 13, 15, 17, 19, 21, 24
F_GREEDY, F_EDITS, F_LOGPROBS, F_FREQPRES = 1, 2, 4, 8
# Output words (SO_* in sampling.cu).
SO_TOK, SO_LP, SO_RANK, SO_N, SO_IDS, SO_LPS, SO_MINKEPT, SO_KEPT, SO_WORDS = 0, 1, 2, 3, 4, 24, 44, 45, 48


def _cp():
    import cupy

    return cupy


def _out(out, shape, dtype):
    cp = _cp()
    if out is None:
        return cp.empty(shape, dtype=dtype)
    if out.shape != tuple(shape) or out.dtype != np.dtype(dtype) or not out.flags.c_contiguous:
        raise ValueError(f"out: expected contiguous {np.dtype(dtype)} {tuple(shape)}, got {out.dtype} {out.shape}")
    return out


def _rows_f32(x):
    cp = _cp()
    x = cp.asarray(x)
    if x.ndim != 2 or x.dtype != cp.float32:
        raise ValueError(f"logits: expected float32 [B, V], got {x.dtype} {x.shape}")
    if x.strides[1] != 4 or x.strides[0] % 4:
        x = cp.ascontiguousarray(x)
    return x, np.int64(x.strides[0] // 4)


@cuda_op("argmax")
def argmax(logits, out=None):
    """First index of the row maximum, int32 [B]."""
    x, ld = _rows_f32(logits)
    B, V = x.shape
    out = _out(out, (B,), np.int32)
    if B:
        kernel(SRC, "argmax_rows_f32")((B,), (NT,), (x, ld, np.int32(V), out))
    return out


@cuda_op("topk_logprobs")
def topk_logprobs(logits, token_ids, n: int, out=None):
    """Raw log-softmax of each row: the top-n (n <= 20) ids/logprobs and token_ids[row]'s logprob
    and rank, packed as [B, SO_WORDS] int32 (decode with `decode_logprobs`)."""
    cp = _cp()
    x, ld = _rows_f32(logits)
    B, V = x.shape
    if not 0 <= n <= LP_MAX:
        raise ValueError(f"n: must be in [0, {LP_MAX}], got {n}")
    ids = cp.ascontiguousarray(cp.asarray(token_ids, dtype=cp.int32).reshape(B))
    out = _out(out, (B, SO_WORDS), np.int32)
    if B:
        kernel(SRC, "topk_logprobs_f32")((B,), (NT,), (x, ld, np.int32(V), ids, np.int32(min(n, V)), out))
    return out


@cuda_op("sample_rows")
def sample_rows(logits, params, toks, masks, mask_words: int, work, cnt, out=None):
    """The fused sampler kernel. params: int32 [B, SP_WORDS] (device); toks: int32 token lists;
    masks: uint32 [M, mask_words] packed allowed bits (bit j of word w = token 32w + j);
    work: float32 [B, >= V] scratch; cnt: int32 [C, >= V] scratch (rows named by SP_CNT)."""
    x, ld = _rows_f32(logits)
    B, V = x.shape
    out = _out(out, (B, SO_WORDS), np.int32)
    if B:
        kernel(SRC, "sample_rows_f32")((B,), (NT,), (
            x, ld, np.int32(V), params, toks, masks, np.int64(mask_words),
            work, np.int64(work.shape[1]), cnt, np.int64(cnt.shape[1]), out))
    return out


@cuda_op("sample_rows_at")
def sample_rows_at(logits, params, work, out_at) -> None:
    """sample_rows for rows without token lists or masks, writing [B, SO_WORDS] int32 to the device
    address held in out_at (int64 [1]) when it runs: the launch a decode graph captures."""
    x, ld = _rows_f32(logits)
    B, V = x.shape
    if (params.dtype != np.int32 or params.size < B * SP_WORDS or out_at.dtype != np.int64
            or work.shape[0] < B or work.shape[1] < V):
        raise TypeError(f"sample_rows_at: params int32 [>= {B}, {SP_WORDS}], work [>= {B}, >= {V}] and out_at "
                        f"int64, got {params.dtype} {params.shape}, {work.shape}, {out_at.dtype}")
    if B:
        kernel(SRC, "sample_rows_at_f32")((B,), (NT,), (
            x, ld, np.int32(V), params, params, params, np.int64(0),
            work, np.int64(work.shape[1]), params, np.int64(0), out_at))


@cuda_op("philox4x32")
def philox4x32(counters, key: int, out=None):
    """Philox 4x32-10 of uint32 counters [N, 4] under a 64-bit key (RNG known-answer tests)."""
    cp = _cp()
    c = cp.ascontiguousarray(cp.asarray(counters, dtype=cp.uint32))
    n = c.shape[0]
    out = _out(out, (n, 4), np.uint32)
    if n:
        kernel(SRC, "philox4x32_fill")(((n + 255) // 256,), (256,), (
            c, np.uint32(key & 0xFFFFFFFF), np.uint32(key >> 32), out, np.int32(n)))
    return out


# ---- host side ------------------------------------------------------------------------------

def pack_mask(mask: np.ndarray, V: int) -> np.ndarray:
    """bool [V] -> uint32 [ceil(V/32)], bit j of word w = token 32w + j (1 = allowed)."""
    m = np.asarray(mask, dtype=bool).reshape(-1)
    if m.shape[0] != V:
        raise ValueError(f"allowed_mask: expected {V} entries, got {m.shape[0]}")
    b = np.packbits(m, bitorder="little")
    b = np.concatenate([b, np.zeros(-len(b) % 4, np.uint8)])
    return b.view("<u4")


def _row_mask_words(row: SamplingRow, V: int, W: int) -> np.ndarray | None:
    """The row's allowed tokens as W packed words (its packed_mask as given, and-ed with its bool
    allowed_mask when it has both), or None when it has no mask."""
    if row.packed_mask is None:
        return None if row.allowed_mask is None else pack_mask(row.allowed_mask, V)
    m = np.asarray(row.packed_mask).reshape(-1)
    if m.shape[0] != W or m.dtype.itemsize != 4:
        raise ValueError(f"packed_mask: expected {W} 32-bit words for {V} tokens, got {m.dtype} {m.shape}")
    m = m.view(np.uint32)
    return m if row.allowed_mask is None else m & pack_mask(row.allowed_mask, V)


def _leaves_a_token(words: np.ndarray, suppressed: Sequence[int], V: int) -> bool:
    """Whether the packed allowed bits allow a token outside `suppressed` (the logits, and a logit bias's,
    are finite: only masks and suppressed tokens make a logit -inf)."""
    allowed = unpack_mask(words, V)
    allowed[suppressed] = False
    return bool(allowed.any())


def _ids(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64).reshape(-1).astype(np.int32)  # via int64: no silent wrap of ints


def _prompt_ids(row: SamplingRow) -> np.ndarray:
    """The prompt as int32, cached on the row (prompts are long and do not change)."""
    p = row.prompt_ids
    c = row.__dict__.get("_cuda_prompt")
    if c is None or c[0] is not p or c[1] != len(p):
        c = (p, len(p), _ids(p))
        row.__dict__["_cuda_prompt"] = c
    return c[2]


def in_graph(row: SamplingRow, eos: Sequence[int], V: int) -> bool:
    """Whether the row samples without token lists, masks or a logit bias (sample_rows_at can)."""
    p = row.params
    return (not p.logit_bias and p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0
            and p.presence_penalty == 0.0 and row.allowed_mask is None and row.packed_mask is None
            and not suppressed_tokens(row, eos, V))


class PackedBatch:
    """One upload: row parameters, token lists, packed masks (int32 views of one buffer)."""

    def __init__(self, rows: Sequence[SamplingRow], V: int, eos: Sequence[int]):
        B = len(rows)
        W = (V + 31) // 32
        self.mask_words = W
        ints = np.zeros((B, SP_WORDS), np.int32)
        # per-row values gathered in Python lists, written to their columns once at the end
        flags_col, mask_col, cnt_col = [0] * B, [-1] * B, [-1] * B
        temps, reps, freqs = [1.0] * B, [1.0] * B, [0.0] * B
        pres, top_p, min_p = [0.0] * B, [0.0] * B, [0.0] * B
        seeds = [0] * B
        lists: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        pos = 0
        n_cnt = 0

        def put(i, word, ids):
            nonlocal pos
            ints[i, word], ints[i, word + 1] = pos, len(ids)
            if len(ids):
                lists.append(ids)
                pos += len(ids)

        for i, r in enumerate(rows):
            p = r.params
            flags = 0
            m = _row_mask_words(r, V, W)
            supp = suppressed_tokens(r, eos, V)
            if m is not None:
                if not m.any():
                    raise ValueError(f"allowed_mask of row {i} allows no token")
                if supp and not _leaves_a_token(m, supp, V):   # (the kernel would sample from an all -inf row)
                    raise no_token_left(r)
                mask_col[i] = len(masks)
                masks.append(m)
            if p.greedy:
                flags |= F_GREEDY
            else:
                temps[i] = p.temperature
                k = p.top_k
                if 0 < k < V:
                    ints[i, SP_TOPK] = k
                top_p[i], min_p[i] = p.top_p, p.min_p
                seeds[i] = int(r.generator.integers(2**63))
            if p.logprobs is not None:
                flags |= F_LOGPROBS
                ints[i, SP_NLP] = min(p.logprobs, V)
            fp = (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0) and len(r.output_ids) > 0
            rp = p.repetition_penalty != 1.0
            if rp or fp or supp:
                flags |= F_EDITS
                reps[i] = p.repetition_penalty
                put(i, SP_PROMPT, _prompt_ids(r) if rp else ())
                put(i, SP_OUTPUT, _ids(r.output_ids) if (rp or fp) else ())
                put(i, SP_SUPP, np.asarray(supp, np.int32))
            if fp:
                flags |= F_FREQPRES
                freqs[i], pres[i] = p.frequency_penalty, p.presence_penalty
                cnt_col[i] = n_cnt
                n_cnt += 1
            flags_col[i] = flags
        ints[:, SP_FLAGS] = flags_col
        ints[:, SP_MASK] = mask_col
        ints[:, SP_CNT] = cnt_col
        ints[:, SP_TEMP] = np.array(temps, np.float32).view(np.int32)
        ints[:, SP_REP] = np.array(reps, np.float32).view(np.int32)
        ints[:, SP_FREQ] = np.array(freqs, np.float32).view(np.int32)
        dw = np.array([pres, top_p, min_p], np.float64).T.copy().view(np.int32).reshape(B, 3, 2)  # low word first
        ints[:, SP_PRES:SP_PRES + 2] = dw[:, 0]
        ints[:, SP_TOPP:SP_TOPP + 2] = dw[:, 1]
        ints[:, SP_MINP:SP_MINP + 2] = dw[:, 2]
        ints[:, SP_SEED:SP_SEED + 2] = np.array(seeds, np.uint64).view(np.int32).reshape(B, 2)
        parts = [ints.reshape(-1)] + [np.asarray(a, np.int32) for a in lists] + \
                [np.asarray(m).view(np.int32) for m in masks]
        self.host = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self.n_params, self.n_toks, self.n_masks = B * SP_WORDS, pos, len(masks)
        self.n_cnt = n_cnt

    def upload(self):
        """(params, toks, masks) device views of one uploaded buffer."""
        cp = _cp()
        dev = upload(np.concatenate([self.host, np.zeros(1, np.int32)]))  # never empty views
        a, b = self.n_params, self.n_params + self.n_toks
        masks = dev[b:b + self.n_masks * self.mask_words].view(cp.uint32)
        return dev[:a], dev[a:b + 1], masks if self.n_masks else dev[-1:].view(cp.uint32)


def decode_logprobs(row: np.ndarray, token: int) -> PositionLogprobs:
    """One output row [SO_WORDS] int32 -> vLLM-style dict (top-N in order, then the token)."""
    f = row.view(np.float32)
    d: PositionLogprobs = {}
    for j in range(int(row[SO_N])):
        d[int(row[SO_IDS + j])] = Logprob(float(f[SO_LPS + j]), j + 1)
    d[int(token)] = Logprob(float(f[SO_LP]), int(row[SO_RANK]))
    return d


class CudaSampler:
    """Device twin of pocketcupy.sampler.Sampler (same call, same SamplerOutput)."""

    def __init__(self, eos_token_ids: Iterable[int] = ()):
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self._work = None
        self._cnt = None
        self._pinned = [None, None]  # host buffers of the results, alternating: one step may be in flight
        self._turn = 0
        # Side streams keep the copies off the path from one decode step's logits to the next
        # step's input ids: parameters go up while the forward still runs, results come down
        # while the next forward already does.
        self._up = self._down = None
        self._sampled = None         # event after the last sampler kernel (the readers of `_up`'s uploads)
        self.last_raw: np.ndarray | None = None  # the last [B, SO_WORDS] result (tests, debugging)

    def _scratch(self, name: str, rows: int, V: int, dtype):
        """A [>= rows, V] scratch buffer kept across steps (grown, never shrunk)."""
        buf = getattr(self, name)
        if buf is None or buf.shape[1] != V or buf.shape[0] < rows:
            keep = buf.shape[0] if buf is not None and buf.shape[1] == V else 0
            buf = _cp().empty((max(rows, keep, 1), V), dtype=dtype)
            setattr(self, name, buf)
        return buf

    def __call__(self, logits, rows: Sequence[SamplingRow], eos_token_ids: Iterable[int] | None = None) -> SamplerOutput:
        return self.launch(logits, rows, eos_token_ids).result()

    def _host_buffer(self, nbytes: int) -> np.ndarray:
        """The next of the two pinned result buffers, at least nbytes (uint8)."""
        cp = _cp()
        self._turn ^= 1
        buf = self._pinned[self._turn]
        if buf is None or buf.nbytes < nbytes:
            mem = cp.cuda.alloc_pinned_memory(max(nbytes, 4096))
            buf = self._pinned[self._turn] = np.frombuffer(mem, np.uint8, mem.size())
        return buf

    def launch(self, logits, rows: Sequence[SamplingRow], eos_token_ids: Iterable[int] | None = None) -> PendingSample:
        """Launches the sampler kernel and the copy of its result to the host; returns at once.
        The pending sample's tokens are the device's int32 ids (a column of the result)."""
        cp = _cp()
        x, _ = _rows_f32(logits)
        if x.shape[0] != len(rows):
            raise ValueError(f"logits must be [B={len(rows)}, V], got {x.shape}")
        B, V = x.shape
        eos = self.eos_token_ids if eos_token_ids is None else tuple(int(t) for t in eos_token_ids)
        if B == 0:
            empty = SamplerOutput(token_ids=np.empty(0, np.int64), logprobs=[])
            return PendingSample(cp.empty(0, np.int32), lambda: empty)
        batch = PackedBatch(rows, V, eos)
        entries = logit_bias_entries(rows, V)
        if entries is not None:   # as the NumPy sampler, before the kernel's masks; a copy: x may be the model's buffer
            rows_idx, ids, vals = entries
            x = x.copy()
            x[cp.asarray(rows_idx), cp.asarray(ids)] += cp.asarray(vals)
        if self._up is None:
            self._up = cp.cuda.Stream(non_blocking=True)
        stream = cp.cuda.get_current_stream()
        if self._sampled is not None:    # pinned_upload's ring of `_up` reuses a slot once its reader ran
            self._up.wait_event(self._sampled)
        with self._up:
            params, toks, masks = batch.upload()
        stream.wait_event(self._up.record())
        work = self._scratch("_work", B, V, np.float32)
        cnt = self._scratch("_cnt", batch.n_cnt, V, np.int32)
        dev = sample_rows(x, params, toks, masks, batch.mask_words, work, cnt)
        self._sampled = stream.record()
        return self.pending(dev, rows, self._sampled)

    def graph_params(self, rows: Sequence[SamplingRow], V: int) -> np.ndarray | None:
        """The rows' parameters (int32 [B, SP_WORDS]) for a sampler inside the decode graph
        (sample_rows_at), or None when a row needs what only launch() does (in_graph)."""
        if not all(in_graph(r, self.eos_token_ids, V) for r in rows):
            return None
        batch = PackedBatch(rows, V, self.eos_token_ids)
        return batch.host[:batch.n_params].reshape(len(rows), SP_WORDS)

    def pending(self, dev, rows: Sequence[SamplingRow], sampled=None) -> PendingSample:
        """The sample whose results dev ([B, SO_WORDS] int32) holds once the event `sampled` (by
        default: the work queued on the current stream) has passed: they come down on a side
        stream while the device goes on."""
        cp = _cp()
        sampled = sampled or cp.cuda.get_current_stream().record()
        if self._down is None:
            self._down = cp.cuda.Stream(non_blocking=True)
        host = self._host_buffer(dev.nbytes)[:dev.nbytes].view(np.int32).reshape(dev.shape)
        self._down.wait_event(sampled)
        cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, dev.nbytes, cp.cuda.runtime.memcpyDeviceToHost,
                                    self._down.ptr)
        done = self._down.record()

        def result() -> SamplerOutput:
            done.synchronize()
            res = host.copy()
            self.last_raw = res
            token_ids = res[:, SO_TOK].astype(np.int64)
            logprobs: list[PositionLogprobs | None] = [
                None if r.params.logprobs is None else decode_logprobs(res[i], token_ids[i])
                for i, r in enumerate(rows)]
            return SamplerOutput(token_ids=token_ids, logprobs=logprobs)
        return PendingSample(dev[:, SO_TOK], result)


def prompt_logprobs_cuda(logits, prompt_ids: Sequence[int], k: int) -> list[PositionLogprobs | None]:
    """Device twin of sampler.prompt_logprobs: entry i describes prompt_ids[i] under logits[i-1]."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        return []
    if logits.shape[0] < len(ids) - 1:
        raise ValueError(f"need >= {len(ids) - 1} logits rows, got {logits.shape[0]}")
    if len(ids) == 1:
        return [None]
    res = topk_logprobs(logits[: len(ids) - 1], np.asarray(ids[1:], np.int32), min(k, logits.shape[1])).get()
    return [None] + [decode_logprobs(res[i - 1], ids[i]) for i in range(1, len(ids))]

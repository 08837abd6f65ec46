"""SchedulerOutput -> one flat batch -> model forward -> logits for the rows that need them."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .backend.attention_meta import AttentionMetadata
from .pooling import HiddenChunk
from .sched.output import SchedulerOutput
from .sched.request import PENDING_TOKEN
from .state_slots import StateSlots


@dataclass
class RunnerOutput:
    sample_ids: list[str]                   # requests to sample for, in row order of `logits`
    logits: object                          # [sampled rows, vocab] on the backend: a row per request,
                                            # 1 + num_draft rows for one with draft tokens
    prompt_logits: dict[str, np.ndarray]    # request id -> host logits of every scheduled row (a
                                            # pooling.HiddenChunk where prompt_hidden: a pooling request)
    sampled: object = None                  # [len(sample_ids), SO_WORDS] results of a sampler run
                                            # inside the decode graph (logits None then)
    pre_norm_hidden: object = None          # [scheduled tokens, hidden] the last layer's output before
                                            # the final norm, flat batch order (for an MTP layer to read)


@dataclass
class TokenFeed:
    """The previous step's sampled ids where the backend keeps them (async scheduling): `tokens`
    [B] int32, and each request's row in it. A scheduled token PENDING_TOKEN is taken from here."""
    tokens: object
    rows: dict[str, int]

    def rows_for(self, out: SchedulerOutput, dst: list[int], query_start: np.ndarray) -> list[int]:
        """The rows in tokens of the flat batch rows dst, which hold PENDING_TOKEN."""
        items = np.searchsorted(query_start, dst, side="right") - 1
        src = []
        for r, i in zip(dst, items.tolist()):
            s = out.scheduled[i]
            if r != query_start[i + 1] - 1 or s.request_id not in self.rows:
                raise RuntimeError(f"{s.request_id}: a pending token that the previous step did not sample")
            src.append(self.rows[s.request_id])
        return src


class FlatBatchBuilder:
    """SchedulerOutput -> flat token ids, positions and attention metadata of the step, in a few
    whole-batch numpy operations (no per-request arrays)."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._arange = np.arange(0, dtype=np.int64)

    def __call__(self, out: SchedulerOutput) -> tuple[np.ndarray, np.ndarray, AttentionMetadata]:
        bs, sched = self.block_size, out.scheduled
        B = len(sched)
        counts = [len(s.token_ids) for s in sched]
        widths = [len(s.block_ids) for s in sched]
        starts = np.fromiter((s.start_position for s in sched), np.int64, B)
        tables = np.zeros((B, max(widths)), np.int32)
        tables[self._columns(tables.shape[1]) < np.asarray(widths)[:, None]] = np.fromiter(
            itertools.chain.from_iterable(s.block_ids for s in sched), np.int32, sum(widths))
        ids = np.fromiter(itertools.chain.from_iterable(s.token_ids for s in sched), np.int64)
        query_start = np.fromiter(itertools.accumulate(counts, initial=0), np.int32, B + 1)
        if len(ids) == B:  # decode: one token per sequence
            pos, rows = starts, self._columns(B)
        else:
            rows = np.repeat(self._columns(B), counts)
            pos = np.arange(len(ids), dtype=np.int64) + np.repeat(starts - query_start[:-1], counts)
        block, offset = np.divmod(pos, bs)
        slots = tables[rows, block].astype(np.int64)
        slots *= bs
        slots += offset
        seq_lens = np.fromiter((s.start_position + len(s.token_ids) for s in sched), np.int32, B)
        meta = AttentionMetadata(query_start, seq_lens, tables, slots, bs, max_context=int(seq_lens.max(initial=0)))
        return ids, pos, meta

    def _columns(self, n: int) -> np.ndarray:
        """arange(n) (int64), cached: read only."""
        if len(self._arange) < n:
            self._arange = np.arange(max(n, 2 * len(self._arange)), dtype=np.int64)
            self._arange.flags.writeable = False
        return self._arange[:n]


class ModelRunner:
    def __init__(self, model, ops, num_blocks: int, block_size: int, max_model_len: int = 0,
                 max_num_seqs: int = 1, cuda_graphs: bool = False, kv_cache_dtype: str = "auto",
                 pre_norm_hidden: bool = False, graph_rows: int | None = None):
        """cuda_graphs: decode steps replay CUDA graphs (the caller checks the model can be captured:
        its CAPTURABLE); pre_norm_hidden: return the pre-norm hidden state of every row (the model's
        forward_with_hidden; eager steps only); graph_rows: the largest decode graph's rows (default
        max_num_seqs)."""
        c = model.config
        self.pre_norm_hidden = pre_norm_hidden
        self.model, self.ops, self.block_size = model, ops, block_size
        # one block past the pool: a scratch block where padded graph rows write their K/V; the KV
        # heads of this tensor-parallel rank only, for the layers with K/V (not a hybrid's recurrent ones)
        kv = (num_blocks + 1, block_size, model.layout.num_kv_heads, c.head_dim)
        values = getattr(model, "KV_VALUES", True)   # False: the K pages serve as values too (MLA)
        self.kv_caches = [ops.empty_kv_cache(*kv, kv_cache_dtype, values) for _ in range(c.num_kv_layers)]
        # a hybrid model's per-sequence recurrent state (its forward takes them after the caches)
        shapes = getattr(model, "state_shapes", None)
        self.states = None if shapes is None else StateSlots(ops, shapes, max_num_seqs, scratch=cuda_graphs)
        self.build_batch = FlatBatchBuilder(block_size)
        self.graphs = None
        if cuda_graphs:
            from .backend.graphs import DecodeGraphs

            self.graphs = DecodeGraphs(model, self.kv_caches, graph_rows or max_num_seqs, -(-max_model_len // block_size),
                                       block_size, scratch_slot=num_blocks * block_size, states=self.states)

    def execute(self, out: SchedulerOutput, feed: TokenFeed | None = None,
                sample_params: Callable[[int], np.ndarray | None] | None = None) -> RunnerOutput:
        """One step. feed: the previous step's sampled ids, for scheduled PENDING_TOKENs.
        sample_params(V): the sampled rows' parameters for a sampler inside the decode graph (or
        None), asked for when the step replays a graph whose every row samples."""
        ops = self.ops
        if self.states is not None:
            self.states.prepare(out)
        if not out.scheduled:   # only requests that ended (their state slots are free now)
            return RunnerOutput([], None, {})
        ids, pos, meta = self.build_batch(out)
        meta.decode_only = len(ids) == meta.num_seqs
        dst = np.flatnonzero(ids == PENDING_TOKEN).tolist()
        if dst and feed is None:
            raise RuntimeError("a pending token without the previous step's sampled ids")
        fed = (dst, feed.tokens, feed.rows_for(out, dst, meta.query_start)) if dst else None
        drafts = any(s.num_draft for s in out.scheduled)
        # a hybrid's states are saved for roll_back, and its drafts verified eagerly: graph rows of one
        # token each would not carry the state from one token to the next
        if drafts and self.states is not None:
            self.states.save([s.request_id for s in out.scheduled if s.num_draft])
        # a decode step, or a verification step: every request its last token and its drafts
        if (self.graphs is not None and self.graphs.bucket_for(len(ids)) and not (drafts and self.states is not None)
                and not any(s.prompt_logits for s in out.scheduled)
                and (meta.decode_only or all(s.sample and len(s.token_ids) == 1 + s.num_draft for s in out.scheduled))):
            rows = _sample_rows(out, meta.query_start)
            if drafts:      # a verification step: each token a row of the decode graph
                meta = per_token_rows(meta, pos)
            params = (sample_params(self.model.config.vocab_size)
                      if sample_params and len(rows) == len(ids) and not drafts else None)
            state_rows = None if self.states is None else self.states.host_rows
            logits, sampled = self.graphs.run(ids, pos, meta, fed, params, state_rows)
            if len(rows) < len(ids):  # a prompt chunk of one token that does not end the prompt
                logits = logits[ops.asarray(np.asarray(rows, np.int64))]
            return RunnerOutput([s.request_id for s in out.scheduled if s.sample], logits, {}, sampled)
        ids_dev = ops.asarray(ids)
        if fed is not None:
            ops.scatter_tokens(ids_dev, *fed)
        states = () if self.states is None else (self.states,)
        args = (ids_dev, ops.asarray(pos), ops.upload_meta(meta), self.kv_caches, *states)
        pre_norm = None
        if self.pre_norm_hidden:
            hidden, pre_norm = self.model.forward_with_hidden(*args)
        else:
            hidden = self.model.forward(*args)
        prompt_logits = {}
        query_start = meta.query_start.tolist()
        for i, s in enumerate(out.scheduled):
            if s.prompt_logits:
                rows = hidden[query_start[i]:query_start[i + 1]]
                prompt_logits[s.request_id] = (HiddenChunk.of(rows, ops.to_host) if s.prompt_hidden
                                               else ops.to_host(self.model.compute_logits(rows)))
        sample_rows, sample_ids = _sample_rows(out, meta.query_start), [s.request_id for s in out.scheduled if s.sample]
        if not sample_rows:
            logits = None
        elif len(sample_rows) == len(ids):  # every row (rows only increase): no gather
            logits = self.model.compute_logits(hidden)
        else:
            logits = self.model.compute_logits(hidden[ops.asarray(np.asarray(sample_rows, np.int64))])
        return RunnerOutput(sample_ids, logits, prompt_logits, pre_norm_hidden=pre_norm)

    def roll_back(self, out: SchedulerOutput, kept: dict[str, int]) -> None:
        """After verifying the drafts of step `out`: each request in kept (request id -> the tokens of
        the step that stand, its last token and the drafts kept) has the recurrent state saved before
        the step put back and those tokens run again (their K/V is rewritten as it was). The other
        requests keep the state the step left. Called after every verification step of a model with
        recurrent state, so the saved copies never outlive it."""
        redo = [dataclasses.replace(s, token_ids=s.token_ids[:kept[s.request_id]], sample=False, prompt_logits=False,
                                    num_draft=0) for s in out.scheduled if s.request_id in kept]
        rids = [s.request_id for s in redo]
        self.states.restore(rids)     # (none: the saved copies are released all the same)
        if not redo:
            return
        self.states.use_rows(rids)
        ids, pos, meta = self.build_batch(SchedulerOutput(redo))
        ops = self.ops
        self.model.forward(ops.asarray(ids), ops.asarray(pos), ops.upload_meta(meta), self.kv_caches, self.states)


def _sample_rows(out: SchedulerOutput, query_start: np.ndarray) -> list[int]:
    """The flat batch rows whose logits are sampled: each sampled request's last row, and before it
    one per draft token."""
    ends = query_start[1:].tolist()
    return [r for s, end in zip(out.scheduled, ends) if s.sample for r in range(end - 1 - s.num_draft, end)]


def per_token_rows(meta: AttentionMetadata, pos: np.ndarray) -> AttentionMetadata:
    """The step's tokens as sequences of one query row each, every row reading its request's blocks
    up to its own position (its K/V and that of the rows before it are stored first): a verification
    step (each request's last token and its drafts) in the decode graphs' layout."""
    counts = np.diff(meta.query_start)
    owner = np.repeat(np.arange(len(counts)), counts)
    return AttentionMetadata(np.arange(len(pos) + 1, dtype=np.int32), (pos + 1).astype(np.int32),
                             meta.block_tables[owner], meta.slot_mapping, meta.block_size, decode_only=True,
                             shared_context=True, max_context=int(pos.max(initial=-1)) + 1)

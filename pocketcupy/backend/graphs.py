"""CUDA graphs of the whole decode step (model forward + LM head, and the sampler where every row
samples without token lists or masks), captured once per batch-size bucket and input slot and
replayed: one graph launch instead of hundreds of kernel launches.

Graph memory comes from a private CuPy pool that nothing else allocates from, so buffers the
graphs read and write are never handed to other arrays; graphs share it and are replayed one
at a time, on the current stream (as the sampler and the eager steps). The steps' inputs go to
two slots by turns, copied on a side stream while the step before runs, so the only thing between
two replays is a wait on a copy long done. Kernels in a graph overlap their predecessors' tails
(pdl.py, sm_90+)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import pdl
from .attention_meta import AttentionMetadata
from .attn_cuda import graph_short_context
from .elementwise_cuda import feed_row_count, feed_tokens, fill_feed
from .sampler_cuda import F_GREEDY, SO_WORDS, SP_CNT, SP_FLAGS, SP_MASK, SP_WORDS, sample_rows_at

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# Larger decode batches run eagerly (launch overhead is spread over the batch there).
GRAPH_MAX_BATCH = 256


class GraphKey(NamedTuple):
    """Which captured decode graph a step replays."""
    bucket: int          # rows, padded up to a BUCKETS size
    sample: bool         # the sampler runs inside the graph
    slot: int            # input set, used by turns
    shared: bool         # rows of one request (AttentionMetadata.shared_context: a verification step)
    short: bool          # the longest context is at most DecodeGraphs.short_context


class DecodeGraphs:
    def __init__(self, model, kv_caches, max_batch: int, max_blocks_per_seq: int, block_size: int,
                 scratch_slot: int, states=None):
        """states: a hybrid model's StateSlots (with its scratch slot), whose rows become graph inputs."""
        import cupy

        self.cp, self.model, self.kv_caches, self.states = cupy, model, kv_caches, states
        self.block_size, self.scratch_slot = block_size, scratch_slot
        max_batch = min(max_batch, GRAPH_MAX_BATCH)
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        top = self.buckets[-1]
        self.pool = cupy.cuda.MemoryPool()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # Two sets of inputs, each with its graphs, used by turns: a step's inputs are copied on a
        # side stream while the step before runs (the turn's graphs read them after an event).
        self.up_stream = cupy.cuda.Stream(non_blocking=True)
        with cupy.cuda.using_allocator(self.pool.malloc):
            self.inputs = [_Inputs(cupy, top, max_blocks_per_seq) for _ in range(2)]
            self.query_start = cupy.arange(top + 1, dtype=cupy.int32)
        self._slot = 0
        # 8-bit pages: batches whose longest context is at most this have graphs of their own, whose
        # attention may take its short-split kernels (attn_cuda.graph_short_context); else None
        self.short_context = graph_short_context(*kv_caches[0]) if kv_caches else None
        self.graphs: dict[GraphKey, object] = {}
        self.last_key: GraphKey | None = None          # the graph the last step replayed
        self.logits: dict[GraphKey, object] = {}
        # The graph's sampler writes to its slot's result buffer: a step's results are copied to
        # the host while the next step runs (its sampled ids are that step's inputs too).
        self.sampled, self._work = [], None

    def bucket_for(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def _meta(self, inp: _Inputs, b: int, shared: bool, short: bool) -> AttentionMetadata:
        return AttentionMetadata(self.query_start[: b + 1], inp.seq_lens[:b], inp.tables[:b], inp.slots[:b],
                                 self.block_size, decode_only=True, shared_context=shared,
                                 max_context=self.short_context if short else None)

    def _forward(self, inp: _Inputs, b: int, sample: bool, shared: bool, short: bool):
        feed_tokens(inp.feed, b, inp.ids)
        states = () if self.states is None else (_GraphStates(self.states.layers, inp.state_rows[:b]),)
        meta = self._meta(inp, b, shared, short)
        hidden = self.model.forward(inp.ids[:b], inp.pos[:b], meta, self.kv_caches, *states)
        logits = self.model.compute_logits(hidden)
        if sample:
            sample_rows_at(logits, inp.params, self._work, inp.out_at)
        return logits

    def _set_padding(self, h: dict, n: int, b: int) -> None:
        """Host rows n..b-1 as padding: they write their K/V into the scratch slot and attend
        over that one token."""
        h["ids"][n:b] = 0
        h["feed"][2 + n:2 + b] = -1
        h["pos"][n:b] = 0
        h["slots"][n:b] = self.scratch_slot
        h["seq_lens"][n:b] = 1
        h["tables"][n:b] = self.scratch_slot // self.block_size
        h["params"][n:b] = 0
        h["params"][n:b, SP_FLAGS] = F_GREEDY
        h["params"][n:b, SP_MASK] = h["params"][n:b, SP_CNT] = -1
        if self.states is not None:
            h["state_rows"][n:b] = self.states.scratch_slot

    def capture(self, b: int, sample: bool = False, slot: int = 0, shared: bool = False, short: bool = False) -> None:
        """The graph of GraphKey(b, sample, slot, shared, short): a bucket's decode step, with the sampler
        or not, on input slot `slot`, its rows of one request each or (shared) some of one request
        (AttentionMetadata.shared_context: a verification step), for batches whose longest context is
        at most self.short_context (short) or any."""
        cp, inp = self.cp, self.inputs[slot]
        top = len(inp.host["ids"])
        cp.cuda.get_current_stream().synchronize()   # the replays queued there share the pool
        self.up_stream.synchronize()
        if sample and self._work is None:
            with cp.cuda.using_allocator(self.pool.malloc):
                self._work = cp.empty((top, self.model.config.vocab_size), cp.float32)
                self.sampled = [cp.empty((top, SO_WORDS), cp.int32) for _ in self.inputs]
        # the warm-up's results go where the slot's replays write (the other slot's are the last
        # step's results: the next step's inputs)
        inp.host["out_at"][0] = self.sampled[slot].data.ptr if sample else 0
        self._set_padding(inp.host, 0, top)  # the warm-up forward must write no real KV slot
        inp.upload(top, self.stream)
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self._forward(inp, b, sample, shared, short)    # compiles kernels and sizes the pool
            self.stream.synchronize()
            self.stream.begin_capture()
            with pdl.enabled():
                logits = self._forward(inp, b, sample, shared, short)
            key = GraphKey(b, sample, slot, shared, short)
            self.graphs[key] = self.stream.end_capture()
            self.logits[key] = logits
        self.stream.synchronize()

    def run(self, ids: np.ndarray, pos: np.ndarray, meta: AttentionMetadata, fed=None, params=None,
            state_rows=None):
        """Replay the bucket's graph for a decode batch of len(ids) rows on the current stream;
        returns (logits [n, vocab], None), or with params (the rows' sampler parameters, int32
        [n, SP_WORDS]) (None, results [n, SO_WORDS]) of the sampler run inside the graph.
        fed: (rows, tokens, token rows): ids[rows] = tokens[token rows], taken by the graph's first
        kernel (the previous step's sampled ids, async scheduling). state_rows: each row's state
        slot (a hybrid model's, StateSlots.host_rows). The inputs are copied on the
        side stream once the last replay of the slot's graphs has finished."""
        cp, n = self.cp, len(ids)
        b, sample = self.bucket_for(n), params is not None
        self._slot ^= 1
        slot = self._slot
        short = self.short_context is not None and int(np.max(meta.seq_lens)) <= self.short_context
        key, inp = GraphKey(b, sample, slot, meta.shared_context, short), self.inputs[slot]
        self.last_key = key
        if key not in self.graphs:
            self.capture(*key)
        inp.wait_copied()
        h = inp.host
        h["ids"][:n] = ids
        h["pos"][:n] = pos
        h["slots"][:n] = meta.slot_mapping
        h["seq_lens"][:n] = meta.seq_lens
        width = meta.block_tables.shape[1]
        h["tables"][:n, :width] = meta.block_tables
        h["tables"][:n, width:] = 0
        fill_feed(h["feed"], n, fed)
        if state_rows is not None:
            h["state_rows"][:n] = state_rows
        self._set_padding(h, n, b)
        if sample:
            h["params"][:n] = params
            h["out_at"][0] = self.sampled[slot].data.ptr
        stream = cp.cuda.get_current_stream()
        inp.upload(b, self.up_stream, after=inp.read)
        stream.wait_event(inp.copied)
        self.graphs[key].launch(stream)
        inp.read.record(stream)
        if sample:
            return None, self.sampled[slot][:n]
        return self.logits[key][:n], None


class _Inputs:
    """One set of a decode graph's inputs: views of one device buffer, filled by one copy a step
    from a pinned host twin: ids, pos, slots, state_rows int64 [top], feed int64
    (elementwise_cuda.fill_feed), out_at int64 [1] (the address the graph's sampler writes to),
    seq_lens int32 [top], params int32 [top, SP_WORDS] (the sampler's rows), tables int32 [top, W]."""

    def __init__(self, cp, top: int, max_blocks_per_seq: int):
        fields = [("ids", np.int64, (top,)), ("pos", np.int64, (top,)), ("slots", np.int64, (top,)),
                  ("state_rows", np.int64, (top,)),
                  ("feed", np.int64, (feed_row_count(top),)), ("out_at", np.int64, (1,)),
                  ("seq_lens", np.int32, (top,)), ("params", np.int32, (top, SP_WORDS)),
                  ("tables", np.int32, (top, max_blocks_per_seq))]
        nbytes = sum(np.dtype(t).itemsize * int(np.prod(shape)) for _, t, shape in fields)
        self.cp, self._host_mem = cp, cp.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(self._host_mem, np.uint8, nbytes)
        self._dev = cp.zeros(nbytes, cp.uint8)
        self.host, off = {}, 0
        for name, t, shape in fields:
            size = np.dtype(t).itemsize * int(np.prod(shape))
            self.host[name] = host[off:off + size].view(t).reshape(shape)
            setattr(self, name, self._dev[off:off + size].view(t).reshape(shape))
            off += size
        self._tables_off = off - self.host["tables"].nbytes
        self.copied = cp.cuda.Event(disable_timing=True)   # the last copy has read the host buffer
        self.read = cp.cuda.Event(disable_timing=True)     # the last graph launched has read the inputs

    def wait_copied(self) -> None:
        """Before writing the pinned buffer: the last copy has read it (an event never recorded
        has passed)."""
        self.copied.synchronize()

    def upload(self, b: int, stream, after=None) -> None:
        """The host buffer's first b rows (and every row of the small fields) to the device on
        `stream`, after the event `after`."""
        cp = self.cp
        if after is not None:
            stream.wait_event(after)
        nbytes = self._tables_off + self.host["tables"][:b].nbytes
        cp.cuda.runtime.memcpyAsync(self._dev.data.ptr, self._host_mem.ptr, nbytes,
                                    cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        self.copied.record(stream)


@dataclass
class _GraphStates:
    """What a hybrid model's forward reads of its StateSlots, with the rows from the graph's inputs."""
    layers: list
    rows: object

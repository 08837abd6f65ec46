"""CUDA graphs of the whole decode step (model forward + LM head, and the sampler where every row
samples without token lists or masks), captured once per batch-size bucket and replayed: one
graph launch instead of hundreds of kernel launches.

Graph memory comes from a private CuPy pool that nothing else allocates from, so buffers the
graphs read and write are never handed to other arrays; graphs share it and are replayed one
at a time, on the current stream (as the sampler and the eager steps: no waits between streams
on the path from one step to the next). Kernels in a graph overlap their predecessors' tails
(pdl.py, sm_90+)."""
from __future__ import annotations

import numpy as np

from . import pdl
from .attention_meta import AttentionMetadata
from .elementwise_cuda import feed_row_count, feed_tokens, fill_feed
from .sampler_cuda import F_GREEDY, SO_WORDS, SP_CNT, SP_FLAGS, SP_MASK, SP_WORDS, sample_rows_at

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# Larger decode batches run eagerly (launch overhead is spread over the batch there).
GRAPH_MAX_BATCH = 256


class DecodeGraphs:
    def __init__(self, model, kv_caches, max_batch: int, max_blocks_per_seq: int, block_size: int,
                 scratch_slot: int):
        import cupy

        self.cp, self.model, self.kv_caches = cupy, model, kv_caches
        self.block_size, self.scratch_slot = block_size, scratch_slot
        max_batch = min(max_batch, GRAPH_MAX_BATCH)
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        top = self.buckets[-1]
        self.pool = cupy.cuda.MemoryPool()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # The graphs' inputs are views of one device buffer, filled by one copy a step from a
        # pinned host twin: ids, pos, slots int64 [top], feed int64 (elementwise_cuda.fill_feed),
        # out_at int64 [1] (the address the graph's sampler writes to), seq_lens int32 [top],
        # params int32 [top, SP_WORDS] (the sampler's rows), tables int32 [top, W].
        fields = [("ids", np.int64, (top,)), ("pos", np.int64, (top,)), ("slots", np.int64, (top,)),
                  ("feed", np.int64, (feed_row_count(top),)), ("out_at", np.int64, (1,)),
                  ("seq_lens", np.int32, (top,)), ("params", np.int32, (top, SP_WORDS)),
                  ("tables", np.int32, (top, max_blocks_per_seq))]
        nbytes = sum(np.dtype(t).itemsize * int(np.prod(shape)) for _, t, shape in fields)
        self._host_mem = cupy.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(self._host_mem, np.uint8, nbytes)
        with cupy.cuda.using_allocator(self.pool.malloc):
            self._dev = cupy.zeros(nbytes, cupy.uint8)
            self.query_start = cupy.arange(top + 1, dtype=cupy.int32)
        self.host, off = {}, 0
        for name, t, shape in fields:
            size = np.dtype(t).itemsize * int(np.prod(shape))
            self.host[name] = host[off:off + size].view(t).reshape(shape)
            setattr(self, name, self._dev[off:off + size].view(t).reshape(shape))
            off += size
        self._tables_off = off - self.host["tables"].nbytes
        self._copied = None
        self.graphs: dict[tuple[int, bool], object] = {}   # (bucket, with the sampler) -> graph
        self.logits: dict[tuple[int, bool], object] = {}
        # The graph's sampler alternates between two result buffers: a step's results are copied to
        # the host while the next step runs (its sampled ids are that step's inputs too).
        self.sampled, self._work, self._turn = [], None, 0

    def bucket_for(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(self.query_start[: b + 1], self.seq_lens[:b], self.tables[:b], self.slots[:b],
                                 self.block_size, decode_only=True)

    def _forward(self, b: int, sample: bool):
        feed_tokens(self.feed, b, self.ids)
        hidden = self.model.forward(self.ids[:b], self.pos[:b], self._meta(b), self.kv_caches)
        logits = self.model.compute_logits(hidden)
        if sample:
            sample_rows_at(logits, self.params, self._work, self.out_at)
        return logits

    def _set_padding(self, n: int, b: int) -> None:
        """Host rows n..b-1 as padding: they write their K/V into the scratch slot and attend
        over that one token."""
        h = self.host
        h["ids"][n:b] = 0
        h["feed"][2 + n:2 + b] = -1
        h["pos"][n:b] = 0
        h["slots"][n:b] = self.scratch_slot
        h["seq_lens"][n:b] = 1
        h["tables"][n:b] = self.scratch_slot // self.block_size
        h["params"][n:b] = 0
        h["params"][n:b, SP_FLAGS] = F_GREEDY
        h["params"][n:b, SP_MASK] = h["params"][n:b, SP_CNT] = -1

    def _wait_copy(self) -> None:
        """Before writing the pinned buffer: the last copy has read it."""
        if self._copied is not None:
            self._copied.synchronize()

    def _upload(self, b: int, stream) -> None:
        """The host buffer's first b rows (and every row of the small fields) to the device."""
        cp = self.cp
        nbytes = self._tables_off + self.host["tables"][:b].nbytes
        cp.cuda.runtime.memcpyAsync(self._dev.data.ptr, self._host_mem.ptr, nbytes,
                                    cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        self._copied = stream.record()

    def capture(self, b: int, sample: bool = False) -> None:
        cp = self.cp
        top = len(self.host["ids"])
        cp.cuda.get_current_stream().synchronize()   # the replays queued there share the pool
        self._wait_copy()
        if sample and self._work is None:
            with cp.cuda.using_allocator(self.pool.malloc):
                self._work = cp.empty((top, self.model.config.vocab_size), cp.float32)
                self.sampled = [cp.empty((top, SO_WORDS), cp.int32) for _ in range(2)]
        # the warm-up's results go where the next replay's will: the last step's are its inputs
        self.host["out_at"][0] = self.sampled[self._turn ^ 1].data.ptr if sample else 0
        self._set_padding(0, top)            # the warm-up forward must write no real KV slot
        self._upload(top, self.stream)
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self._forward(b, sample)         # compiles kernels and sizes the pool
            self.stream.synchronize()
            self.stream.begin_capture()
            with pdl.enabled():
                logits = self._forward(b, sample)
            self.graphs[b, sample] = self.stream.end_capture()
            self.logits[b, sample] = logits
        self.stream.synchronize()

    def capture_all(self) -> None:
        for b in self.buckets:
            self.capture(b)

    def run(self, ids: np.ndarray, pos: np.ndarray, meta: AttentionMetadata, fed=None, params=None):
        """Replay the bucket's graph for a decode batch of len(ids) rows on the current stream;
        returns (logits [n, vocab], None), or with params (the rows' sampler parameters, int32
        [n, SP_WORDS]) (None, results [n, SO_WORDS]) of the sampler run inside the graph.
        fed: (rows, tokens, token rows): ids[rows] = tokens[token rows], taken by the graph's first
        kernel (the previous step's sampled ids, async scheduling). The inputs' copy is queued
        behind the work queued before (the last replay read them)."""
        cp, n = self.cp, len(ids)
        b, sample = self.bucket_for(n), params is not None
        if (b, sample) not in self.graphs:
            self.capture(b, sample)
        self._wait_copy()
        h = self.host
        h["ids"][:n] = ids
        h["pos"][:n] = pos
        h["slots"][:n] = meta.slot_mapping
        h["seq_lens"][:n] = meta.seq_lens
        width = meta.block_tables.shape[1]
        h["tables"][:n, :width] = meta.block_tables
        h["tables"][:n, width:] = 0
        fill_feed(h["feed"], n, fed)
        self._set_padding(n, b)
        if sample:
            h["params"][:n] = params
            self._turn ^= 1
            h["out_at"][0] = self.sampled[self._turn].data.ptr
        stream = cp.cuda.get_current_stream()
        self._upload(b, stream)
        self.graphs[b, sample].launch(stream)
        if sample:
            return None, self.sampled[self._turn][:n]
        return self.logits[b, sample][:n], None

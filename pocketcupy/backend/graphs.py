"""CUDA graphs of the whole decode step (model forward + LM head), captured once per
batch-size bucket and replayed: one graph launch instead of hundreds of kernel launches.

Graph memory comes from a private CuPy pool that nothing else allocates from, so buffers the
graphs read and write are never handed to other arrays; graphs share it and are replayed one
at a time on one stream. Kernels in a graph overlap their predecessors' tails (pdl.py, sm_90+)."""
from __future__ import annotations

import numpy as np

from . import pdl
from .attention_meta import AttentionMetadata

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# Larger decode batches run eagerly (launch overhead is spread over the batch there).
GRAPH_MAX_BATCH = 256


class DecodeGraphs:
    def __init__(self, model, ops, kv_caches, max_batch: int, max_blocks_per_seq: int, block_size: int,
                 scratch_slot: int):
        import cupy

        self.cp, self.model, self.ops, self.kv_caches = cupy, model, ops, kv_caches
        self.block_size, self.scratch_slot = block_size, scratch_slot
        max_batch = min(max_batch, GRAPH_MAX_BATCH)
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        top = self.buckets[-1]
        self.pool = cupy.cuda.MemoryPool()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        with cupy.cuda.using_allocator(self.pool.malloc):
            self.ids = cupy.zeros(top, cupy.int64)
            self.pos = cupy.zeros(top, cupy.int64)
            self.slots = cupy.full(top, scratch_slot, cupy.int64)
            self.seq_lens = cupy.ones(top, cupy.int32)
            self.tables = cupy.zeros((top, max_blocks_per_seq), cupy.int32)
            self.query_start = cupy.arange(top + 1, dtype=cupy.int32)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.graphs: dict[int, object] = {}
        self.logits: dict[int, object] = {}

    def bucket_for(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(self.query_start[: b + 1], self.seq_lens[:b], self.tables[:b], self.slots[:b],
                                 self.block_size, decode_only=True)

    def _forward(self, b: int):
        hidden = self.model.forward(self.ids[:b], self.pos[:b], self._meta(b), self.kv_caches)
        return self.model.compute_logits(hidden)

    def capture(self, b: int) -> None:
        cp = self.cp
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self._forward(b)                 # compiles kernels and sizes the pool
            self.stream.synchronize()
            self.stream.begin_capture()
            with pdl.enabled():
                logits = self._forward(b)
            self.graphs[b] = self.stream.end_capture()
            self.logits[b] = logits
        self.stream.synchronize()

    def capture_all(self) -> None:
        for b in self.buckets:
            self.capture(b)

    def run(self, ids: np.ndarray, pos: np.ndarray, meta: AttentionMetadata):
        """Replay the bucket's graph for a decode batch of len(ids) rows; returns logits [n, vocab]."""
        cp, n = self.cp, len(ids)
        b = self.bucket_for(n)
        if b not in self.graphs:
            self.capture(b)
        with self.stream:
            self.ids[:n].set(ids)
            self.pos[:n].set(pos)
            self.slots[:n].set(meta.slot_mapping)
            self.seq_lens[:n].set(meta.seq_lens)
            width = meta.block_tables.shape[1]
            tables = np.zeros((n, self.max_blocks_per_seq), np.int32)
            tables[:, :width] = meta.block_tables
            self.tables[:n].set(tables)
            if b > n:  # padding rows: write their K/V into the scratch slot, attend over one token
                self.slots[n:b].fill(self.scratch_slot)
                self.seq_lens[n:b].fill(1)
                self.tables[n:b].fill(self.scratch_slot // self.block_size)
            self.graphs[b].launch(self.stream)
        cp.cuda.get_current_stream().wait_event(self.stream.record())
        return self.logits[b][:n]

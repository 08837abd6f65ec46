"""SchedulerOutput -> one flat batch -> model forward -> logits for the rows that need them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend.attention_meta import AttentionMetadata
from .sched.output import SchedulerOutput


@dataclass
class RunnerOutput:
    sample_ids: list[str]                   # requests to sample for, in row order of `logits`
    logits: object                          # [len(sample_ids), vocab] on the backend
    prompt_logits: dict[str, np.ndarray]    # request id -> host logits of every scheduled row


class ModelRunner:
    def __init__(self, model, ops, num_blocks: int, block_size: int, max_model_len: int = 0,
                 max_num_seqs: int = 1, cuda_graphs: bool = False):
        c = model.config
        self.model, self.ops, self.block_size = model, ops, block_size
        # one block past the pool: a scratch block where padded graph rows write their K/V; the KV
        # heads of this tensor-parallel rank only
        self.kv_caches = [ops.empty_kv_cache(num_blocks + 1, block_size, model.layout.num_kv_heads, c.head_dim)
                          for _ in range(c.num_layers)]
        self.graphs = None
        if cuda_graphs:
            from .backend.graphs import DecodeGraphs

            self.graphs = DecodeGraphs(model, ops, self.kv_caches, max_num_seqs, -(-max_model_len // block_size),
                                       block_size, scratch_slot=num_blocks * block_size)

    def build_batch(self, out: SchedulerOutput):
        bs = self.block_size
        ids, pos, slots, starts, lens = [], [], [], [0], []
        max_blocks = max(len(s.block_ids) for s in out.scheduled)
        tables = np.zeros((len(out.scheduled), max_blocks), np.int32)
        for i, s in enumerate(out.scheduled):
            n = len(s.token_ids)
            p = np.arange(s.start_position, s.start_position + n)
            blocks = np.asarray(s.block_ids, np.int64)
            ids.extend(s.token_ids)
            pos.append(p)
            slots.append(blocks[p // bs] * bs + p % bs)
            starts.append(starts[-1] + n)
            lens.append(s.start_position + n)
            tables[i, :len(s.block_ids)] = s.block_ids
        meta = AttentionMetadata(np.asarray(starts, np.int32), np.asarray(lens, np.int32), tables,
                                 np.concatenate(slots), bs)
        return np.asarray(ids, np.int64), np.concatenate(pos).astype(np.int64), meta

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        ops = self.ops
        ids, pos, meta = self.build_batch(out)
        meta.decode_only = len(ids) == meta.num_seqs
        if (self.graphs is not None and meta.decode_only and self.graphs.bucket_for(len(ids))
                and not any(s.prompt_logits for s in out.scheduled)):
            logits = self.graphs.run(ids, pos, meta)
            rows = [i for i, s in enumerate(out.scheduled) if s.sample]
            if len(rows) < len(ids):  # a prompt chunk of one token that does not end the prompt
                logits = logits[ops.asarray(np.asarray(rows, np.int64))]
            return RunnerOutput([out.scheduled[i].request_id for i in rows], logits, {})
        hidden = self.model.forward(ops.asarray(ids), ops.asarray(pos), ops.upload_meta(meta), self.kv_caches)
        sample_rows, sample_ids, prompt_logits = [], [], {}
        for i, s in enumerate(out.scheduled):
            q0, q1 = int(meta.query_start[i]), int(meta.query_start[i + 1])
            if s.prompt_logits:
                prompt_logits[s.request_id] = ops.to_host(self.model.compute_logits(hidden[q0:q1]))
            if s.sample:
                sample_rows.append(q1 - 1)
                sample_ids.append(s.request_id)
        logits = self.model.compute_logits(hidden[ops.asarray(np.asarray(sample_rows, np.int64))]) \
            if sample_rows else None
        return RunnerOutput(sample_ids, logits, prompt_logits)

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
    def __init__(self, model, ops, num_blocks: int, block_size: int):
        c = model.config
        self.model, self.ops, self.block_size = model, ops, block_size
        self.kv_caches = [ops.empty_kv_cache(num_blocks, block_size, c.num_kv_heads, c.head_dim)
                          for _ in range(c.num_layers)]

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
        hidden = self.model.forward(ops.asarray(ids), ops.asarray(pos), meta, self.kv_caches)
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

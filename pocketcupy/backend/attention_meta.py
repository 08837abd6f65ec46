"""What attention needs to know about a flat batch (built by the runner, read by the ops)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AttentionMetadata:
    query_start: np.ndarray    # [B+1] int32: sequence b owns query rows query_start[b]:query_start[b+1]
    seq_lens: np.ndarray       # [B] int32: context length of sequence b after this step
    block_tables: np.ndarray   # [B, max_blocks] int32 (padded with 0)
    slot_mapping: np.ndarray   # [N] int64: cache slot (block * block_size + offset) of each new token
    block_size: int
    decode_only: bool = False  # every sequence has exactly one query row (the decode kernels apply)
    # some row's context holds K/V that other rows of the step store (runner.per_token_rows: a
    # request's tokens as rows of their own), so no launch may both store K/V and read it
    shared_context: bool = False
    # the longest seq_lens entry as the host knows it (a decode graph: its class's bound), or None:
    # the block tables' width; the CUDA decode attention picks its form for splits of this context
    max_context: int | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

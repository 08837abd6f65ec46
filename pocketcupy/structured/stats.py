"""Structured-output counters an engine exports: constrained requests, and the time spent filling
token masks (a histogram per step, plus recent (seconds, rows) samples for benchmarks)."""
from __future__ import annotations

import bisect
from collections import deque

MASK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class StructuredStats:
    def __init__(self, keep: int = 100_000):
        self.num_requests = 0
        self.mask_counts = [0] * (len(MASK_BUCKETS) + 1)  # per bucket, the last one is +Inf
        self.mask_seconds_sum = 0.0
        self.samples: deque[tuple[float, int]] = deque(maxlen=keep)

    def record_masks(self, seconds: float, rows: int) -> None:
        self.mask_counts[bisect.bisect_left(MASK_BUCKETS, seconds)] += 1
        self.mask_seconds_sum += seconds
        self.samples.append((seconds, rows))

    def snapshot(self) -> dict:
        """{'requests', 'mask_buckets': [(finite upper bound, cumulative count)...], 'mask_sum',
        'mask_count' (the +Inf bucket)}; plain JSON."""
        cum, buckets = 0, []
        for le, c in zip(MASK_BUCKETS, self.mask_counts):
            cum += c
            buckets.append((le, cum))
        return {"requests": self.num_requests, "mask_buckets": buckets, "mask_sum": self.mask_seconds_sum,
                "mask_count": sum(self.mask_counts)}

"""A dependency-free progress bar on stderr."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, enabled: bool = True, stream=None):
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.stream = stream or sys.stderr
        self.n, self.t0 = 0, time.monotonic()

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.enabled:
            frac = min(self.n / self.total, 1.0)
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label} [{bar:<30}] {self.n}/{self.total} {time.monotonic() - self.t0:.1f}s")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

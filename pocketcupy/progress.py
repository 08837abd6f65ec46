"""A dependency-free progress bar on stderr (redrawn in place on a terminal, one line otherwise)."""
from __future__ import annotations

import sys
import time


class Progress:
    WIDTH = 30

    def __init__(self, total: int, label: str, enabled: bool = True, stream=None):
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.n, self.drawn, self.t0 = 0, -1, time.monotonic()

    def update(self, k: int = 1) -> None:
        self.n += k
        filled = min(self.n * self.WIDTH // self.total, self.WIDTH)
        if self.enabled and self.tty and filled != self.drawn:
            self.drawn = filled
            self.stream.write(f"\r{self.label} [{'#' * filled:<{self.WIDTH}}] {self.n}/{self.total} "
                              f"{time.monotonic() - self.t0:.1f}s")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            end = "\n" if self.tty else f"{self.label}: {self.n}/{self.total} in {time.monotonic() - self.t0:.1f}s\n"
            self.stream.write(end)
            self.stream.flush()


class ProgressDict(dict):
    """A dict that ticks a progress bar the first time each key is read with get() (the model
    builder reads every tensor of the checkpoint once)."""

    def __init__(self, tensors: dict, enabled: bool, label: str = "loading"):
        super().__init__(tensors)
        self._bar = Progress(len(tensors), label, enabled)
        self._seen: set[str] = set()

    def get(self, key, default=None):
        if key in self and key not in self._seen:
            self._seen.add(key)
            self._bar.update()
            if len(self._seen) == len(self):
                self._bar.close()
        return super().get(key, default)

"""Module-level tuning settings of pocketcupy.backend (e.g. codes_tile_cuda.CODES_TILE_MAX_BATCH) set for
the length of a block: the kernel tests and benchmarks compare a kernel's paths with it."""
from __future__ import annotations

import importlib
from contextlib import contextmanager


@contextmanager
def overridden(overrides):
    """Within the block, each (module, name, value) triple's pocketcupy.backend.<module>.<name> is value."""
    mods = [(importlib.import_module(f"pocketcupy.backend.{m}"), k, v) for m, k, v in overrides]
    saved = [(mod, k, getattr(mod, k)) for mod, k, _ in mods]
    for mod, k, v in mods:
        setattr(mod, k, v)
    try:
        yield
    finally:
        for mod, k, v in reversed(saved):
            setattr(mod, k, v)

"""The engine's lock: re-entrant, and handed to a thread that waits for it before the step loop retakes it.

The step loop releases the lock after a step and takes it again at once for the next; a plain lock
lets it win that race step after step, so a thread calling stats(), add_request() or abort_request()
could wait out a whole generation (a /metrics scrape was seen blocked for 16 s on the CPU backend).
"""
from __future__ import annotations

import threading


class EngineLock:
    def __init__(self):
        self._lock = threading.RLock()
        self._turn = threading.Condition(threading.Lock())
        self._waiting = 0

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            with self._turn:
                self._waiting += 1
            try:
                self._lock.acquire()
            finally:
                with self._turn:
                    self._waiting -= 1
                    self._turn.notify_all()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True) -> bool:
        """As `with`, or, not blocking, only if it is free at once (then release() it)."""
        if blocking:
            self.__enter__()
            return True
        return self._lock.acquire(blocking=False)

    def release(self) -> None:
        self._lock.release()

    def yield_to_waiters(self, timeout: float = 0.1) -> None:
        """The step loop calls this before it takes the lock (never while holding it): threads already
        waiting take it first. The timeout bounds the wait should waiters keep arriving."""
        if self._waiting:
            with self._turn:
                self._turn.wait_for(lambda: not self._waiting, timeout)

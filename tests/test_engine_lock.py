"""EngineLock: a thread waiting for the engine's lock gets it before the step loop retakes it."""
import threading
import time

from pocketcupy.engine_lock import EngineLock


def test_waiting_thread_goes_before_the_next_step():
    lock, order = EngineLock(), []
    lock.__enter__()                       # the step loop is mid-step
    waiter = threading.Thread(target=lambda: (lock.__enter__(), order.append("waiter"), lock.__exit__()))
    waiter.start()
    while not lock._waiting:               # the waiter is blocked on the lock
        time.sleep(0.001)
    lock.__exit__()                        # the step ends ...
    lock.yield_to_waiters(timeout=10)      # ... and the next one lets the waiter in first
    with lock:
        order.append("step")
    waiter.join(10)
    assert order == ["waiter", "step"]


def test_reentrant_and_no_wait_without_waiters():
    lock = EngineLock()
    with lock:
        with lock:
            pass
    t0 = time.monotonic()
    lock.yield_to_waiters(timeout=5)
    assert time.monotonic() - t0 < 1 and lock._waiting == 0

"""Small per-step host arrays (sampler parameters, token rows) to the device through pinned
buffers: cudaMemcpyAsync from pinned memory returns at once, while cupy.asarray of a NumPy array
copies from pageable memory (~40 us of host time a call under cProfile on the H200 machine, twice
a decode step). Each thread and stream has its own ring of slots (pinned buffer, device buffer):
a slot is reused once the copy out of it has finished, and the copy into its device buffer is
ordered after the kernels queued on that stream that read it before (threads share the null
stream, so one thread's uploads must not overwrite a slot another has yet to launch a reader of)."""
from __future__ import annotations

import threading

import numpy as np

RING_SLOTS = 4
MIN_SLOT_BYTES = 4096

_local = threading.local()      # .rings: (device id, stream pointer) -> _Ring


class _Ring:
    def __init__(self):
        self.slots: list[list | None] = [None] * RING_SLOTS
        self.next = 0


def upload(a: np.ndarray):
    """A device copy of `a` (a view of a ring slot's buffer, valid for the kernels this thread
    queues on the current stream until its next RING_SLOTS uploads there), copied on that stream."""
    import cupy as cp

    a = np.ascontiguousarray(a)
    stream = cp.cuda.get_current_stream()
    rings = _local.__dict__.setdefault("rings", {})
    ring = rings.setdefault((cp.cuda.Device().id, stream.ptr), _Ring())
    i, ring.next = ring.next, (ring.next + 1) % RING_SLOTS
    slot = ring.slots[i]
    if slot is None or slot[1].nbytes < a.nbytes:
        n = max(a.nbytes, MIN_SLOT_BYTES, 0 if slot is None else 2 * slot[1].nbytes)
        slot = ring.slots[i] = [cp.cuda.alloc_pinned_memory(n), cp.empty(n, cp.uint8), None]
    host, dev, copied = slot
    if copied is not None:
        copied.synchronize()
    np.frombuffer(host, np.uint8, a.nbytes)[:] = a.reshape(-1).view(np.uint8)
    cp.cuda.runtime.memcpyAsync(dev.data.ptr, host.ptr, a.nbytes, cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
    slot[2] = stream.record()
    return dev[:a.nbytes].view(a.dtype).reshape(a.shape)

"""Communicators of a tensor-parallel group: all_reduce (sum), all_gather (last axis) and the
broadcast of each step's SchedulerOutput from rank 0.

The ranks are joined in a star of pipes through rank 0 (PipeChannel). Python objects always
travel over it (pickled bytes); arrays do too for the NumPy backend (CpuCommunicator), while the
CUDA backend reduces them with NCCL (nccl.py). A pipe that closes means its rank died: every
call then raises RankFailedError naming the rank instead of waiting."""
from __future__ import annotations

import pickle
from multiprocessing import BufferTooShort
from typing import Callable

import numpy as np


class RankFailedError(RuntimeError):
    def __init__(self, rank: int, reason: str):
        super().__init__(f"tensor-parallel rank {rank} failed: {reason}")
        self.rank, self.reason = rank, reason


class PipeChannel:
    """Bytes between rank 0 and each other rank: `conns` maps a peer rank to its duplex
    multiprocessing Connection (rank 0 holds one per worker; a worker holds one, to rank 0).
    `describe(rank)` says why a peer is gone (exit code, signal, its last error)."""

    def __init__(self, rank: int, world: int, conns: dict, describe: Callable[[int], str] | None = None,
                 timeout_s: float | None = None):
        self.rank, self.world, self.conns = rank, world, conns
        self.describe = describe or (lambda r: "its connection closed")
        self.timeout_s = timeout_s

    def peers(self) -> list[int]:
        return sorted(self.conns)

    def send(self, peer: int, data) -> None:
        try:
            self.conns[peer].send_bytes(data)
        except (OSError, EOFError, ValueError):
            raise RankFailedError(peer, self.describe(peer)) from None

    def recv(self, peer: int, wait: bool = False) -> bytes:
        """The next message from peer; wait=True waits without the channel's timeout."""
        try:
            self._poll(peer, wait)
            return self.conns[peer].recv_bytes()
        except (OSError, EOFError, ValueError):
            raise RankFailedError(peer, self.describe(peer)) from None

    def recv_into(self, peer: int, out: np.ndarray) -> np.ndarray:
        """The next message from peer, written into the contiguous array out (no copy)."""
        try:
            self._poll(peer, False)
            n = self.conns[peer].recv_bytes_into(memoryview(out).cast("B"))
        except BufferTooShort:
            raise RankFailedError(peer, f"sent more than the {out.nbytes} bytes expected") from None
        except (OSError, EOFError, ValueError):
            raise RankFailedError(peer, self.describe(peer)) from None
        if n != out.nbytes:
            raise RankFailedError(peer, f"sent {n} bytes where {out.nbytes} were expected")
        return out

    def _poll(self, peer: int, wait: bool) -> None:
        if not wait and self.timeout_s is not None and not self.conns[peer].poll(self.timeout_s):
            raise RankFailedError(peer, f"no answer within {self.timeout_s:g}s")

    def broadcast_object(self, obj=None):
        """Rank 0 sends obj to every rank and returns it; other ranks return what rank 0 sent
        (waiting as long as it takes: a worker idles here between steps)."""
        if self.rank == 0:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            for r in self.peers():
                self.send(r, data)
            return obj
        return pickle.loads(self.recv(0, wait=True))

    def close(self) -> None:
        for c in self.conns.values():
            c.close()


class Communicator:
    """The collectives the model calls at more than one rank."""

    rank: int
    world: int
    channel: PipeChannel

    def all_reduce(self, x):
        """Elementwise sum of x over the ranks; every rank gets the same result."""
        raise NotImplementedError

    def all_gather(self, x):
        """x [n, k] from every rank -> [n, world * k], rank 0's columns first."""
        raise NotImplementedError

    def broadcast_object(self, obj=None):
        return self.channel.broadcast_object(obj)

    def abort(self) -> None:
        """Give up on pending collectives (a rank died)."""

    def close(self) -> None:
        self.channel.close()


class CpuCommunicator(Communicator):
    """NumPy arrays over the pipe star: rank 0 sums in rank order (float32, the same bytes on every
    rank, run to run) and sends the result back."""

    def __init__(self, channel: PipeChannel):
        self.channel, self.rank, self.world = channel, channel.rank, channel.world

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        ch = self.channel
        if self.rank != 0:
            ch.send(0, x)
            return ch.recv_into(0, np.empty_like(x))
        total = x.copy()
        for r in ch.peers():
            total += ch.recv_into(r, np.empty_like(x))
        for r in ch.peers():
            ch.send(r, total)
        return total

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        ch = self.channel
        full = np.empty(x.shape[:-1] + (self.world * x.shape[-1],), x.dtype)
        if self.rank != 0:
            ch.send(0, x)
            return ch.recv_into(0, full)
        parts = [x] + [ch.recv_into(r, np.empty_like(x)) for r in ch.peers()]
        np.concatenate(parts, axis=-1, out=full)
        for r in ch.peers():
            ch.send(r, full)
        return full

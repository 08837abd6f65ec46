"""Rank 0's side of a tensor-parallel group: it starts ranks 1..N-1 (multiprocessing spawn, one
GPU each), waits until every one is ready, agrees the KV cache size, sends each step's
SchedulerOutput before running it, and turns any rank's death into a stop of all of them.

Worker ranks ignore SIGINT and SIGTERM (a Ctrl-C or a service stop reaches the whole process
group): rank 0 stops them, and they exit by themselves when rank 0 goes away."""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import multiprocessing as mp
import signal
import sys
import threading
import time
from multiprocessing.connection import wait as wait_any

from .comm import CpuCommunicator, PipeChannel, RankFailedError
from .layout import ShardLayout
from .parallel import TensorParallel
from .shard import check_shardable

log = logging.getLogger("pocketcupy")

READY_TIMEOUT_S = 1800.0   # loading a shard of a large model from a cold disk
STEP_TIMEOUT_S = 600.0     # rank 0 waiting for another rank's part of a collective
STOP_TIMEOUT_S = 10.0      # a stopping rank gets this long before SIGKILL

_failure_handler = None


def set_failure_handler(fn) -> None:
    """What this process does after a rank died and the others were stopped: fn(RankFailedError).
    The library's default is nothing more (the engine's next step raises the error); the server
    exits."""
    global _failure_handler
    _failure_handler = fn


@contextlib.contextmanager
def _main_module_hidden():
    """Start spawned ranks without re-running the caller's script in them. multiprocessing's spawn
    re-imports __main__ in the child, which fails for a plain script that builds an Engine at top
    level (no `if __name__ == "__main__"` guard); a rank needs nothing from __main__ (its target
    lives in pocketcupy.dist.worker), so the main module's spec and file are hidden while it starts."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def start_ranks(args, ckpt, device: str) -> "RankGroup | None":
    """None on one rank. Otherwise checks that the model splits args.tensor_parallel_size ways
    (ValueError before anything starts) and starts the other ranks."""
    world = args.tensor_parallel_size
    if world == 1:
        return None
    from ..models.registry import model_class

    splits = model_class(ckpt.config).TP_SPLITS
    if splits is None:
        raise ValueError(f"tensor_parallel_size: architecture {ckpt.config.architecture!r} runs on one rank only "
                         f"for now, got {world}")
    for r in range(world):
        check_shardable(ckpt.tensors, splits, ShardLayout.of(ckpt.config, r, world))
    if device == "cuda":
        import cupy

        from .nccl import nccl_module

        nccl_module()
        if cupy.cuda.runtime.getDeviceCount() < world:
            raise ValueError(f"tensor_parallel_size: {world} ranks need {world} GPUs, "
                             f"{cupy.cuda.runtime.getDeviceCount()} visible")
    rank_args = dataclasses.replace(args, model=ckpt.path, device=device, progress=False)
    return RankGroup(rank_args, ckpt.config)


class RankGroup:
    def __init__(self, args, config):
        from .worker import run_rank

        self.world, self.device = args.tensor_parallel_size, args.device
        self.procs: dict[int, mp.Process] = {}
        self.status: dict = {}          # rank -> Connection: ("ready", kv_blocks) or ("error", text)
        self.errors: dict[int, str] = {}
        self.failure: RankFailedError | None = None
        self.comm = None
        self.ready = self.closing = False
        self._lock = threading.Lock()
        # every poll / join of a rank's process: multiprocessing's Popen is not thread-safe, and the
        # thread whose waitpid loses the race to another would read a killed rank as still running
        self._reap = threading.RLock()
        self._stopped = threading.Event()   # set once every worker rank has been reaped
        uid = None
        if self.device == "cuda":
            from .nccl import unique_id

            uid = unique_id()
        ctx = mp.get_context("spawn")
        conns = {}
        atexit.register(self.close)
        try:
            for r in range(1, self.world):
                mine, theirs = ctx.Pipe(duplex=True)
                status_recv, status_send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=run_rank, args=(r, args, theirs, status_send, uid),
                                name=f"pocketcupy-rank{r}", daemon=True)
                with _main_module_hidden():
                    p.start()
                theirs.close()
                status_send.close()
                self.procs[r], self.status[r], conns[r] = p, status_recv, mine
                log.info("tensor parallel: started rank %d of %d (pid %d)", r, self.world, p.pid)
            channel = PipeChannel(0, self.world, conns, self.describe, STEP_TIMEOUT_S)
            self.comm = self._communicator(channel, uid)
        except BaseException:
            for c in conns.values():
                c.close()
            self.close()
            raise
        self.tp = TensorParallel(ShardLayout.of(config, 0, self.world), self.comm)

    def _communicator(self, channel: PipeChannel, uid):
        if self.device != "cuda":
            return CpuCommunicator(channel)
        from .nccl import NcclCommunicator

        # ncclCommInitRank returns once every rank has joined: wait for it in a thread, so a rank
        # that dies first is reported instead of waited for
        box: dict = {}

        def init():
            try:
                box["comm"] = NcclCommunicator(channel, uid, 0)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                box["error"] = e

        t = threading.Thread(target=init, name="pocketcupy-nccl-init", daemon=True)
        t.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while t.is_alive():
            t.join(0.2)
            self._raise_if_dead()
            if time.monotonic() > deadline:
                raise RankFailedError(1, f"NCCL set-up did not finish within {READY_TIMEOUT_S:.0f}s")
        if "error" in box:
            raise box["error"]
        return box["comm"]

    # --- readiness -----------------------------------------------------------------------
    def agree_num_blocks(self, own: int) -> int:
        """Waits for every rank's readiness marker (it carries the KV blocks that rank has room
        for), then sends every rank the smallest: the same pool everywhere."""
        capacity = self._wait_ready(READY_TIMEOUT_S)
        num_blocks = min([own, *capacity.values()])
        self.comm.broadcast_object(num_blocks)
        self.ready = True
        log.info("tensor parallel: %d ranks ready (pids %s); %d KV blocks on each", self.world,
                 ", ".join(str(p.pid) for p in self.procs.values()), num_blocks)
        threading.Thread(target=self._monitor, name="pocketcupy-rank-monitor", daemon=True).start()
        return num_blocks

    def _wait_ready(self, timeout: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        capacity: dict[int, int] = {}
        while len(capacity) < len(self.procs):
            left = deadline - time.monotonic()
            waiting = [r for r in self.procs if r not in capacity]
            if left <= 0:
                raise RankFailedError(waiting[0], f"not ready after {timeout:.0f}s")
            wait_any([self.status[r] for r in waiting] + [self.procs[r].sentinel for r in waiting], left)
            for r in waiting:
                msg = self._read_status(r)
                if msg is not None and msg[0] == "ready":
                    capacity[r] = int(msg[1])
                elif msg is not None or not self._alive(r):
                    raise RankFailedError(r, self.describe(r))
        return capacity

    def _read_status(self, r: int):
        conn = self.status[r]
        try:
            if not conn.poll():
                return None
            msg = conn.recv()
        except (EOFError, OSError):
            return ("gone",)
        if msg[0] == "error":
            self.errors[r] = msg[1]
        return msg

    def _alive(self, r: int) -> bool:
        with self._reap:
            return self.procs[r].is_alive()

    def _raise_if_dead(self) -> None:
        for r in self.procs:
            if not self._alive(r):
                raise RankFailedError(r, self.describe(r))

    def describe(self, r: int) -> str:
        """Why rank r is gone: its own error message, the signal that killed it, or its exit code."""
        if self.failure is not None and self.failure.rank != r:
            return f"stopped after rank {self.failure.rank} failed"
        p = self.procs[r]
        self._read_status(r)
        with self._reap:
            p.join(5.0)          # a killed rank tears down its memory before it can be reaped
            exitcode = p.exitcode
        if r in self.errors:
            how = self.errors[r]
        elif exitcode is None:
            how = "its connection closed while the process still runs"
        elif exitcode < 0:
            try:
                how = f"killed by signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        return f"{how} (pid {p.pid})"

    # --- steps and failures ----------------------------------------------------------------
    def wrap(self, runner) -> "GroupRunner":
        return GroupRunner(runner, self)

    def _monitor(self) -> None:
        sentinels = {p.sentinel: r for r, p in self.procs.items()}
        dead = wait_any(list(sentinels))
        if not self.closing:
            self.fail(sentinels[dead[0]])

    def fail(self, rank: int, reason: str | None = None) -> None:
        """Rank `rank` failed: record why, stop every other rank, then run the failure handler.
        Returns once the ranks are stopped, whichever thread got there first."""
        with self._lock:
            first = self.failure is None and not self.closing
            if first:
                self.failure = RankFailedError(rank, reason or self.describe(rank))
        if not first:
            self._stopped.wait(STOP_TIMEOUT_S + 5)
            return
        log.error("%s; stopping all %d ranks", self.failure, self.world)
        if self.comm is not None:
            try:
                self.comm.abort()
            except Exception:  # noqa: BLE001 - best effort: the processes are killed next
                pass
        self._stop_workers(0.0)
        self._stopped.set()
        if _failure_handler is not None:
            _failure_handler(self.failure)

    def _stop_workers(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        with self._reap:
            for p in self.procs.values():
                p.join(max(deadline - time.monotonic(), 0.0))
                if p.is_alive():
                    p.kill()
                    p.join(STOP_TIMEOUT_S)

    def close(self) -> None:
        """Tell every rank to stop, wait for them (SIGKILL after STOP_TIMEOUT_S) and reap them."""
        with self._lock:
            if self.closing:
                return
            self.closing = True
        atexit.unregister(self.close)
        if self.failure is None and self.comm is not None:
            try:
                self.comm.broadcast_object(None)
            except RankFailedError:
                pass
        self._stop_workers(STOP_TIMEOUT_S if self.ready else 0.0)
        self._stopped.set()
        if self.comm is not None:
            self.comm.close()
        for c in self.status.values():
            c.close()


class GroupRunner:
    """Rank 0's runner: each step's SchedulerOutput goes to every rank, then all run the same
    forward. Any failure during a step ends the group (the ranks could not stay in step)."""

    def __init__(self, runner, group: RankGroup):
        self.runner, self.group = runner, group

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def execute(self, out, feed=None, sample_params=None):
        """sample_params is not passed on: rank 0's graphs keep the sampler outside, so that every
        rank captures the same graphs (a capture runs the forward's collectives once)."""
        return self._on_every_rank(out, lambda: self.runner.execute(out, feed))

    def roll_back(self, out, kept) -> None:
        """ModelRunner.roll_back on every rank: the kept tokens run again through the collectives."""
        self._on_every_rank(RollBack(out, kept), lambda: self.runner.roll_back(out, kept))

    def run_drafts(self, drafter, plan):
        """MTPDrafter.run(plan) on every rank (the plan is the message): the MTP layer's forwards and their
        collectives in step; the drafts, alike on every rank, rank 0's returned."""
        return self._on_every_rank(plan, lambda: drafter.run(plan))

    def _on_every_rank(self, message, run):
        """Sends message (what the other ranks run) to every rank, then runs rank 0's part."""
        g = self.group
        if g.failure is not None:
            g.fail(g.failure.rank)   # returns once the other ranks are stopped
            raise g.failure
        if g.closing:
            raise RuntimeError("the engine is closed: its tensor-parallel ranks have stopped")
        try:
            g.comm.broadcast_object(message)
            return run()
        except RankFailedError as e:
            g.fail(e.rank, e.reason)
            raise (g.failure or e) from None
        except BaseException as e:
            g.fail(0, f"{type(e).__name__}: {e}")
            raise


@dataclasses.dataclass
class RollBack:
    """A step message: roll back the recurrent state of a verification step (ModelRunner.roll_back)."""
    out: object
    kept: dict

"""A worker rank (1..N-1) of a tensor-parallel group, in its own process: it loads its shard of
the weights, reports ready with the KV blocks it has room for, then runs the forward of every
SchedulerOutput rank 0 sends until it is told to stop (None) or rank 0 goes away."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import traceback

from ..engine import Engine
from ..spec.mtp import MTPPlan
from .comm import CpuCommunicator, PipeChannel
from .group import RollBack
from .layout import ShardLayout
from .parallel import TensorParallel


class RankEngine(Engine):
    """Engine's model half on a worker rank (its shard, KV cache and runner, built by the same
    methods as rank 0's); the scheduler, sampler and tokenizer exist only on rank 0."""

    def __init__(self, args, rank: int, channel: PipeChannel, nccl_uid):
        from ..loader import load_checkpoint

        self.args, self.device = args, args.device
        if self.device == "cuda":
            import cupy

            from .nccl import NcclCommunicator

            cupy.cuda.Device(rank).use()   # this rank's GPU, for everything this process allocates
            self.comm = NcclCommunicator(channel, nccl_uid, rank)   # before loading: rank 0 waits for it
        else:
            self.comm = CpuCommunicator(channel)
        ckpt = load_checkpoint(args.model, mtp=args.speculative_method == "mtp")
        self.model_path, self.config = ckpt.path, ckpt.config
        self._load_shard(ckpt, TensorParallel(ShardLayout.of(ckpt.config, rank, args.tensor_parallel_size),
                                              self.comm))
        self.mtp_model = self._load_mtp_model(ckpt)   # its shard, with the target's

    def serve(self) -> None:
        num_blocks = self.comm.broadcast_object()
        if num_blocks is None:
            return
        runner = self._make_runner(num_blocks)
        drafter = None if self.mtp_model is None else self._make_mtp_drafter(num_blocks)
        while (msg := self.comm.broadcast_object()) is not None:
            if isinstance(msg, RollBack):
                runner.roll_back(msg.out, msg.kept)
            elif isinstance(msg, MTPPlan):
                drafter.run(msg)
            else:
                hidden = runner.execute(msg).pre_norm_hidden
                if hidden is not None:   # as rank 0's proposer takes it, for the MTP layer's next plan
                    drafter.take(hidden)


def run_rank(rank: int, args, conn, status, nccl_uid) -> None:
    """Process entry point (multiprocessing spawn)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    try:
        engine = RankEngine(args, rank, PipeChannel(rank, args.tensor_parallel_size, {0: conn}), nccl_uid)
        status.send(("ready", engine._num_kv_blocks()))
        engine.serve()
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, then this process ends
        traceback.print_exc()
        try:
            status.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        sys.stderr.flush()
        os._exit(1)


def _exit_with_parent() -> None:
    """A rank never outlives rank 0, however rank 0 ends."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch():
        from multiprocessing.connection import wait

        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="pocketcupy-parent-watch", daemon=True).start()

"""Tensor parallelism: a model split over ranks (one GPU each, or processes on the CPU).

layout.py   which heads (attention, Gated DeltaNet) / MLP columns / vocabulary rows a rank holds
shard.py    a rank's part of a stored weight, cut from the memory map before it is materialised
parallel.py what the model calls: shards, all-reduce after row-parallel layers, vocab-parallel
            embedding and LM head (identities on one rank)
comm.py     the pipe star through rank 0, the CPU communicator, RankFailedError
nccl.py     the NCCL communicator (cupy.cuda.nccl), captured inside decode CUDA graphs
group.py    rank 0's side: start, readiness, per-step broadcast, failure -> stop of all ranks
worker.py   ranks 1..N-1
"""
from .comm import RankFailedError
from .group import set_failure_handler

__all__ = ["RankFailedError", "set_failure_handler"]

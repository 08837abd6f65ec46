"""NCCL collectives for the CUDA backend (cupy.cuda.nccl), one GPU per rank.

Rank 0 makes the unique id (nccl.get_unique_id()) before it starts the other ranks and hands it
to them; every rank then calls ncclCommInitRank, which returns once all of them have. Collectives
run on the current CuPy stream, so inside DecodeGraphs' capture they become nodes of the decode
graph. Objects (the step broadcast) still go over the pipe channel.

Not yet run on a machine with two GPUs: written against CuPy's documented API
(NcclCommunicator(ndev, commId, rank); allReduce(sendbuf, recvbuf, count, datatype, op, stream);
allGather(sendbuf, recvbuf, count, datatype, stream))."""
from __future__ import annotations

from .comm import Communicator, PipeChannel


def nccl_module():
    """cupy.cuda.nccl, or a ValueError saying how to get it."""
    try:
        from cupy.cuda import nccl
    except ImportError:
        nccl = None
    if nccl is None or not getattr(nccl, "available", False):
        raise ValueError("tensor_parallel_size: the CUDA backend needs NCCL for more than one rank "
                         "(pip install nvidia-nccl-cu12, see requirements-gpu.txt)")
    return nccl


def unique_id():
    return nccl_module().get_unique_id()


class NcclCommunicator(Communicator):
    def __init__(self, channel: PipeChannel, uid, device: int):
        """Blocks until every rank has joined; call with this rank's GPU chosen."""
        import cupy

        self.cp, self.nccl = cupy, nccl_module()
        self.channel, self.rank, self.world = channel, channel.rank, channel.world
        with cupy.cuda.Device(device):
            self.comm = self.nccl.NcclCommunicator(self.world, uid, self.rank)

    def _stream(self) -> int:
        return self.cp.cuda.get_current_stream().ptr

    def all_reduce(self, x):
        x = self.cp.ascontiguousarray(x, dtype=self.cp.float32)
        self.comm.allReduce(x.data.ptr, x.data.ptr, x.size, self.nccl.NCCL_FLOAT32, self.nccl.NCCL_SUM,
                            self._stream())
        return x

    def all_gather(self, x):
        cp = self.cp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        n, k = x.shape
        parts = cp.empty((self.world, n, k), cp.float32)
        self.comm.allGather(x.data.ptr, parts.data.ptr, x.size, self.nccl.NCCL_FLOAT32, self._stream())
        return cp.ascontiguousarray(parts.transpose(1, 0, 2)).reshape(n, self.world * k)

    def abort(self) -> None:
        """ncclCommAbort: pending collectives give up (a rank died); the communicator is gone after."""
        if self.comm is not None:
            comm, self.comm = self.comm, None
            comm.abort()

    def close(self) -> None:
        if self.comm is not None:
            comm, self.comm = self.comm, None
            comm.destroy()
        super().close()

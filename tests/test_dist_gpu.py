"""Tensor parallel over NCCL on the GPU: the collectives of a one-rank communicator, eager and
inside a CUDA graph (one GPU); on two GPUs greedy tokens equal one GPU's, the decode graphs (with
the all-reduce inside) give the eager path's tokens, and a killed rank is named within seconds."""
import os
import signal
import time

import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.dist import RankFailedError


def _gpus() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(_gpus() < 2, reason="needs two GPUs")
PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time"]
PARAMS = SamplingParams(temperature=0, max_tokens=24)


def tokens(path, tp, **kw):
    eng = Engine(path, device="cuda", progress=False, tensor_parallel_size=tp, kv_cache_memory=1 << 30, **kw)
    try:
        outs = [o.outputs[0].token_ids for o in eng.generate(PROMPTS, PARAMS)]
        outs.append(eng.generate(PROMPTS[0], PARAMS)[0].outputs[0].token_ids)   # batch 1: a graph bucket
        return outs, eng
    finally:
        eng.close()


def test_nccl_collectives_inside_a_graph():
    import cupy as cp

    from pocketcupy.dist.comm import PipeChannel
    from pocketcupy.dist.nccl import NcclCommunicator, nccl_module, unique_id

    try:
        nccl_module()
    except ValueError as e:
        pytest.skip(str(e))
    comm = NcclCommunicator(PipeChannel(0, 1, {}), unique_id(), 0)
    x = cp.arange(12, dtype=cp.float32).reshape(3, 4)
    assert cp.array_equal(comm.all_reduce(x.copy()), x) and cp.array_equal(comm.all_gather(x), x)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        buf = x.copy()
        stream.synchronize()
        stream.begin_capture()
        y = comm.all_reduce(buf) * 2
        z = comm.all_gather(buf)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    assert cp.array_equal(y, x * 2) and cp.array_equal(z, x)
    comm.close()


@two_gpus
def test_two_gpus_give_one_gpus_tokens(smollm2_gguf):
    one, _ = tokens(smollm2_gguf, 1)
    two, eng = tokens(smollm2_gguf, 2)
    assert two == one
    assert eng.runner.graphs is not None and eng.runner.graphs.graphs    # the all-reduce ran inside graphs
    eager, _ = tokens(smollm2_gguf, 2, cuda_graphs=False)
    assert eager == two


@two_gpus
def test_a_killed_rank_is_named(smollm2_gguf):
    eng = Engine(smollm2_gguf, device="cuda", progress=False, tensor_parallel_size=2, kv_cache_memory=1 << 30)
    eng.generate("hi", SamplingParams(max_tokens=2))
    t0 = time.monotonic()
    os.kill(eng.ranks.procs[1].pid, signal.SIGKILL)
    with pytest.raises(RankFailedError, match="rank 1 failed: killed by signal SIGKILL"):
        for _ in range(100):
            eng.generate("hi", SamplingParams(max_tokens=2))
    assert time.monotonic() - t0 < 15
    eng.close()

"""The CPU communicator between real processes (multiprocessing spawn, pipes through rank 0):
all_reduce sums in rank order and every rank gets the same bytes, all_gather, the object
broadcast, and a peer that dies or goes silent gives RankFailedError naming it, never a hang."""
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from pocketcupy.dist.comm import CpuCommunicator, PipeChannel, RankFailedError

WORLD = 3


def part(rank: int, shape=(5, 7)) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(shape, dtype=np.float32) * 10 ** rank


def collectives(comm: CpuCommunicator, obj=None):
    step = comm.broadcast_object(obj)
    return step, comm.all_reduce(part(comm.rank)), comm.all_gather(part(comm.rank, (2, 3)))


def peer_main(rank: int, conn, results, behaviour: str) -> None:
    if behaviour == "exit":
        os._exit(7)
    if behaviour == "silent":
        time.sleep(30)
    comm = CpuCommunicator(PipeChannel(rank, WORLD, {0: conn}))
    results.send(collectives(comm))
    try:
        comm.all_reduce(part(rank))         # rank 0 has closed its pipes: this must fail, not hang
    except RankFailedError as e:
        results.send(("failed", e.rank))


def start_peers(behaviours):
    ctx = mp.get_context("spawn")
    conns, procs, results = {}, {}, {}
    for r, how in enumerate(behaviours, start=1):
        mine, theirs = ctx.Pipe()
        res_recv, res_send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=peer_main, args=(r, theirs, res_send, how), daemon=True)
        p.start()
        theirs.close()
        res_send.close()
        conns[r], procs[r], results[r] = mine, p, res_recv
    return conns, procs, results


def test_collectives_agree_on_every_rank():
    conns, procs, results = start_peers(["ok", "ok"])
    comm = CpuCommunicator(PipeChannel(0, WORLD, conns, timeout_s=60))
    step = {"scheduled": [1, 2, 3], "text": "héllo"}
    got0 = collectives(comm, step)
    comm.close()
    want_sum = (part(0) + part(1)) + part(2)             # float32, rank order
    want_gather = np.concatenate([part(r, (2, 3)) for r in range(WORLD)], axis=1)
    assert got0[0] == step and got0[1].dtype == np.float32
    assert np.array_equal(got0[1], want_sum) and np.array_equal(got0[2], want_gather)
    for r in (1, 2):
        obj, reduced, gathered = results[r].recv()
        assert obj == step and reduced.tobytes() == got0[1].tobytes() and np.array_equal(gathered, want_gather)
        assert results[r].recv() == ("failed", 0)
        procs[r].join(10)
        assert procs[r].exitcode == 0


def test_a_dead_or_silent_peer_is_named():
    conns, procs, _ = start_peers(["ok", "exit"])
    procs[2].join(30)

    def describe(r):
        return f"exited with code {procs[r].exitcode}"

    comm = CpuCommunicator(PipeChannel(0, WORLD, conns, describe, timeout_s=60))
    t0 = time.monotonic()
    with pytest.raises(RankFailedError, match="rank 2 failed: exited with code 7") as err:
        comm.broadcast_object("step")
        comm.all_reduce(part(0))
    assert err.value.rank == 2 and time.monotonic() - t0 < 10
    comm.close()
    conns, procs, _ = start_peers(["silent", "silent"])
    comm = CpuCommunicator(PipeChannel(0, WORLD, conns, timeout_s=0.5))
    with pytest.raises(RankFailedError, match="rank 1 failed: no answer within 0.5s"):
        comm.all_reduce(part(0))
    comm.close()
    for p in procs.values():
        p.kill()
        p.join(10)

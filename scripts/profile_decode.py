"""Where a decode step's time goes: the step's wall time split into host time and time blocked
waiting for the GPU's sampled tokens (an unprofiled run; with async scheduling the host prepares
the next step while the GPU runs, so a step is host-bound when blocked_ms is near 0 and GPU-bound
otherwise), a host-side profile of the step loop (cProfile, a second run, printed to stderr) and
the GPU time of one replayed decode graph. Prints one JSON object.

    python scripts/profile_decode.py [MODEL] [--tokens 256] [--batch 1]
"""
import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_args  # noqa: E402
from pocketcupy import Engine, SamplingParams  # noqa: E402
from pocketcupy.sampler import PendingSample  # noqa: E402


def replay_us(graphs, b: int, reps: int = 200) -> float:
    """Microseconds per replay of the decode graph of bucket b (reps back to back): the one the last
    step replayed where it was of bucket b, else the one with the sampler inside where greedy or
    plain sampling steps captured it."""
    import cupy as cp

    key = graphs.last_key
    if key is None or key.bucket != b:
        key = min((k for k in graphs.graphs if k.bucket == b and not k.shared), key=lambda k: (not k.sample, k.slot))
    graph = graphs.graphs[key]
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(graphs.stream)
    for _ in range(reps):
        graph.launch(graphs.stream)
    end.record(graphs.stream)
    end.synchronize()
    return round(cp.cuda.get_elapsed_time(start, end) * 1e3 / reps, 1)


def recaptured_us(eng, b: int, reps: int = 200) -> float:
    """Captures the decode graphs of bucket b again (as the engine now launches them), runs two real
    steps to put the steps' inputs into both slots' buffers, and returns replay_us of it."""
    graphs = eng.runner.graphs
    for key in list(graphs.graphs):
        if key.bucket == b:
            graphs.capture(*key)
    eng.step()
    eng.step()
    graphs.stream.synchronize()
    return replay_us(graphs, b, reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    eng = Engine(a.model, device=bench_args.device(ap, a.device), progress=False)
    eng.generate(["warm up"] * a.batch, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    blocked = [0.0]
    result = PendingSample.result

    def timed_result(self):
        t = time.perf_counter()
        try:
            return result(self)
        finally:
            blocked[0] += time.perf_counter() - t

    PendingSample.result = timed_result
    try:
        steps, wall = decode_steps(eng, a, blocked=blocked)
    finally:
        PendingSample.result = result
    prof = cProfile.Profile()
    prof.enable()
    prof_steps, prof_wall = decode_steps(eng, a, "p")
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
    print(s.getvalue(), file=sys.stderr)

    g = eng.runner.graphs
    ms = 1e3 / steps
    print(json.dumps({"steps": steps, "step_ms": round(wall * ms, 3), "host_ms": round((wall - blocked[0]) * ms, 3),
                      "blocked_ms": round(blocked[0] * ms, 3), "tok_s": round(steps * a.batch / wall, 1),
                      "profiled_step_ms": round(prof_wall / prof_steps * 1e3, 3),
                      "graph_replay_us": None if g is None else replay_us(g, g.bucket_for(a.batch))}))


def decode_steps(eng, a, tag: str = "", blocked: list | None = None) -> tuple[int, float]:
    """a.batch greedy requests of a.tokens tokens, prefilled and 3 steps in before the clock starts
    (and blocked[0] is zeroed); (steps, seconds) until they finish."""
    p = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    for i in range(a.batch):
        eng.add_request(f"r{tag}{i}", f"Request {i} says", p)
    for _ in range(3):
        eng.step()
    if blocked:
        blocked[0] = 0.0
    steps, t0 = 0, time.perf_counter()
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    return steps, time.perf_counter() - t0


if __name__ == "__main__":
    main()

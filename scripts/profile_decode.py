"""Where a decode step's time goes: host-side profile of the step loop (cProfile) and the GPU
time of one replayed decode graph. Prints one JSON object.

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
from pocketcupy import Engine, SamplingParams  # noqa: E402


def replay_us(graphs, b: int, reps: int = 200) -> float:
    """Microseconds per replay of the decode graph of bucket b (reps back to back)."""
    import cupy as cp

    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(graphs.stream)
    for _ in range(reps):
        graphs.graphs[b].launch(graphs.stream)
    end.record(graphs.stream)
    end.synchronize()
    return round(cp.cuda.get_elapsed_time(start, end) * 1e3 / reps, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    eng = Engine(a.model, device="cuda", progress=False)
    p = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    eng.generate(["warm up"] * a.batch, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for i in range(a.batch):
        eng.add_request(f"r{i}", f"Request {i} says", p)
    for _ in range(3):
        eng.step()  # prefill + first decode steps outside the profile
    prof = cProfile.Profile()
    steps, t0 = 0, time.perf_counter()
    prof.enable()
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    prof.disable()
    wall = time.perf_counter() - t0
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
    print(s.getvalue(), file=sys.stderr)

    g = eng.runner.graphs
    print(json.dumps({"steps": steps, "step_ms": round(wall / steps * 1e3, 3),
                      "tok_s": round(steps * a.batch / wall, 1),
                      "graph_replay_us": replay_us(g, g.bucket_for(a.batch))}))


if __name__ == "__main__":
    main()

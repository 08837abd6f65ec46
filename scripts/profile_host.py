"""Host (Python) cost of the engine's decode step, without the model: runs the CPU engine with
N requests of random prompts decoding M tokens greedily (ignore_eos) and prints one JSON object.

    python scripts/profile_host.py [--model PATH] [--requests 64] [--tokens 32] [--prompt-len 64]

host_ms_per_step is the wall time of a decode step minus the time inside runner.model.forward and
compute_logits and minus the NumPy sampler's [B, V] array math (its call's time minus that of
the same call on [B, 1] logits, which does the same row handling). What is left is what the GPU
path also pays on the host every step. A second, identical run under cProfile (on a clock that
stands still inside the model) gives the top host functions by cumulative time; cProfile's own
cost per Python call makes those times about 2-3x the unprofiled ones, so compare them with each
other, and host_ms_per_step across versions.
"""
import argparse
import cProfile
import json
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pocketcupy import Engine, SamplingParams  # noqa: E402


class StepClock:
    """perf_counter wrappers around the model and the sampler of one engine, and `virtual`, a clock
    for cProfile that stands still while the model runs."""

    def __init__(self, eng: Engine):
        self.model_s = 0.0
        self.sampler_array_s = 0.0   # sampler call minus the same call on [B, 1] logits
        self.replica_s = 0.0         # the [B, 1] calls themselves (not part of the engine's step)
        self.split_sampler = True
        self._paused_s = 0.0
        self._frozen_at: float | None = None
        model = eng.runner.model
        for name in ("forward", "compute_logits"):
            setattr(model, name, self._timed_model(getattr(model, name)))
        launch = eng.sampler.launch   # the engine's one call into the sampler (synchronous on NumPy)
        eng.sampler.launch = lambda logits, rows: self._timed_sampler(launch, logits, rows)

    def virtual(self) -> float:
        now = time.perf_counter() if self._frozen_at is None else self._frozen_at
        return now - self._paused_s

    def _timed_model(self, fn):
        def wrapped(*args, **kwargs):
            t0 = self._frozen_at = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self.model_s += dt
                self._paused_s += dt
                self._frozen_at = None
        return wrapped

    def _timed_sampler(self, sampler, logits, rows):
        t0 = time.perf_counter()
        out = sampler(logits, rows)
        if self.split_sampler:
            # the same call on [B, 1] logits: the row handling without the [B, V] array math (greedy
            # rows without masks or penalties keep no state, so the second call changes nothing)
            t1 = self._frozen_at = time.perf_counter()
            sampler(np.ascontiguousarray(logits[:, :1]), rows)
            t2 = time.perf_counter()
            self.sampler_array_s += max((t1 - t0) - (t2 - t1), 0.0)
            self.replica_s += t2 - t1
            self._paused_s += t2 - t1
            self._frozen_at = None
        return out


def is_decode_step(sched_out, n: int) -> bool:
    return len(sched_out.scheduled) == n and all(len(s.token_ids) == 1 for s in sched_out.scheduled)


def run_batch(eng: Engine, clock: StepClock, tag: str, n: int, m: int, prompt_len: int, seed: int,
              profiler: cProfile.Profile | None = None) -> dict:
    """Adds n requests, runs them to the end; times the steps where all n decode one token. With a
    profiler, profiles the steps after the first decode step (all decode steps too)."""
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
    for i in range(n):
        eng.add_request(f"{tag}-{i}", rng.integers(0, eng.config.vocab_size, prompt_len).tolist(), params)
    schedule, last = eng.scheduler.schedule, {}

    def spy():
        last["out"] = schedule()
        return last["out"]

    eng.scheduler.schedule = spy
    steps, profiled, wall, model, array, decoding, host = 0, 0, 0.0, 0.0, 0.0, False, []
    try:
        while eng.has_unfinished_requests():
            m0, a0, r0 = clock.model_s, clock.sampler_array_s, clock.replica_s
            prof = profiler if decoding else None
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            eng.step()
            dt = time.perf_counter() - t0 - (clock.replica_s - r0)
            if prof is not None:
                prof.disable()
                profiled += is_decode_step(last["out"], n)
            decoding = is_decode_step(last["out"], n)
            if decoding:
                steps += 1
                wall += dt
                model += clock.model_s - m0
                array += clock.sampler_array_s - a0
                host.append(dt - (clock.model_s - m0) - (clock.sampler_array_s - a0))
    finally:
        del eng.scheduler.schedule
    return {"steps": steps, "profiled_steps": profiled, "wall_s": wall, "model_s": model, "array_s": array,
            "host_median_s": float(np.median(host)) if host else 0.0}


def top_functions(prof: cProfile.Profile, steps: int, limit: int) -> list[dict]:
    st = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, ncalls, tottime, cumtime, _callers) in st.stats.items():
        if file == __file__:
            continue  # this script's wrappers
        where = f"{os.path.relpath(file) if file.startswith('/') else file}:{line}({func})"
        rows.append({"function": where, "calls_per_step": round(ncalls / steps, 1),
                     "cum_ms_per_step": round(cumtime / steps * 1e3, 3),
                     "self_ms_per_step": round(tottime / steps * 1e3, 3)})
    rows.sort(key=lambda r: -r["cum_ms_per_step"])
    return rows[:limit]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (model_cache.default_model_path)")
    ap.add_argument("--requests", "-n", type=int, default=64)
    ap.add_argument("--tokens", "-m", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    from pocketcupy.model_cache import default_model_path

    # one prefill step, so that every request decodes in lock-step after it
    eng = Engine(a.model or default_model_path(), device="cpu", progress=False, max_num_seqs=max(a.requests, 1),
                 max_num_batched_tokens=max(2048, a.requests * a.prompt_len))
    clock = StepClock(eng)
    run_batch(eng, clock, "warm", min(a.requests, 4), 4, a.prompt_len, seed=1)
    timed = run_batch(eng, clock, "timed", a.requests, a.tokens, a.prompt_len, seed=2)

    prof = cProfile.Profile(clock.virtual)
    clock.split_sampler = False  # the profile shows the sampler's array math as numpy calls
    profiled = run_batch(eng, clock, "prof", a.requests, a.tokens, a.prompt_len, seed=3, profiler=prof)

    steps = max(timed["steps"], 1)
    per = lambda x: round(x / steps * 1e3, 3)  # noqa: E731  ms per decode step
    print(json.dumps({
        "requests": a.requests, "tokens": a.tokens, "prompt_len": a.prompt_len, "decode_steps": timed["steps"],
        "step_ms": per(timed["wall_s"]), "model_ms": per(timed["model_s"]),
        "sampler_array_ms": per(timed["array_s"]),
        "host_ms_per_step": per(timed["wall_s"] - timed["model_s"] - timed["array_s"]),
        "host_ms_per_step_median": round(timed["host_median_s"] * 1e3, 3),
        "profiled_steps": profiled["profiled_steps"],
        "top_functions": top_functions(prof, max(profiled["profiled_steps"], 1), a.top),
    }, indent=1))


if __name__ == "__main__":
    main()

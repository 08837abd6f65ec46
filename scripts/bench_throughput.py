"""Offline serving throughput with continuous batching: C concurrent requests (random prompts
of --prompt tokens, --output tokens each, EOS ignored) for each C in --concurrency; output
tok/s and TTFT/TPOT percentiles; the TPOT of one request while C-1 others run against its idle
TPOT (the largest C: "probe", the others' prefills done before it joins; and "tpot_64_vs_idle",
the median over 64 requests submitted together, whose prefills fall among their decode steps);
and the TTFT of a request whose --prefix-tokens long prefix is already cached (medians over
PREFIX_ROUNDS fresh prefixes, each timed cold and then cached). Levels of at most
16 requests run --repeats times, pooled (tok/s over the summed wall time, percentiles over all their
requests): at 1 request the TTFT is otherwise a single sample. Prints one JSON object.

    python scripts/bench_throughput.py MODEL [--concurrency 1 4 16 64 256]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_args  # noqa: E402
from pocketcupy import SamplingParams  # noqa: E402
from pocketcupy.quant.kv_quant import KV_CACHE_DTYPES  # noqa: E402


PREFIX_ROUNDS = 5    # a fresh prefix each: cold then cached TTFT; medians (one cached sample moved 15-28 ms)


def pct(xs, q):
    return round(float(np.percentile(xs, q)) * 1e3, 2) if len(xs) else None


def run_batch(engine, prompts, output_tokens):
    """All prompts submitted at once; returns wall seconds, TTFTs and TPOTs (seconds)."""
    p = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    ids = [f"tp-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, p)
    first, last, count = {}, {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter()
            n = len(out.outputs[0].token_ids)
            if n and out.request_id not in first:
                first[out.request_id] = now
            last[out.request_id], count[out.request_id] = now, n
    wall = time.perf_counter() - t0
    ttft = [first[r] - t0 for r in ids]
    tpot = [(last[r] - first[r]) / (count[r] - 1) for r in ids if count[r] > 1]
    return wall, ttft, tpot, sum(count.values())


def probe_tpot(engine, others, probe, output_tokens):
    """TPOT (seconds) of one request decoding among `others` running requests: they are submitted
    together, the probe joins once each has its first token (so no prefill but its own falls in
    its decode), and they outlive it (twice its output, then aborted)."""
    ids = [f"bg-{time.monotonic_ns()}-{i}" for i in range(len(others))]
    for rid, prompt in zip(ids, others):
        engine.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=2 * output_tokens + 8,
                                                       ignore_eos=True))
    started = set()
    while len(started) < len(ids):
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    pid = f"probe-{time.monotonic_ns()}"
    engine.add_request(pid, probe, SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True))
    first = last = None
    count, finished = 0, False
    while not finished:
        for o in engine.step():
            if o.request_id == pid and o.outputs[0].token_ids:
                last, count, finished = time.perf_counter(), len(o.outputs[0].token_ids), o.finished
                first = first or last
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    return (last - first) / (count - 1) if count > 1 else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--concurrency", type=bench_args.count(), nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--prompt", type=bench_args.count(), default=512)
    ap.add_argument("--output", type=bench_args.count(), default=256)
    ap.add_argument("--prefix-tokens", type=bench_args.count(0), default=8192 - 128, help="0: no prefix run")
    ap.add_argument("--repeats", type=bench_args.count(), default=3,
                    help="runs of each level of at most 16 requests, pooled")
    ap.add_argument("--async-scheduling", default="auto", choices=("auto", "on", "off"),
                    help="launch each step before the last one's tokens reach the host (auto: on for CUDA)")
    ap.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                    help="KV cache pages: the backend's float type, or quantized (quant/kv_quant.py)")
    a = ap.parse_args(argv)
    top = max(a.concurrency)
    engine = bench_args.engine(ap, a.model, device=a.device, progress=False, max_num_seqs=top,
                               max_num_batched_tokens=8192, async_scheduling=a.async_scheduling,
                               kv_cache_dtype=a.kv_cache_dtype)
    if a.prompt + a.output > engine.max_model_len:
        ap.error(f"--prompt {a.prompt} + --output {a.output} tokens do not fit the model's {engine.max_model_len}")
    rng = np.random.default_rng(0)
    vocab = engine.config.vocab_size

    def prompts(n, length):
        return [rng.integers(100, vocab - 100, length).tolist() for _ in range(n)]

    # warm-up with the measured prompts (16 tokens out outlast the prefill chunks): every kernel
    # the run meets is compiled and every decode batch size's graph captured, also when --concurrency
    # skips levels (1 64 alone had put the captures of 16-48 inside the 64 run: 1,989 against 4,229 tok/s)
    for c in a.concurrency:
        run_batch(engine, prompts(c, a.prompt), min(a.output, 16))
    res = {"model": a.model, "device": engine.device, "prompt": a.prompt, "output": a.output,
           "async_scheduling": a.async_scheduling, "kv_cache_dtype": a.kv_cache_dtype, "runs": {}}
    for c in a.concurrency:
        reps = a.repeats if c <= 16 else 1
        wall, ttft, tpot, n_out = 0.0, [], [], 0
        for _ in range(reps):
            w, t1, t2, n = run_batch(engine, prompts(c, a.prompt), a.output)
            wall, ttft, tpot, n_out = wall + w, ttft + t1, tpot + t2, n_out + n
        res["runs"][str(c)] = {"output_tok_s": round(n_out / wall, 1), "wall_s": round(wall / reps, 2),
                               "repeats": reps, "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
                               "tpot_p50_ms": pct(tpot, 50), "tpot_p99_ms": pct(tpot, 99)}
    runs = res["runs"]
    if "1" in runs and "4" in runs:
        res["speedup_4_vs_1"] = round(runs["4"]["output_tok_s"] / runs["1"]["output_tok_s"], 2)
    if "1" in runs and "64" in runs:
        res["tpot_64_vs_idle"] = round(runs["64"]["tpot_p50_ms"] / runs["1"]["tpot_p50_ms"], 2)
    if "1" in runs and top > 1:
        t = probe_tpot(engine, prompts(top - 1, a.prompt), prompts(1, a.prompt)[0], a.output)
        res["probe"] = {"others": top - 1, "tpot_ms": round(t * 1e3, 2),
                        "vs_idle": round(t * 1e3 / runs["1"]["tpot_p50_ms"], 2)}
    if a.prefix_tokens and a.prefix_tokens + 64 < engine.max_model_len:
        colds, warms = [], []
        for _ in range(1 + PREFIX_ROUNDS):   # the first round compiles the kernels of a chunk over a cached prefix
            prefix = prompts(1, a.prefix_tokens)[0]
            colds.append(run_batch(engine, [prefix + prompts(1, 32)[0]], 1)[1][0])
            warms.append(run_batch(engine, [prefix + prompts(1, 32)[0]], 1)[1][0])
        cold, warm = statistics.median(colds[1:]), statistics.median(warms[1:])
        res["prefix"] = {"tokens": a.prefix_tokens, "rounds": PREFIX_ROUNDS, "ttft_cold_ms": round(cold * 1e3, 2),
                         "ttft_cached_ms": round(warm * 1e3, 2), "ttft_speedup": round(cold / warm, 1),
                         "ttft_cached_samples_ms": [round(w * 1e3, 2) for w in warms[1:]]}
    res["stats"] = engine.stats()
    print(json.dumps(res))


if __name__ == "__main__":
    main()

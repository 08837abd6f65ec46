"""Single-stream speed of model files: load time, prefill tok/s (512 and 2048-token prompts),
batch-1 decode tok/s at 512 and 4096 context, achieved GB/s and the fraction of the measured
copy bandwidth (the roofline). Prints one JSON object.

    python scripts/bench_decode.py MODEL [MODEL ...] [--device cuda] [--decode-tokens 128]
    python scripts/bench_decode.py MODEL --tensor-parallel-size 2     # one GPU per rank

Weight bytes (and GB/s) count the whole model: with tensor parallelism that is all ranks together.
"""
import argparse
import gc
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_args  # noqa: E402
from pocketcupy import SamplingParams  # noqa: E402

# llama.cpp on the same H200 (CUDA graphs on), Llama-3-8B shape, vocab 49152 (shared/GPU.md)
LLAMA_CPP_H200 = {"decode_f16": 198, "decode_q8_0": 224, "decode_q4_k_m": 228,
                  "prefill2048_f16": 19000, "prefill2048_q4_k_m": 8800, "decode_smollm2_q4_1": 677}


def copy_bandwidth(device: str) -> float | None:
    """Device-to-device copy, bytes read + written per second."""
    if device != "cuda":
        return None
    import cupy as cp

    a = cp.empty(1 << 30, cp.uint8)
    b = cp.empty_like(a)
    for _ in range(3):
        b[...] = a
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(20):
        start.record()
        cp.copyto(b, a)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * a.nbytes / float(np.median(times))


def weight_bytes(engine) -> tuple[int, float]:
    """(the stored weights' bytes, those a decode token reads: a routed expert's times the share of
    the experts a token picks). The token embedding counts only as a tied LM head."""
    from pocketcupy.loader import load_checkpoint

    ck = load_checkpoint(engine.model_path)
    nbytes = {name: t.data.nbytes + (0 if t.scales is None else t.scales.nbytes) for name, t in ck.tensors.items()}
    if not engine.config.tie_word_embeddings:
        nbytes.pop("token_embd.weight", None)
    moe = engine.config.moe
    experts = None if moe is None else getattr(moe, "n_routed_experts", None) or moe.num_experts
    picked = 1.0 if moe is None else moe.num_experts_per_tok / experts
    return sum(nbytes.values()), sum(n * (picked if "_exps." in name else 1.0) for name, n in nbytes.items())


def kv_bytes_per_token(engine) -> int:
    return engine._kv_block_bytes() // engine.args.block_size


def random_prompt(engine, n: int, rng) -> list[int]:
    return rng.integers(100, engine.config.vocab_size - 100, n).tolist()


def time_prefill(engine, n: int, rng, repeats: int = 3) -> float:
    p = SamplingParams(temperature=0, max_tokens=1)
    best = float("inf")
    for _ in range(repeats + 1):  # the first run compiles kernels
        t0 = time.perf_counter()
        engine.generate(random_prompt(engine, n, rng), p)
        best = min(best, time.perf_counter() - t0)
    return n / best


def time_decode(engine, context: int, tokens: int, rng) -> float:
    p = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    engine.add_request("bench", random_prompt(engine, context, rng), p)
    stamps = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.outputs[0].delta_token_ids:
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def bench_model(path: str, args, bandwidth, ap=None) -> dict:
    t0 = time.perf_counter()
    engine = bench_args.engine(ap, path, device=args.device, progress=False,
                               max_num_batched_tokens=max(2048, *args.prefill), max_num_seqs=8,
                               kv_cache_memory=args.kv_cache_gb << 30, tensor_parallel_size=args.tensor_parallel_size,
                               async_scheduling=args.async_scheduling)
    longest = max(*args.prefill, max(args.context) + args.decode_tokens)
    if ap is not None and longest > engine.max_model_len:
        engine.close()
        ap.error(f"{path}: --prefill / --context + --decode-tokens need {longest} tokens, the model holds "
                 f"{engine.max_model_len}")
    try:
        return _bench_engine(engine, path, time.perf_counter() - t0, args, bandwidth)
    finally:
        engine.close()


def _bench_engine(engine, path: str, load_s: float, args, bandwidth) -> dict:
    rng = np.random.default_rng(0)
    res = {"model": path, "load_s": round(load_s, 2), "device": engine.device,
           "tensor_parallel_size": args.tensor_parallel_size, "async_scheduling": args.async_scheduling}
    stored, wbytes = weight_bytes(engine)
    res["weight_gb"] = round(stored / 1e9, 3)
    if wbytes != stored:
        res["active_weight_gb"] = round(wbytes / 1e9, 3)   # what a decode token reads (GB/s below)
    for n in args.prefill:
        res[f"prefill{n}_tok_s"] = round(time_prefill(engine, n, rng), 1)
    time_decode(engine, 16, 8, rng)  # warm-up: graphs captured, kernels compiled
    for ctx in args.context:
        tps = time_decode(engine, ctx, args.decode_tokens, rng)
        gbs = tps * (wbytes + kv_bytes_per_token(engine) * (ctx + args.decode_tokens // 2)) / 1e9
        res[f"decode_ctx{ctx}_tok_s"] = round(tps, 1)
        res[f"decode_ctx{ctx}_GB_s"] = round(gbs, 1)
        if bandwidth:
            res[f"decode_ctx{ctx}_roofline_frac"] = round(gbs * 1e9 / bandwidth, 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prefill", type=bench_args.count(), nargs="+", default=[512, 2048])
    ap.add_argument("--context", type=bench_args.count(), nargs="+", default=[512, 4096])
    ap.add_argument("--decode-tokens", type=bench_args.count(2), default=128)
    ap.add_argument("--kv-cache-gb", type=bench_args.count(), default=4,
                    help="KV pool per model (several models load in turn)")
    ap.add_argument("--tensor-parallel-size", type=bench_args.count(), default=1,
                    help="ranks (GPUs) each model is split over")
    ap.add_argument("--async-scheduling", default="auto", choices=("auto", "on", "off"),
                    help="launch each step before the last one's tokens reach the host (auto: on for CUDA)")
    args = ap.parse_args()
    device = bench_args.device(ap, args.device)
    for m in args.models:
        if not os.path.exists(m):
            ap.error(f"model: {m} does not exist")
    bw = copy_bandwidth(device)
    out = {"copy_bandwidth_GB_s": round(bw / 1e9, 1) if bw else None, "models": [],
           "llama_cpp_h200_reference_tok_s": LLAMA_CPP_H200}
    for m in args.models:
        out["models"].append(bench_model(m, args, bw, ap))
        gc.collect()  # the next model needs this one's memory
        if device == "cuda":
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Speculative decoding against plain decoding in the same run: single-stream decode tok/s of chat
prompts (text to copy or repeat, and an open question) without drafts and with n-gram drafts (and
with --draft-model's drafts, and with --mtp the model's own multi-token-prediction layer's) of each --k, with the share of draft tokens kept, tokens per forward, whether the tokens equal the plain
run's (greedy), and the weight-bandwidth equivalent of the tok/s as a fraction of the measured copy
bandwidth (CUDA: above 1 only when drafts are kept). --temperature samples (seeded by --seed, so the
tokens still equal the plain run's) where drafts mostly fail. Prints one JSON object.

    python scripts/bench_spec.py MODEL [--device cuda] [--k 2 4 6] [--max-tokens 128] [--draft-model PATH] [--mtp]
        [--temperature 0.8 --seed 1] [--adaptive on|off|both]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_args  # noqa: E402
from bench_decode import copy_bandwidth, weight_bytes  # noqa: E402
from pocketcupy import SamplingParams  # noqa: E402

CODE = ("def merge_sort(xs):\n    if len(xs) <= 1:\n        return xs\n    mid = len(xs) // 2\n"
        "    left = merge_sort(xs[:mid])\n    right = merge_sort(xs[mid:])\n    out = []\n"
        "    while left and right:\n        out.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n"
        "    return out + left + right\n")
PROMPTS = {
    "copy_code": "Add a docstring to this function and return the whole function:\n" + CODE,
    "repeat": "Repeat this sentence five times, one per line: The quick brown fox jumps over the lazy dog.",
    "open": "Why is the sky blue? Answer in a paragraph.",
}


def chat_ids(engine, prompt: str) -> list[int]:
    return engine.tokenizer.encode(engine.render_chat([{"role": "user", "content": prompt}]), add_special_tokens=False)


def decode(engine, prompt: str, params: SamplingParams) -> tuple[list[int], float]:
    """The tokens of one chat request alone, and its decode tok/s (first token to last)."""
    engine.add_request("bench", chat_ids(engine, prompt), params)
    stamps, n, tokens = [], 0, []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = out.outputs[0].token_ids
            if len(tokens) > n:
                stamps.append(time.perf_counter())
                n = len(tokens)
    return tokens, (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else 0.0


def run(path: str, args, spec: dict, bandwidth, baseline=None, ap=None) -> dict:
    engine = bench_args.engine(ap, path, device=args.device, progress=False, max_num_seqs=4,
                               max_model_len=args.max_model_len, **spec)
    try:
        longest = max(len(chat_ids(engine, p)) for p in PROMPTS.values())
        if ap is not None and longest + args.max_tokens > engine.max_model_len:
            ap.error(f"--max-tokens {args.max_tokens}: with the longest prompt ({longest} tokens) it exceeds the "
                     f"context of {engine.max_model_len} tokens")
        _, wbytes = weight_bytes(engine)     # the bytes a decode token reads
        # warm-up: kernels and graphs, the verification's too (a prompt that repeats, so drafts are made;
        # an H100 run warmed with "Hello" alone compiled them inside the first measured prompt: 6.6 tok/s)
        for prompt in ("Hello", PROMPTS["repeat"]):
            decode(engine, prompt, SamplingParams(temperature=0, max_tokens=16))
        before = engine.stats()
        res = {}
        for name, prompt in PROMPTS.items():
            s0 = engine.stats()
            params = SamplingParams(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
            tokens, tps = decode(engine, prompt, params)
            s1 = engine.stats()
            drafted = s1["spec_num_draft_tokens"] - s0["spec_num_draft_tokens"]
            kept = s1["spec_num_accepted_tokens"] - s0["spec_num_accepted_tokens"]
            forwards = len(tokens) - kept   # each forward yields its kept drafts and one token of its own
            r = {"tok_s": round(tps, 1), "tokens": len(tokens), "draft_tokens": drafted,
                 "kept_frac": round(kept / drafted, 3) if drafted else None,
                 "tokens_per_forward": round(len(tokens) / forwards, 2)}
            if bandwidth:
                r["weight_roofline_frac"] = round(tps * wbytes / bandwidth, 3)
            if baseline is not None:
                r["same_tokens"] = tokens == baseline[name]["token_ids"]
                r["speedup"] = round(tps / baseline[name]["tok_s"], 2) if baseline[name]["tok_s"] else None
            else:
                r["token_ids"] = tokens
            res[name] = r
        res["steps_with_drafts"] = engine.stats()["spec_num_drafts"] - before["spec_num_drafts"]
        res["weight_gb"] = round(wbytes / 1e9, 3)   # the target's (a draft model's weights are read too)
        return res
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--k", type=bench_args.count(), nargs="+", default=[2, 4, 6],
                    help="num_speculative_tokens values to try")
    ap.add_argument("--max-tokens", type=bench_args.count(), default=128)
    ap.add_argument("--max-model-len", type=bench_args.count(), default=4096,
                    help="(two models' K/V share the KV pool)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (0: greedy)")
    ap.add_argument("--seed", type=int, default=0, help="the requests' seed where --temperature samples")
    ap.add_argument("--prompt-lookup-min", type=bench_args.count(), default=2)
    ap.add_argument("--prompt-lookup-max", type=bench_args.count(), default=4)
    ap.add_argument("--draft-model", help="also draft with this model (same vocabulary) at each --k")
    ap.add_argument("--mtp", action="store_true", help="also draft with the model's MTP layer (DeepSeek-V3) at each --k")
    ap.add_argument("--adaptive", default="on", choices=("on", "off", "both"),
                    help="adaptive drafting (spec/adaptive.py); off: every step drafts k; both: each run twice, "
                         "the second under a name ending in _fixed")
    args = ap.parse_args()
    args.device = bench_args.device(ap, args.device)
    if args.prompt_lookup_min > args.prompt_lookup_max:
        ap.error(f"--prompt-lookup-min {args.prompt_lookup_min} exceeds --prompt-lookup-max {args.prompt_lookup_max}")
    if args.draft_model and not os.path.exists(args.draft_model):
        ap.error(f"--draft-model: {args.draft_model} does not exist")
    bw = copy_bandwidth(args.device)
    plain = run(args.model, args, {}, bw, ap=ap)
    if args.temperature < 0:
        ap.error(f"--temperature: must be at least 0, got {args.temperature}")
    out = {"model": args.model, "device": args.device, "max_tokens": args.max_tokens, "temperature": args.temperature,
           "copy_bandwidth_GB_s": round(bw / 1e9, 1) if bw else None,
           "plain": {k: ({kk: vv for kk, vv in v.items() if kk != "token_ids"} if isinstance(v, dict) else v)
                     for k, v in plain.items()}}
    policies = {"on": [("", True)], "off": [("", False)], "both": [("", True), ("_fixed", False)]}[args.adaptive]
    for k in args.k:
        specs = {f"ngram_k{k}": dict(speculative_method="ngram", prompt_lookup_min=args.prompt_lookup_min,
                                     prompt_lookup_max=args.prompt_lookup_max)}
        if args.draft_model:
            specs[f"draft_model_k{k}"] = dict(speculative_method="draft_model", speculative_model=args.draft_model)
        if args.mtp:
            specs[f"mtp_k{k}"] = dict(speculative_method="mtp")
        for name, spec in specs.items():
            for suffix, adaptive in policies:
                out[name + suffix] = run(args.model, args, dict(spec, num_speculative_tokens=k,
                                                                speculative_adaptive=adaptive), bw, baseline=plain, ap=ap)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Structured-output overhead: a batch of N requests (random --prompt-len token prompts, --max-tokens
tokens each, EOS ignored) run free and then under a JSON schema whose array needs more tokens than
--max-tokens, so both runs produce the same token count. Prints one JSON object: output tok/s both
ways and their ratio, and the time spent filling token masks (per token and per step, p50/p99).

    python scripts/bench_structured.py MODEL [--batch 64] [--device cuda]
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_args  # noqa: E402
from pocketcupy import SamplingParams  # noqa: E402

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "email", "city", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "email": {"type": "string", "pattern": "^[a-z0-9.]{1,16}@[a-z]{1,12}\\.(com|org|net)$"},
                         "city": {"type": "string", "maxLength": 32},
                         "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest", "dev"]},
                                  "maxItems": 3}}}


def people_schema(min_items: int) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["people"],
            "properties": {"people": {"type": "array", "items": PERSON, "minItems": min_items}}}


def run(engine, prompts, params):
    """All prompts at once, stepped to the end -> (wall seconds, output tokens, finish reasons)."""
    ids = [f"bs-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    wall = time.perf_counter() - t0
    outs = [final[r].outputs[0] for r in ids]
    return wall, sum(len(o.token_ids) for o in outs), sorted({o.finish_reason for o in outs})


def pct(xs, q, scale):
    return round(float(np.percentile(xs, q)) * scale, 2) if len(xs) else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch", type=bench_args.count(), default=64)
    ap.add_argument("--prompt-len", type=bench_args.count(), default=128)
    ap.add_argument("--max-tokens", type=bench_args.count(), default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--schema", help="a JSON schema file (default: an array of people, minItems = max_tokens)")
    a = ap.parse_args()
    if a.schema:
        try:
            with open(a.schema) as f:
                schema = json.load(f)
        except (OSError, ValueError) as e:
            ap.error(f"--schema: {e}")
    else:
        schema = people_schema(a.max_tokens)  # each person is > 1 token: never complete within max_tokens
    try:
        SamplingParams(temperature=a.temperature, structured_outputs={"json": schema})
    except ValueError as e:
        ap.error(str(e))
    engine = bench_args.engine(ap, a.model, device=a.device, progress=False, max_num_seqs=a.batch,
                               max_num_batched_tokens=max(2048, a.batch * a.prompt_len))
    if a.prompt_len + a.max_tokens > engine.max_model_len:
        ap.error(f"--prompt-len {a.prompt_len} + --max-tokens {a.max_tokens} tokens do not fit the model's "
                 f"{engine.max_model_len}")
    rng = np.random.default_rng(0)
    vocab = engine.tokenizer.vocab_size

    def prompts(n):  # fresh ones for every run: no run finds another's prompts in the prefix cache
        return [rng.integers(100, vocab - 100, a.prompt_len).tolist() for _ in range(n)]

    free = SamplingParams(temperature=a.temperature, seed=0, max_tokens=a.max_tokens, ignore_eos=True)
    constrained = free.clone(structured_outputs={"json": schema})

    # warm-up at the full batch: kernels, batch-N shapes and memory, the grammar's compiled lexer
    run(engine, prompts(a.batch), free.clone(max_tokens=8))
    run(engine, prompts(a.batch), constrained.clone(max_tokens=8))
    wall_f, tok_f, fin_f = run(engine, prompts(a.batch), free)
    stats = engine.structured.stats
    stats.samples.clear()
    wall_c, tok_c, fin_c = run(engine, prompts(a.batch), constrained)
    steps = list(stats.samples)
    per_step = [s for s, _ in steps]
    per_token = [s / n for s, n in steps]
    res = {
        "model": a.model, "device": engine.device, "batch": a.batch, "prompt_len": a.prompt_len,
        "max_tokens": a.max_tokens,
        "free": {"output_tok_s": round(tok_f / wall_f, 1), "tokens": tok_f, "wall_s": round(wall_f, 2),
                 "finish_reasons": fin_f},
        "json_schema": {"output_tok_s": round(tok_c / wall_c, 1), "tokens": tok_c, "wall_s": round(wall_c, 2),
                        "finish_reasons": fin_c},
        "ratio": round((tok_c / wall_c) / (tok_f / wall_f), 3),
        "mask": {"per_token_us_p50": pct(per_token, 50, 1e6), "per_token_us_p99": pct(per_token, 99, 1e6),
                 "per_step_ms_p50": pct(per_step, 50, 1e3), "per_step_ms_p99": pct(per_step, 99, 1e3),
                 "steps": len(steps), "total_s": round(sum(per_step), 3),
                 "share_of_wall": round(sum(per_step) / wall_c, 4)},
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()

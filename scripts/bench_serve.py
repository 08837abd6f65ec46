"""HTTP load generator for the OpenAI-compatible server: N concurrent streaming clients, fixed
prompt and output lengths, one JSON object with throughput and TTFT/TPOT/ITL/latency percentiles.

    python scripts/bench_serve.py --base-url http://127.0.0.1:8000 --num-clients 32 \\
        --num-requests 128 --prompt-len 512 --output-len 128

Prompts are random token ids (so every request has exactly --prompt-len tokens and shares no
prefix with the others) sent to /v1/completions with ignore_eos, so each generates exactly
--output-len tokens. Standard library only.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def percentiles(xs, ps=(50, 90, 99)) -> dict:
    if not xs:
        return {"mean": None, **{f"p{p}": None for p in ps}}
    s = sorted(xs)
    out = {"mean": round(statistics.fmean(s), 3)}
    for p in ps:
        k = (len(s) - 1) * p / 100
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        out[f"p{p}"] = round(s[lo] + (s[hi] - s[lo]) * (k - lo), 3)
    return out


class Client:
    def __init__(self, url: str, api_key: str | None, timeout: float):
        u = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        self.host, self.port, self.prefix = u.hostname, u.port, u.path.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def get(self, path: str) -> dict:
        c = self.conn(self.host, self.port, timeout=self.timeout)
        try:
            c.request("GET", self.prefix + path, headers=self.headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: {r.status} {body[:200]!r}")
            return json.loads(body)
        finally:
            c.close()

    def stream(self, body: dict) -> dict:
        """One streaming completion: token arrival times and the usage the server reported."""
        c = self.conn(self.host, self.port, timeout=self.timeout)
        t0 = time.perf_counter()
        times, usage = [], None
        try:
            c.request("POST", self.prefix + "/v1/completions", json.dumps(body), self.headers)
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
            while True:
                line = r.readline()
                if not line:
                    raise RuntimeError("stream ended without [DONE]")
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    raise RuntimeError(obj["error"].get("message"))
                if obj.get("usage"):
                    usage = obj["usage"]
                if obj.get("choices"):
                    times.append(time.perf_counter())
        finally:
            c.close()
        return {"t0": t0, "times": times, "end": time.perf_counter(), "usage": usage}


def run(args) -> dict:
    client = Client(args.base_url, args.api_key, args.timeout)
    model = args.model or client.get("/v1/models")["data"][0]["id"]
    rng = random.Random(args.seed)
    lo, hi = args.token_range
    prompts = [[rng.randrange(lo, hi) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]

    def body(prompt):
        return {"model": model, "prompt": prompt, "max_tokens": args.output_len, "temperature": args.temperature,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    if args.warmup:
        client.stream(body(prompts[0][: min(8, len(prompts[0]))]) | {"max_tokens": 2})
    results, errors, lock = [], [], threading.Lock()
    todo = list(range(args.num_requests))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            try:
                r = client.stream(body(prompts[i]))
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.num_clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start

    ttft, tpot, itl, e2e = [], [], [], []
    out_tokens = prompt_tokens = 0
    for r in results:
        n = r["usage"]["completion_tokens"] if r["usage"] else len(r["times"])
        out_tokens += n
        prompt_tokens += r["usage"]["prompt_tokens"] if r["usage"] else args.prompt_len
        if r["times"]:
            ttft.append((r["times"][0] - r["t0"]) * 1e3)
            if n > 1:
                tpot.append((r["times"][-1] - r["times"][0]) * 1e3 / (n - 1))
            itl += [(b - a) * 1e3 for a, b in zip(r["times"], r["times"][1:])]
        e2e.append((r["end"] - r["t0"]) * 1e3)
    return {
        "model": model, "num_clients": args.num_clients, "num_requests": args.num_requests,
        "prompt_len": args.prompt_len, "output_len": args.output_len,
        "completed": len(results), "failed": len(errors), "errors": errors[:5],
        "duration_s": round(duration, 3),
        "request_throughput_req_s": round(len(results) / duration, 3),
        "output_throughput_tok_s": round(out_tokens / duration, 2),
        "total_throughput_tok_s": round((out_tokens + prompt_tokens) / duration, 2),
        "total_prompt_tokens": prompt_tokens, "total_output_tokens": out_tokens,
        "ttft_ms": percentiles(ttft), "tpot_ms": percentiles(tpot), "itl_ms": percentiles(itl),
        "e2e_latency_ms": percentiles(e2e),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="default: the first model of /v1/models")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--num-clients", type=int, default=8, help="concurrent streaming clients")
    ap.add_argument("--num-requests", type=int, default=None, help="total requests (default: num-clients)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--token-range", type=int, nargs=2, default=(1000, 20000), metavar=("LO", "HI"),
                    help="prompt token ids are drawn from [LO, HI)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per HTTP request")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    args = ap.parse_args(argv)
    args.num_requests = args.num_requests or args.num_clients
    u = urllib.parse.urlsplit(args.base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        ap.error(f"--base-url must be an http:// or https:// URL, got {args.base_url!r}")
    for name in ("num_clients", "num_requests", "prompt_len", "output_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        result = run(args)
    except (OSError, RuntimeError) as e:   # the model lookup or warm-up failed (later failures are counted)
        hint = " (is a server running there? python scripts/serve.py --model PATH)" \
            if isinstance(e, ConnectionRefusedError) else ""
        print(f"bench_serve: {args.base_url}: {e}{hint}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0 if result["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""scripts/bench_serve.py against the CPU server with small numbers: one JSON object, no failures,
exact token counts."""
import json
import os
import subprocess
import sys

from tests.test_server_harness import ROOT, server  # noqa: F401


def test_bench_serve_small(server):
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "bench_serve.py"), "--base-url", server.url,
           "--num-clients", "3", "--num-requests", "4", "--prompt-len", "12", "--output-len", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    r = json.loads(out.stdout)
    assert r["completed"] == 4 and r["failed"] == 0
    assert r["total_output_tokens"] == 16 and r["total_prompt_tokens"] == 48
    assert r["output_throughput_tok_s"] > 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        assert set(r[key]) == {"mean", "p50", "p90", "p99"} and r[key]["p50"] > 0
    assert r["ttft_ms"]["p50"] <= r["e2e_latency_ms"]["p50"]

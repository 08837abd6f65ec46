"""The GPU test set (`-m gpu`) in parallel processes sharing one GPU, for a lent GPU's short calls: the
kernel rows (tests/test_kernels.py, most of the set's time is NVRTC compiling their kernels on the
CPU) cut into --shards processes, every other GPU test in one more process of its own (engines size
their KV pools from the memory left free, so two at once would starve each other). Prints one JSON
object: each process's passed / failed / skipped / errors counts, the failed test ids, and the wall
time; exit status 1 if anything failed.

    python scripts/run_gpu_tests.py [--shards 4] [--timeout 540] [-k EXPR] [--log-dir DIR] [PATH ...]"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

KERNEL_ROWS = "tests/test_kernels.py"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


def collect(k: str | None, paths: list[str] = ()) -> list[str]:
    """The ids of the GPU tests (-m gpu, -k k) in paths (default: the whole suite)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider", *paths]
    out = subprocess.run(cmd + (["-k", k] if k else []), cwd=ROOT, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "::" in line]


def plan(ids: list[str], shards: int) -> list[list[str]]:
    """The processes' test ids: the kernel rows dealt round-robin to `shards` lists (neighbouring rows
    share kernels, so each shard compiles a spread of them), then the other tests together."""
    rows = [i for i in ids if i.startswith(KERNEL_ROWS + "::")]
    rest = [i for i in ids if not i.startswith(KERNEL_ROWS + "::")]
    groups = [rows[s::shards] for s in range(shards)] + [rest]
    return [g for g in groups if g]


def counts(text: str) -> dict[str, int]:
    """pytest's last summary line as counts (errors under "errors")."""
    lines = [line for line in text.splitlines() if SUMMARY.search(line)]
    found = {"errors" if name.startswith("error") else name: int(n)
             for n, name in SUMMARY.findall(lines[-1])} if lines else {}
    return {key: found.get(key, 0) for key in ("passed", "failed", "skipped", "errors")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=4, help="processes for the kernel rows")
    ap.add_argument("--timeout", type=float, default=540, help="seconds before every process is stopped")
    ap.add_argument("-k", dest="k", help="pytest -k expression")
    ap.add_argument("--log-dir", default=None, help="each process's pytest output (default: none kept)")
    ap.add_argument("paths", nargs="*", help="test files or folders to collect from (default: the whole suite)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards: must be at least 1")
    t0 = time.monotonic()
    groups = plan(collect(args.k, args.paths), args.shards)
    procs = []
    for n, ids in enumerate(groups):
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfE", *ids]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results, failed = [], []
    for n, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
            timed_out = False
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            timed_out = True
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            with open(os.path.join(args.log_dir, f"gpu_tests_{n}.log"), "w") as f:
                f.write(out)
        failed += [line.split(" ")[1] for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))]
        results.append({"tests": len(groups[n]), **counts(out), "timed_out": timed_out})
    bad = bool(failed) or any(r["timed_out"] or r["failed"] or r["errors"] for r in results)
    print(json.dumps({"processes": results, "failed": failed, "wall_s": round(time.monotonic() - t0, 1)}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

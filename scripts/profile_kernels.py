"""Per-kernel GPU time of one decode step (or, with --prefill, of one prefill step), measured by
Nsight Compute.

Run a step under ncu (the step runs eagerly, one launch per kernel, between cudaProfilerStart and
cudaProfilerStop), then summarise ncu's CSV into one JSON object: total kernel time of the step
and, per kernel name, its launches, microseconds and share.

    ncu --clock-control none --profile-from-start off --csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum \\
        python scripts/profile_kernels.py MODEL [--batch 1] [--context 512] > step.csv
    python scripts/profile_kernels.py --summarize step.csv [--top 25] [--sequence 4:9]

--prefill profiles the step that prefills `--batch` fresh prompts of `--context` tokens (after one
unprofiled prefill of the same shape, so that every kernel is compiled and the cuBLAS workspace set).
--sequence FIRST:COUNT adds launches FIRST .. FIRST + COUNT - 1 in launch order (e.g. one layer).
"""
import argparse
import collections
import csv
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_args  # noqa: E402

_US_PER_UNIT = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3,
                "s": 1e6}
_BYTES_PER_UNIT = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9}


KV_BLOCK = 16
DECODE_ROOM = 64     # tokens a decoding request may produce: past the set-up and the profiled step


def add_greedy(eng, batch: int, context: int, max_tokens: int, first: int = 100) -> list[str]:
    """batch greedy requests of `context` prompt tokens each, ids from `first` on (requests of another
    `first` share no cached prefix with them); returns their request ids."""
    from pocketcupy import SamplingParams

    p = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"r{first}_{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        eng.add_request(rid, [first + (i * 7 + t) % 20000 for t in range(context)], p)
    return ids


def start_decodes(eng, batch: int, context: int, tokens: int) -> None:
    """batch greedy requests of `context` prompt tokens each, stepped until every one has `tokens`
    output tokens (prefill, then decode steps); none finishes before DECODE_ROOM tokens."""
    produced = dict.fromkeys(add_greedy(eng, batch, context, DECODE_ROOM), 0)
    while min(produced.values()) < tokens:
        for out in eng.step():
            produced[out.request_id] = len(out.outputs[0].token_ids)


def make_engine(model: str, batch: int, context: int, device: str = "cuda"):
    """The eager engine a profiled step runs on, with a KV pool for these requests only: ncu saves
    and restores the device memory around every kernel it replays, and a pool sized from the free
    memory (~120 GB on an H200) took over 30 s a kernel."""
    from pocketcupy import Engine

    blocks = max(batch, 1) * -(-(context + DECODE_ROOM) // KV_BLOCK)
    return Engine(model, device=device, cuda_graphs=False, progress=False, max_num_seqs=max(batch, 1),
                  max_num_batched_tokens=max(batch * context, 2048), block_size=KV_BLOCK, num_kv_blocks=blocks)


def profile_step(model: str, batch: int, context: int, prefill: bool = False) -> None:
    import cupy as cp

    eng = make_engine(model, batch, context)
    if prefill:                             # one-token requests; the profiled ones share no prefix
        add_greedy(eng, batch, context, 1)
        while eng.has_unfinished_requests():
            eng.step()
        add_greedy(eng, batch, context, 1, first=20100)
    else:
        start_decodes(eng, batch, context, 2)   # prefill, then one decode step outside the profile
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStart()
    eng.step()
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()


def _launches(path: str) -> list[dict]:
    """ncu's CSV as one dict per launch, in launch order: name, us and (when measured) bytes."""
    with open(path) as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows:
        raise SystemExit(f"{path}: no ncu CSV rows (was the step run under ncu --csv?)")
    head = rows[0]
    ident, name, metric, value, unit = (head.index(h) for h in ("ID", "Kernel Name", "Metric Name", "Metric Value",
                                                               "Metric Unit"))
    out: dict[str, dict] = {}
    for r in rows[1:]:
        k = out.setdefault(r[ident], {"name": r[name].split("(")[0].removeprefix("void ")})
        v = float(r[value].replace(",", ""))
        if r[metric] == "gpu__time_duration.sum":
            k["us"] = v * _US_PER_UNIT[r[unit]]
        elif r[metric] == "dram__bytes_read.sum":
            k["bytes"] = v * _BYTES_PER_UNIT[r[unit]]
    return list(out.values())


def summarize(path: str, top: int) -> dict:
    """Per kernel name: launches, µs, share of the step; with dram__bytes_read.sum in the CSV also
    the bytes read from DRAM and the achieved GB/s."""
    us = collections.defaultdict(float)
    nbytes = collections.defaultdict(float)
    launches = collections.Counter()
    for k in _launches(path):
        launches[k["name"]] += 1
        us[k["name"]] += k.get("us", 0.0)
        if "bytes" in k:
            nbytes[k["name"]] += k["bytes"]
    total = sum(us.values())
    ranked = sorted(us.items(), key=lambda kv: -kv[1])[:top]
    kernels = []
    for k, t in ranked:
        row = {"name": k, "launches": launches[k], "us": round(t, 1), "share": round(t / total, 3)}
        if k in nbytes:
            row.update(MB=round(nbytes[k] / 1e6, 2), GBps=round(nbytes[k] / t / 1e3, 1))
        kernels.append(row)
    out = {"kernel_us_total": round(total, 1), "launches": sum(launches.values()), "kernels": kernels}
    if nbytes:
        out["dram_MB_total"] = round(sum(nbytes.values()) / 1e6, 1)
    return out


def sequence(path: str, first: int, count: int) -> list[dict]:
    """Launches first .. first + count - 1 in order (one layer of the step, say), each with its µs
    and, with bytes measured, MB and GB/s."""
    rows = []
    for k in _launches(path)[first:first + count]:
        row = {"name": k["name"], "us": round(k.get("us", 0.0), 2)}
        if "bytes" in k:
            row["MB"] = round(k["bytes"] / 1e6, 2)
            if k.get("us"):
                row["GBps"] = round(k["bytes"] / k["us"] / 1e3, 1)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--prefill", action="store_true", help="profile a prefill step instead of a decode step")
    ap.add_argument("--summarize", metavar="CSV")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--sequence", metavar="FIRST:COUNT", help="with --summarize: also launches FIRST.. in order")
    a = ap.parse_args()
    if a.summarize:
        res = summarize(a.summarize, a.top)
        if a.sequence:
            first, count = (int(v) for v in a.sequence.split(":"))
            res["sequence"] = sequence(a.summarize, first, count)
        print(json.dumps(res))
    elif a.model:
        bench_args.require_gpu(ap, "profiles CUDA kernels")
        profile_step(a.model, a.batch, a.context, a.prefill)
    else:
        ap.error("give a MODEL to profile, or --summarize CSV")


if __name__ == "__main__":
    main()

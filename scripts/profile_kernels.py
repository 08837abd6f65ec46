"""Per-kernel GPU time of one decode step, measured by Nsight Compute.

Run a step under ncu (the step runs eagerly, one launch per kernel, between cudaProfilerStart and
cudaProfilerStop), then summarise ncu's CSV into one JSON object: total kernel time of the step
and, per kernel name, its launches, microseconds and share.

    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \\
        python scripts/profile_kernels.py MODEL [--batch 1] [--context 512] > step.csv
    python scripts/profile_kernels.py --summarize step.csv [--top 25]
"""
import argparse
import collections
import csv
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

_US_PER_UNIT = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def profile_step(model: str, batch: int, context: int) -> None:
    import cupy as cp

    from pocketcupy import Engine, SamplingParams

    eng = Engine(model, device="cuda", cuda_graphs=False, progress=False, max_num_seqs=max(batch, 1))
    p = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i in range(batch):
        eng.add_request(f"r{i}", [100 + (i * 7 + t) % 20000 for t in range(context)], p)
    produced = {f"r{i}": 0 for i in range(batch)}
    while min(produced.values()) < 2:  # prefill, then one decode step outside the profile
        for out in eng.step():
            produced[out.request_id] = len(out.outputs[0].token_ids)
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStart()
    eng.step()
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()


def summarize(path: str, top: int) -> dict:
    with open(path) as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows:
        raise SystemExit(f"{path}: no ncu CSV rows (was the step run under ncu --csv?)")
    head = rows[0]
    name, value, unit = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
    per = collections.defaultdict(lambda: [0, 0.0])
    for r in rows[1:]:
        us = float(r[value].replace(",", "")) * _US_PER_UNIT[r[unit]]
        per[r[name].split("(")[0]][0] += 1
        per[r[name].split("(")[0]][1] += us
    total = sum(us for _, us in per.values())
    ranked = sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
    return {"kernel_us_total": round(total, 1), "launches": sum(n for n, _ in per.values()),
            "kernels": [{"name": k, "launches": n, "us": round(us, 1), "share": round(us / total, 3)}
                        for k, (n, us) in ranked]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--summarize", metavar="CSV")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if a.summarize:
        print(json.dumps(summarize(a.summarize, a.top)))
    elif a.model:
        profile_step(a.model, a.batch, a.context)
    else:
        ap.error("give a MODEL to profile, or --summarize CSV")


if __name__ == "__main__":
    main()

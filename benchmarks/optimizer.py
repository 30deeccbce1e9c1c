#!/usr/bin/env python
"""`toolkit bench` with and without the graph optimiser, on every zoo net, infer and train.

    python benchmarks/optimizer.py [--batch 64 --batch 1] [--rounds 20] [--iters 20] [--json]

For each net and mode it builds the two plans `toolkit bench` and `toolkit bench --no-optimize`
build (`toolkit.benchmarking.bench_plan`: the infer phase with the weights frozen in, or the
train step with the net's solver) in one process, and times them in interleaved rounds whose
order alternates, so that load from elsewhere on the machine falls on both alike: separate
processes on a shared 2-core machine differ by more than the effect measured. Reported: the
median over every timed iteration, the 25th and 75th percentiles, and the speed-up (unoptimised
median / optimised median; above 1, the optimiser is faster). `--no-optimize` keeps dead-code
removal and the memory planner, as the command documents.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compare import cpu_name  # noqa: E402  (this folder's side-by-side script: one CPU naming)


def measure(net, batch: int, train: bool, rounds: int, iters: int) -> dict:
    import numpy as np

    from toolkit.benchmarking import bench_plan
    from toolkit.compile import disabled_passes

    plans = {opt: bench_plan(net, batch, train, disable=disabled_passes(net, (), not opt)) for opt in (True, False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    for plan, inputs in plans.values():
        for _ in range(10):
            plan.run(inputs)
    for r in range(rounds):
        for opt in ((True, False) if r % 2 == 0 else (False, True)):
            plan, inputs = plans[opt]
            plan.run(inputs)                       # wakes its helper thread after the other plan's turn
            for _ in range(iters):
                start = time.perf_counter()
                plan.run(inputs)
                times[opt].append((time.perf_counter() - start) * 1e3)
    row = {}
    for opt, name in ((True, "optimized"), (False, "unoptimized")):
        t = np.array(times[opt])
        row[name] = {"median_ms": round(float(np.median(t)), 4), "p25_ms": round(float(np.percentile(t, 25)), 4),
                     "p75_ms": round(float(np.percentile(t, 75)), 4), "kernel_calls": len(plans[opt][0].calls),
                     "peak_bytes": plans[opt][0].peak_bytes}
    row["speedup"] = round(row["unoptimized"]["median_ms"] / row["optimized"]["median_ms"], 3)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, action="append", help="batch size(s) (default: 64 and 1)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=20, help="timed iterations per plan and round")
    p.add_argument("--nets", nargs="*", default=None, help="net files (default: every zoo/*/net.yaml)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from toolkit.zoo.resolve import load_net

    paths = [Path(n) for n in args.nets] if args.nets else sorted(ROOT.glob("zoo/*/net.yaml"))
    rows = []
    for path in paths:
        net = load_net(str(path))
        for mode in ("infer", "train"):
            for batch in args.batch or [64, 1]:
                if mode == "train" and batch == 1:
                    continue                     # BatchNorm's batch statistics need more than one
                row = {"net": net.name, "mode": mode, "batch": batch,
                       **measure(net, batch, mode == "train", args.rounds, args.iters)}
                rows.append(row)
                if not args.json:
                    o, u = row["optimized"], row["unoptimized"]
                    print(f"{net.name:10s} {mode:5s} batch {batch:3d}: optimised {o['median_ms']:8.3f} ms "
                          f"[{o['p25_ms']:.3f}-{o['p75_ms']:.3f}] {o['kernel_calls']:3d} calls; unoptimised "
                          f"{u['median_ms']:8.3f} ms [{u['p25_ms']:.3f}-{u['p75_ms']:.3f}] "
                          f"{u['kernel_calls']:3d} calls; "
                          f"{row['speedup']:.2f}x", flush=True)
    if args.json:
        print(json.dumps({"cpu": cpu_name(), "rounds": args.rounds, "iters": args.iters, "rows": rows}))
    else:
        print(f"CPU: {cpu_name()}; {args.rounds} interleaved rounds of {args.iters} iterations per plan")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""`toolkit bench` with and without the graph optimiser, on every zoo net, infer and train.

    python benchmarks/optimizer.py [--batch 64] [--rounds 5] [--iters 100] [--json]

Each configuration (net, mode, optimised or not) runs as its own `toolkit bench --json` process
once per round; rounds alternate the order of the optimised and unoptimised runs, so that load
from elsewhere on the machine falls on both alike. The figure per configuration is the median
of the rounds' medians; the ratio is unoptimised / optimised (above 1: the optimiser is faster).
`--no-optimize` keeps dead-code removal and the memory planner, as the command documents.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def bench(net: Path, batch: int, train: bool, optimized: bool, iters: int) -> dict:
    cmd = [sys.executable, "-m", "toolkit.cli", "bench", str(net), "--batch", str(batch), "--iters", str(iters),
           "--warmup", "10", "--json"] + (["--train"] if train else []) + ([] if optimized else ["--no-optimize"])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, action="append", help="batch size(s) (default: 64 and 1)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--nets", nargs="*", default=None, help="net files (default: every zoo/*/net.yaml)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    nets = [Path(n) for n in args.nets] if args.nets else sorted(ROOT.glob("zoo/*/net.yaml"))
    batches = args.batch or [64, 1]
    rows = []
    for net in nets:
        for mode in ("infer", "train"):
            for batch in batches:
                if mode == "train" and batch == 1:
                    continue                   # BatchNorm nets need more than one example to train
                runs = {True: [], False: []}
                calls = {}
                for r in range(args.rounds):
                    for optimized in ((True, False) if r % 2 == 0 else (False, True)):
                        report = bench(net, batch, mode == "train", optimized, args.iters)
                        runs[optimized].append(report["median_ms"])
                        calls[optimized] = report["kernel_calls"]
                opt, plain = statistics.median(runs[True]), statistics.median(runs[False])
                rows.append({"net": net.parent.name, "mode": mode, "batch": batch, "optimized_ms": round(opt, 4),
                             "unoptimized_ms": round(plain, 4), "speedup": round(plain / opt, 3),
                             "calls_optimized": calls[True], "calls_unoptimized": calls[False]})
                if not args.json:
                    row = rows[-1]
                    print(f"{row['net']:10s} {mode:5s} batch {batch:3d}: optimised {opt:8.3f} ms ({calls[True]:3d} calls), "
                          f"unoptimised {plain:8.3f} ms ({calls[False]:3d} calls), {row['speedup']:.2f}x", flush=True)
    if args.json:
        print(json.dumps({"cpu": cpu_name(), "rounds": args.rounds, "iters": args.iters, "rows": rows}))
    else:
        print(f"CPU: {cpu_name()}; medians of {args.rounds} rounds of {args.iters} iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())

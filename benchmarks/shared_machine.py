#!/usr/bin/env python
"""The toolkit and PyTorch on a shared machine: each framework's default threads against one
thread, quiet, beside a busy process, two jobs at once, and under a one-core CPU quota.

    python benchmarks/shared_machine.py [NET.yaml ...] [--batch 64] [--rounds 3]
        [--conditions quiet,busy,twojobs,quota] [--cgroup DIR] [--json]

Every measurement is one run of ``benchmarks/compare.py --no-ort`` (the toolkit and PyTorch
eager timed interleaved in one process, outputs checked equal first), once with ``--threads 0``
(each framework's own default: the toolkit's adapts to the load, PyTorch's is one thread per
core) and once with ``--threads 1``, alternating which goes first, ``--rounds`` times; medians
over the rounds. The conditions:

- ``quiet``: nothing else started (the machine may still be shared with others).
- ``busy``: one process spinning on a core for the whole measurement.
- ``twojobs``: a twin of the same compare.py run started at the same moment (its figures are
  discarded): two trainings, or two inference jobs, of the same kind at once.
- ``quota``: the run is put in the cgroup ``--cgroup DIR`` (one you can write ``cgroup.procs``
  of, with a CPU quota of one core: v2 ``cpu.max`` "100000 100000", v1 ``cpu.cfs_quota_us``
  100000), as a container with a one-core limit is. Without ``--cgroup`` the run is pinned to
  one core by its affinity (what ``taskset -c 0`` does) and the condition is named
  ``one core (affinity)``: there every framework's default already sees one core.

Needs the ``bench`` extra (torch, onnx, onnxruntime).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPARE = ROOT / "benchmarks" / "compare.py"
CONDITIONS = ("quiet", "busy", "twojobs", "quota")


def _net_name(net: str) -> str:
    """zoo/lenet for zoo/lenet/net.yaml, the file's stem otherwise."""
    path = Path(net)
    if not net.endswith(".yaml"):
        return net
    return f"{path.parent.parent.name}/{path.parent.name}" if path.stem == "net" else path.stem


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nets", nargs="*", default=[str(ROOT / "benchmarks" / "nets" / "lenet.yaml")])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--iters", type=int, default=40, help="timed iterations per run and mode (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="runs per thread setting (default: %(default)s)")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--cgroup", type=Path, help="a cgroup folder with a one-core CPU quota, for the quota condition")
    p.add_argument("--force", action="store_true",
                   help="time even where compare.py's check finds the frameworks apart beyond its tolerance "
                        "(a deep BatchNorm net's updated weights in float32)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = p.parse_args(argv)
    args.conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for c in args.conditions:
        if c not in CONDITIONS:
            p.error(f"unknown condition '{c}' (choose from {', '.join(CONDITIONS)})")
    for m in args.modes:
        if m not in ("infer", "train"):
            p.error(f"unknown mode '{m}' (infer or train)")
    if args.cgroup is not None and not (args.cgroup / "cgroup.procs").exists():
        p.error(f"--cgroup {args.cgroup}: no cgroup.procs there")
    if min(args.batch, args.iters, args.rounds) < 1:
        p.error("--batch, --iters and --rounds must be at least 1")
    return args


def _into_cgroup(folder: Path):
    def enter():
        (folder / "cgroup.procs").write_text(str(os.getpid()))
    return enter


def _one_core():
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def compare(net: str, mode: str, threads: int, args, condition: str) -> dict:
    """One compare.py run under ``condition``: {framework: median ms}."""
    cmd = [sys.executable, str(COMPARE), net, "--no-ort", "--json", "--mode", mode, "--batch", str(args.batch),
           "--threads", str(threads), "--iters", str(args.iters), "--rounds", str(min(5, args.iters))]
    if args.force:
        cmd.append("--force")
    enter = None
    if condition == "quota":
        enter = _into_cgroup(args.cgroup) if args.cgroup is not None else _one_core
    twin = None
    if condition == "twojobs":
        twin = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=enter, cwd=ROOT)
    finally:
        if twin is not None:
            twin.kill()
            twin.wait()
    if done.returncode != 0:
        raise SystemExit(f"compare.py failed on {net} ({mode}, {threads} threads, {condition}): "
                         f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {fw: r["median_ms"] for fw, r in report["results"][mode].items()}


def measure(args) -> list[dict]:
    rows = []
    for condition in args.conditions:
        spinner = None
        if condition == "busy":
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            for net in args.nets:
                for mode in args.modes:
                    runs = {0: [], 1: []}
                    for r in range(args.rounds):
                        for threads in ((0, 1) if r % 2 == 0 else (1, 0)):
                            runs[threads].append(compare(net, mode, threads, args, condition))
                    row = {"net": _net_name(net), "mode": mode,
                           "condition": condition if condition != "quota" or args.cgroup else "one core (affinity)"}
                    for fw in runs[0][0]:
                        default = statistics.median(x[fw] for x in runs[0])
                        alone = statistics.median(x[fw] for x in runs[1])
                        row[fw] = {"default_ms": round(default, 3), "one_thread_ms": round(alone, 3),
                                   "default_over_one": round(default / alone, 2)}
                    rows.append(row)
                    if not args.json:
                        print(line(row), flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    return rows


def line(row: dict) -> str:
    cells = [f"{row['net']:<14} {row['mode']:<5} {row['condition']:<20}"]
    for fw in ("toolkit", "torch"):
        r = row.get(fw)
        if r:
            cells.append(f"{fw} {r['default_ms']:9.3f} vs {r['one_thread_ms']:9.3f} ms ({r['default_over_one']:.2f}x)")
    return "  ".join(cells)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.json:
        print(f"{'net':<14} {'mode':<5} {'condition':<20}  default threads vs one thread, median ms "
              f"(default / one)", flush=True)
    rows = measure(args)
    if args.json:
        print(json.dumps({"batch": args.batch, "rounds": args.rounds, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Weak scaling of data-parallel training on one machine: one process with one thread at batch B
against K ranks (mpiexec, one thread each) at batch B per rank, with the gradient all-reduce
overlapped with the backward pass and without (train.distributed.overlap false).

    python benchmarks/dist_scaling.py [NET] [--batch 64] [--ranks 2] [--steps 300] [--repeats 3]

Efficiency is the one-process step time over the K-rank step time (1.0: K times the samples in
the same time). Each figure is the median over --repeats runs of the median step of --steps
steps after 30 warm-up steps; the time each step spent blocked on gradient sums and on every
collective (the logged loss, the stop check) is reported beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def worker(args) -> None:
    """One process of a measurement (every rank of it under mpiexec); rank 0 prints the figures."""

    from toolkit.distributed.comm import use
    from toolkit.distributed.launcher import world
    from toolkit.training.trainer import Trainer
    from toolkit.zoo.resolve import load_net
    overrides = [(("train", "data", "batch_size"), args.batch),
                 (("train", "distributed", "overlap"), bool(args.overlap)),
                 (("train", "max_iter"), 100000)]
    net = load_net(args.net, overrides)
    comm = world()
    with tempfile.TemporaryDirectory() as tmp, use(comm) if comm else _nothing():
        trainer = Trainer(net, Path(tmp), comm=comm)
        for i in range(30):
            trainer.step(i)
        if comm:
            comm.any_true(False)                          # line the ranks up before timing
            comm.waited_s = comm.gradient_wait_s = 0.0
        times = []
        for i in range(30, 30 + args.steps):
            start = time.perf_counter()
            trainer.step(i)                               # reads the loss: the step has ended
            if comm:
                comm.any_true(False)                      # the trainer's per-step stop check
            times.append(time.perf_counter() - start)
        if trainer.rank == 0:
            print(json.dumps({"step_ms": 1e3 * statistics.median(times),
                              "gradient_wait_ms": 1e3 * comm.gradient_wait_s / args.steps if comm else 0.0,
                              "all_collectives_ms": 1e3 * comm.waited_s / args.steps if comm else 0.0}))


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def measure(net: str, batch: int, ranks: int, overlap: bool, steps: int) -> dict:
    cmd = [sys.executable, __file__, net, "--worker", "--batch", str(batch), "--steps", str(steps),
           "--overlap", str(int(overlap))]
    env = dict(os.environ, TOOLKIT_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if ranks > 1:
        cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks), *cmd]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("net", nargs="?", default="zoo/lenet/net.yaml")
    p.add_argument("--batch", type=int, default=64, help="batch size per process (default: %(default)s)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--overlap", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    configs = [("1 process", 1, True), (f"{args.ranks} ranks, overlap", args.ranks, True),
               (f"{args.ranks} ranks, no overlap", args.ranks, False)]
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in configs}
    for _ in range(args.repeats):                         # interleaved: the machine's drift hits all alike
        for label, ranks, overlap in configs:
            runs[label].append(measure(args.net, args.batch, ranks, overlap, args.steps))
    base = statistics.median(r["step_ms"] for r in runs["1 process"])
    print(f"{args.net}, batch {args.batch} per process, one thread per process, medians of {args.repeats} runs "
          f"of {args.steps} steps\n")
    print("| configuration | step | samples/s | efficiency | waiting on gradient sums | on all collectives |")
    print("|---|--:|--:|--:|--:|--:|")
    for label, ranks, _ in configs:
        step = statistics.median(r["step_ms"] for r in runs[label])
        grad = statistics.median(r["gradient_wait_ms"] for r in runs[label])
        every = statistics.median(r["all_collectives_ms"] for r in runs[label])
        print(f"| {label} | {step:.3f} ms | {ranks * args.batch / step * 1e3:.0f} | {base / step:.2f} | "
              f"{grad:.3f} ms | {every:.3f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

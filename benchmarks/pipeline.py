#!/usr/bin/env python
"""Pipeline-parallel training on one machine: one process with one thread at batch B against K
stages (mpiexec -n K, one thread a rank) at the same batch B in M micro-batches, GPipe; with
--replicas R also R data-parallel ranks at B/R each (one stage) and K stages x R replicas
(mpiexec -n K*R) at B/R a replica, the same global batch B.

    python benchmarks/pipeline.py [NET] [--batch 256] [--stages 2] [--micro 1,2,4,8] [--schedule gpipe]
                                  [--replicas R] [--steps 100] [--rounds 3]

For each configuration: the step time (the median step of --steps steps after 10 warm-up
steps, then the median over --rounds rounds, the configurations interleaved within a round),
each rank's weights (bytes, solver slots left out) against the whole net's, and each rank's
measured idle share of a step (the time it spent blocked receiving, over the step) beside
GPipe's bubble (K-1)/(M+K-1). The default net is an MLP on the digits whose work is four equal
1024 x 1024 layers (its two stages balance to within 3%, the case GPipe's formula is about).
"""
from __future__ import annotations

import argparse
import contextlib
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

MLP = """
name: mlp1024
inputs:
  data:  {shape: [N, 1, 8, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 1024}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 1024}
  - {name: relu2, type: ReLU, bottom: ip2, top: ip2}
  - {name: ip3, type: InnerProduct, bottom: ip2, top: ip3, num_output: 1024}
  - {name: relu3, type: ReLU, bottom: ip3, top: ip3}
  - {name: ip4, type: InnerProduct, bottom: ip3, top: ip4, num_output: 1024}
  - {name: relu4, type: ReLU, bottom: ip4, top: ip4}
  - {name: ip5, type: InnerProduct, bottom: ip4, top: ip5, num_output: 1024}
  - {name: relu5, type: ReLU, bottom: ip5, top: ip5}
  - {name: ip6, type: InnerProduct, bottom: ip5, top: ip6, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip6, label], top: loss, phase: train}
train:
  data: {source: "builtin:digits"}
  solver: {type: sgd, base_lr: 0.01, momentum: 0.9}
"""


def worker(args) -> None:
    """One process of a measurement (every rank of it under mpiexec); rank 0 prints the figures."""
    from toolkit.distributed.comm import use
    from toolkit.distributed.launcher import world
    from toolkit.optim.solvers import is_slot
    from toolkit.training.trainer import Trainer
    from toolkit.zoo.resolve import load_net
    overrides = [(("train", "data", "batch_size"), args.batch), (("train", "max_iter"), 100000),
                 (("train", "distributed", "stages"), args.stages),
                 (("train", "distributed", "micro_batches"), args.micro),
                 (("train", "distributed", "schedule"), args.schedule)]
    net = load_net(args.net, overrides)
    comm = world()
    with tempfile.TemporaryDirectory() as tmp, use(comm) if comm else contextlib.nullcontext():
        trainer = Trainer(net, Path(tmp), comm=comm, stream=open(os.devnull, "w"))
        for i in range(10):
            trainer.step(i)
        if comm:
            comm.largest(0)                               # line the ranks up before timing
            trainer.comm.waited_s = 0.0                   # (a grid's: every part's)
        times = []
        for i in range(10, 10 + args.steps):
            start = time.perf_counter()
            trainer.step(i)                               # reads the loss: the step has ended
            if comm:
                comm.largest(0)                           # the trainer's per-step stop check
            times.append(time.perf_counter() - start)
        weights = sum(v.nbytes for k, v in trainer.store.items() if not is_slot(k))
        mine = {"step_ms": 1e3 * statistics.median(times), "weight_bytes": weights,
                "idle": (trainer.comm.waited_s / sum(times)) if comm else 0.0}
        ranks = comm.gather_all(mine) if comm else [mine]
        if trainer.rank == 0:
            print(json.dumps({"step_ms": ranks[0]["step_ms"], "ranks": ranks}))


def measure(args, stages: int, micro: int, replicas: int = 1) -> dict:
    """One configuration's figures: ``stages`` x ``replicas`` ranks, each replica at B/R rows."""
    cmd = [sys.executable, __file__, args.net, "--worker", "--batch", str(args.batch // replicas),
           "--stages", str(stages), "--micro", str(micro), "--schedule", args.schedule, "--steps", str(args.steps)]
    if stages * replicas > 1:
        cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(stages * replicas), *cmd]
    env = dict(os.environ, TOOLKIT_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("net", nargs="?", default=None)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", default="1,2,4,8")
    ap.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=1,
                    help="also R data-parallel ranks and K stages x R replicas, at the same global batch")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        args.micro = int(args.micro)
        return worker(args)
    if args.net is None:
        args.net = str(Path(tempfile.mkdtemp()) / "mlp1024.yaml")
        Path(args.net).write_text(MLP)
    micros = [int(m) for m in args.micro.split(",")]
    configs = [(1, 1, 1)] + [(args.stages, m, 1) for m in micros]      # (stages, micro-batches, replicas)
    if args.replicas > 1:
        configs += [(1, 1, args.replicas)] + [(args.stages, m, args.replicas) for m in micros]
    runs: dict[tuple, list[dict]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for c in configs:
            runs[c].append(measure(args, *c))
    one = statistics.median(r["step_ms"] for r in runs[(1, 1, 1)])
    whole = runs[(1, 1, 1)][0]["ranks"][0]["weight_bytes"]
    print(f"{Path(args.net).name}, global batch {args.batch}, {args.schedule}, one thread a process, "
          f"median of {args.rounds} rounds of the median of {args.steps} steps, {os.cpu_count()} cores")
    print(f"{'config':>18s} {'ranks':>5s} {'step ms':>9s} {'vs one':>7s} {'weights/rank (of whole)':>26s} "
          f"{'idle share by rank':>30s} {'(K-1)/(M+K-1)':>13s}")
    for (k, m, r), rs in runs.items():
        step = statistics.median(x["step_ms"] for x in rs)
        shares = "/".join(f"{x['weight_bytes'] / whole:.2f}" for x in rs[0]["ranks"])
        idle = "/".join(f"{statistics.median(x['ranks'][i]['idle'] for x in rs):.3f}" for i in range(k * r))
        bubble = (k - 1) / (m + k - 1)
        name = ("one process" if k * r == 1 else f"K={k} M={m}" if r == 1 else f"{r} replicas x 1 stage"
                if k == 1 else f"K={k} x {r} repl. M={m}")
        print(f"{name:>18s} {k * r:>5d} {step:>9.2f} {one / step:>6.2f}x {shares:>26s} {idle:>30s} "
              f"{bubble if k > 1 else 0:>13.3f}")


if __name__ == "__main__":
    main()

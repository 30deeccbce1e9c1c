#!/usr/bin/env python
"""Placements of a net over two devices, predicted and measured: every layer on one device, the
slides' three schedules (serial, parallel, greedy; toolkit/placement/schedules.py), the
placer's choice, and the manual placement of docs/explanations/devices.md (the first fully
connected layer on the second device).

    python benchmarks/placement.py [NET ...] [--batch 16] [--devices cpu,cpu:1] [--rounds 5]
        [--iters 20] [--json]

Each placement's plan is built once (the infer phase, weights frozen in, as `toolkit bench`
builds it) and timed in interleaved rounds (every placement once per round, ``--iters`` runs
each, after warm-up); the figure is the median over the rounds of each round's median. The
prediction is the placer's simulation with the model `toolkit compile --place auto` uses (the
measured one on the host: each placement's kernels timed once per machine, cached), under the
sharing of the devices this process's plans run with: the host's devices one node at a time,
or as many at once as there are threads with ``TOOLKIT_CONCURRENT=1``. Run it once with and
once without that variable: the setting is read once per process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit.backend.devices import parse_device  # noqa: E402
from toolkit.benchmarking import bench_plan, time_plan  # noqa: E402
from toolkit.commands.placing import cost_model  # noqa: E402
from toolkit.frontend.spec import parse_overrides  # noqa: E402
from toolkit.placement.placer import host_sharing  # noqa: E402
from toolkit.placement.schedules import compare, net_graph  # noqa: E402
from toolkit.runtime.parallel import default_threads  # noqa: E402
from toolkit.settings import current  # noqa: E402
from toolkit.zoo.resolve import load_net  # noqa: E402

NETS = ["zoo:branchnet", str(ROOT / "benchmarks" / "nets" / "inception.yaml")]


def manual(net, second: str) -> dict[str, dict[str, str]]:
    """devices.md's placement: the first InnerProduct layer on the second device."""
    first_fc = next((layer.name for layer in net.spec.layers if layer.type == "InnerProduct"), None)
    return {f"manual: {first_fc} on {second}": {first_fc: second}} if first_fc else {}


def measure(name: str, batch: int, devices: list[str], rounds: int, iters: int) -> list[dict]:
    net = load_net(name)
    graph = net_graph(net, "infer")
    bindings = {s: batch for s in graph.symbols()}
    sharing = host_sharing(devices, concurrent=current().concurrent, threads=default_threads())
    model_of, _name = cost_model([parse_device(d) for d in devices], parse_device(devices[0]), bindings)
    rows = compare(net, "infer", None, bindings, devices, sharing, manual(net, devices[1]), net.init_weights(),
                   model_of=model_of)
    plans = {}
    for row in rows:
        keys = [f"layers.{k}.device={v}" for k, v in row.layers.items() if k in {s.name for s in net.spec.layers}]
        placed = load_net(name, parse_overrides(keys))
        plans[row.name] = bench_plan(placed, batch, False, device=parse_device(devices[0]))
    times: dict[str, list[float]] = {row.name: [] for row in rows}
    for r in range(rounds):
        order = rows if r % 2 == 0 else rows[::-1]
        for row in order:
            plan, inputs = plans[row.name]
            times[row.name].append(float(np.median(time_plan(plan, inputs, iters, 3))) * 1e3)
    out = []
    for row in rows:
        measured = float(np.median(times[row.name]))
        out.append({"net": net.name, "batch": batch, "concurrent": current().concurrent, "placement": row.name,
                    "devices_used": sorted({str(d) for d in plans[row.name][0].build.devices}),
                    "predicted_ms": row.predicted.seconds * 1e3,
                    "measured_ms": measured, "rounds_ms": times[row.name],
                    "transfers": sum(n.op == "transfer" for n in plans[row.name][0].graph.nodes)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nets", nargs="*", default=NETS)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--devices", default="cpu,cpu:1")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    devices = args.devices.split(",")
    for name in args.nets:
        for row in measure(name, args.batch, devices, args.rounds, args.iters):
            if args.json:
                print(json.dumps(row))
                continue
            print(f"{row['net']:10s} N={row['batch']:<3d} concurrent={int(row['concurrent'])} "
                  f"{row['placement']:28s} on {','.join(row['devices_used']):10s} transfers {row['transfers']:2d} "
                  f"predicted {row['predicted_ms']:8.3f} ms measured {row['measured_ms']:8.3f} ms")
    print(f"# TOOLKIT_CONCURRENT={os.environ.get('TOOLKIT_CONCURRENT', '')} threads={default_threads()}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

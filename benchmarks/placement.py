#!/usr/bin/env python
"""Placements of a net over two devices, predicted and measured: every layer on one device, the
slides' three schedules (serial, parallel, greedy; toolkit/placement/schedules.py), the
placer's choice, and the manual placement of docs/explanations/devices.md (the first fully
connected layer on the second device).

    python benchmarks/placement.py [NET ...] [--batch 16] [--devices cpu:0,cpu:1] [--rounds 5]
        [--iters 20] [--fresh-model] [--json]

NET: a net file or zoo name, or ``googlenet`` (BVLC's deploy net, imported from the Caffe test
data). Each placement's plan is built once (the infer phase, weights frozen in, as `toolkit
bench` builds it) and timed in interleaved rounds (every placement once per round, the order
reversed every other round, ``--iters`` runs each after warm-up); the figure is the median over
the rounds of each round's median. A plan whose layers use two host devices that can run at once
runs them as two core groups (runtime/device_groups.py; ``TOOLKIT_DEVICE_GROUPS=0``: one step
after another, as before); "serial on cpu" is every layer on one device, each op split over
both cores.

The prediction is the placer's simulation with the model `toolkit compile --place auto` uses
(the measured one on the host: each placement's kernels timed once per machine and cached;
``--fresh-model``: measured afresh in this run, in a cache folder of its own that shares the
compiled kernels), under the sharing of the devices this process's plans run with. Printed:
each placement's predicted and measured ms and the error, whether the prediction ranks the
placements in their measured order, and how far auto is from the fastest.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit import settings  # noqa: E402
from toolkit.backend.devices import parse_device  # noqa: E402
from toolkit.benchmarking import bench_plan, time_plan  # noqa: E402
from toolkit.cachedir import cache_root  # noqa: E402
from toolkit.commands.placing import cost_model  # noqa: E402
from toolkit.frontend.spec import parse_overrides  # noqa: E402
from toolkit.placement.placer import host_sharing  # noqa: E402
from toolkit.placement.schedules import compare, net_graph  # noqa: E402
from toolkit.runtime.parallel import default_threads  # noqa: E402
from toolkit.settings import current  # noqa: E402
from toolkit.zoo.resolve import load_net  # noqa: E402

NETS = ["zoo:branchnet", str(ROOT / "benchmarks" / "nets" / "inception.yaml")]
GOOGLENET = ROOT / "tests" / "data" / "caffe" / "models_bvlc_googlenet_deploy.prototxt"


def net_path(name: str, tmp: Path) -> str:
    """``googlenet`` imported into ``tmp``; any other name as it is."""
    if name != "googlenet":
        return name
    out = tmp / "googlenet"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "toolkit.cli", "import", "caffe", str(GOOGLENET), "--out", str(out)],
                       cwd=ROOT, check=True, capture_output=True)
    return str(out / "net.yaml")


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
    rows = compare(net, "infer", None, bindings, devices, sharing, manual(net, str(parse_device(devices[1]))),
                   net.init_weights(), model_of=model_of)
    plans = {}
    layer_names = {s.name for s in net.spec.layers}
    for row in rows:
        keys = [f"layers.{k}.device={v}" for k, v in row.layers.items() if k in layer_names]
        placed = load_net(name, parse_overrides(keys))
        plans[row.name] = bench_plan(placed, batch, False, device=parse_device(devices[0]))
    times: dict[str, list[float]] = {row.name: [] for row in rows}
    loads = []
    for r in range(rounds):
        order = rows if r % 2 == 0 else rows[::-1]
        for row in order:
            plan, inputs = plans[row.name]
            times[row.name].append(float(np.median(time_plan(plan, inputs, iters, 3))) * 1e3)
        loads.append(os.getloadavg()[0])
    out = []
    for row in rows:
        plan = plans[row.name][0]
        groups = plan.schedule.groups
        out.append({"net": net.name, "batch": batch, "concurrent": current().concurrent, "placement": row.name,
                    "how": row.predicted.how,
                    "devices_used": sorted({str(plan.build.placement.node(n)) for n in plan.steps}),
                    "runs": "groups" if groups is not None else "serial",
                    "predicted_ms": row.predicted.seconds * 1e3,
                    "measured_ms": float(np.median(times[row.name])), "rounds_ms": times[row.name],
                    "transfers": sum(n.op == "transfer" for n in plan.graph.nodes),
                    "load": float(np.median(loads))})
    return out


def summary(rows: list[dict]) -> list[str]:
    """Whether the prediction ranks the placements as measured, and auto against the fastest."""
    by_pred = [r["placement"] for r in sorted(rows, key=lambda r: r["predicted_ms"])]
    by_meas = [r["placement"] for r in sorted(rows, key=lambda r: r["measured_ms"])]
    best = min(rows, key=lambda r: r["measured_ms"])
    auto = next(r for r in rows if r["placement"] == "auto")
    behind = auto["measured_ms"] / best["measured_ms"] - 1
    return [f"predicted order: {' < '.join(by_pred)}",
            f"measured order:  {' < '.join(by_meas)}" + (" (the same)" if by_pred == by_meas else ""),
            f"auto {auto['measured_ms']:.3f} ms, the fastest ({best['placement']}) {best['measured_ms']:.3f} ms: "
            f"auto {100 * behind:+.1f}% ({'within' if behind <= 0.10 else 'NOT within'} 10%)"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("nets", nargs="*", default=NETS)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--devices", default="cpu:0,cpu:1")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--fresh-model", action="store_true", help="measure the cost model afresh in this run")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    devices = args.devices.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = None
        if args.fresh_model:
            cache = tmp / "cache"
            cache.mkdir()
            (cache / "kernels").symlink_to(cache_root() / "kernels", target_is_directory=True)
        with settings.use(cache=cache) if cache is not None else _nothing():
            for name in args.nets:
                rows = measure(net_path(name, tmp), args.batch, devices, args.rounds, args.iters)
                if args.json:
                    for row in rows:
                        print(json.dumps(row))
                    continue
                print(f"\n{rows[0]['net']}, batch {args.batch}, {args.rounds} rounds, load {rows[0]['load']:.1f}, "
                      f"TOOLKIT_CONCURRENT={int(rows[0]['concurrent'])}\n")
                print("| placement | devices | runs | transfers | predicted ms | measured ms | error |")
                print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
                for row in rows:
                    error = 100 * (row["predicted_ms"] / row["measured_ms"] - 1)
                    print(f"| {row['placement']} ({row['how']}) | {', '.join(row['devices_used'])} | {row['runs']} "
                          f"| {row['transfers']} | {row['predicted_ms']:.3f} | {row['measured_ms']:.3f} "
                          f"| {error:+.0f}% |")
                print("\n" + "\n".join(summary(rows)))
    print(f"# TOOLKIT_CONCURRENT={os.environ.get('TOOLKIT_CONCURRENT', '')} "
          f"TOOLKIT_DEVICE_GROUPS={os.environ.get('TOOLKIT_DEVICE_GROUPS', '')} threads={default_threads()}",
          file=sys.stderr)
    return 0


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())

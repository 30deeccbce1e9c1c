#!/usr/bin/env python
"""The measured cost model against the clock: for each net, phase and placement over ``cpu`` and
``cpu:1``, the step time the model predicts (toolkit/placement/predict.py, as `toolkit bench`
prints it) beside the measured median of the same plan, and whether the placements rank alike.
A placement whose two devices have work that can run at once runs them as two core groups
(runtime/device_groups.py; the table's "runs" column; ``TOOLKIT_DEVICE_GROUPS=0``: one step after
another, as before).

    python benchmarks/cost_model.py [--net lenet --net inception ...] [--batch 16] [--rounds 3]
    TOOLKIT_CONCURRENT=1 python benchmarks/cost_model.py --net branchnet --net inception

Rounds are interleaved: each round measures the model afresh in a cache folder of its own, then
predicts and times every placement in turn, so that prediction and measurement see the same
moments of a shared machine; the table gives the medians over the rounds and each round's error.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolkit import settings  # noqa: E402
from toolkit.benchmarking import bench_plan, time_plan  # noqa: E402
from toolkit.commands.bench import _with_objective  # noqa: E402
from toolkit.frontend.spec import parse_overrides  # noqa: E402
from toolkit.placement.predict import predict_plan  # noqa: E402
from toolkit.zoo.resolve import load_net  # noqa: E402

TOWER_3X3 = ["t2_reduce", "t2_reduce_relu", "t2", "t2_relu"]
TOWER_5X5 = ["t3_reduce", "t3_reduce_relu", "t3", "t3_relu"]
NETS = {
    "lenet": ("zoo:lenet", {"all on cpu": [], "ip1 on cpu:1": ["ip1"], "conv2+pool2 on cpu:1": ["conv2", "pool2"],
                            "ip1+relu1+ip2 on cpu:1": ["ip1", "relu1", "ip2"]}),
    "branchnet": ("zoo:branchnet", {"all on cpu": [], "tanh branch on cpu:1": ["branch_tanh", "act_tanh"],
                                    "relu+tanh branches on cpu:1": ["branch_relu", "act_relu", "branch_tanh",
                                                                    "act_tanh"],
                                    "hidden on cpu:1": ["hidden", "hidden_relu"]}),
    "inception": (str(ROOT / "benchmarks" / "nets" / "inception.yaml"),
                  {"all on cpu": [], "3x3 tower on cpu:1": TOWER_3X3, "3x3+5x5 towers on cpu:1": TOWER_3X3 + TOWER_5X5,
                   "pool tower on cpu:1": ["t4_pool", "t4", "t4_relu"]}),
    "googlenet": ("caffe:models_bvlc_googlenet_deploy.prototxt",
                  {"all on cpu": [],
                   "3a's 3x3 tower on cpu:1": [f"inception_3a/{n}" for n in ("3x3_reduce", "relu_3x3_reduce", "3x3",
                                                                             "relu_3x3")],
                   "classifier on cpu:1": ["loss3/classifier"]}),
}


def net_path(source: str, tmp: Path) -> str:
    if not source.startswith("caffe:"):
        return source
    out = tmp / source.split(":", 1)[1].split(".")[0]
    if not out.exists():
        subprocess.run([sys.executable, "-m", "toolkit.cli", "import", "caffe",
                        str(ROOT / "tests" / "data" / "caffe" / source.split(":", 1)[1]), "--out", str(out)],
                       cwd=ROOT, check=True, capture_output=True)
    return str(out / "net.yaml")


def one(path: str, layers: list[str], batch: int, train: bool, iters: int) -> tuple[float, float, int, str]:
    """(predicted ms, measured median ms, fitted kernels, how the plan runs) of one placement."""
    net = load_net(path, parse_overrides([f"layers.{name}.device=cpu:1" for name in layers]))
    if train:
        net = _with_objective(net)
    plan, inputs = bench_plan(net, batch, train)
    predicted = predict_plan(plan)
    measured = float(np.median(time_plan(plan, inputs, iters, 3)))
    return predicted.seconds * 1e3, measured * 1e3, predicted.fitted, predicted.schedule


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--net", action="append", choices=list(NETS))
    p.add_argument("--phase", action="append", choices=["infer", "train"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args()
    nets, phases = args.net or ["lenet", "branchnet", "inception"], args.phase or ["infer", "train"]
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = {name: net_path(NETS[name][0], tmp) for name in nets}
        for r in range(args.rounds):
            with settings.use(cache=tmp / f"cache-{r}"):          # a model measured afresh each round
                for name in nets:
                    for phase in phases:
                        for label, layers in NETS[name][1].items():
                            pred, meas, fitted, runs = one(paths[name], layers, args.batch, phase == "train",
                                                           args.iters)
                            records.append({"round": r, "net": name, "phase": phase, "placement": label,
                                            "predicted_ms": pred, "measured_ms": meas, "fitted": fitted, "runs": runs,
                                            "load": os.getloadavg()[0], "time": time.time()})
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    print(f"batch {args.batch}, {args.rounds} interleaved rounds, TOOLKIT_CONCURRENT="
          f"{os.environ.get('TOOLKIT_CONCURRENT', '0')}, load {np.median([r['load'] for r in records]):.1f}\n")
    print("| net | phase | placement | runs | predicted ms | measured ms | error | each round |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | --- |")
    ranks = []
    for name in nets:
        for phase in phases:
            rows = []
            for label in NETS[name][1]:
                mine = [x for x in records if (x["net"], x["phase"], x["placement"]) == (name, phase, label)]
                pred = float(np.median([x["predicted_ms"] for x in mine]))
                meas = float(np.median([x["measured_ms"] for x in mine]))
                each = " ".join(f"{100 * (x['predicted_ms'] / x['measured_ms'] - 1):+.0f}%" for x in mine)
                print(f"| {name} | {phase} | {label} | {mine[0]['runs']} | {pred:.3f} | {meas:.3f} "
                      f"| {100 * (pred / meas - 1):+.1f}% | {each} |")
                rows.append((label, pred, meas))
            by_pred = [x[0] for x in sorted(rows, key=lambda x: x[1])]
            by_meas = [x[0] for x in sorted(rows, key=lambda x: x[2])]
            ranks.append(f"{name} {phase}: predicted {' < '.join(by_pred)}; measured {' < '.join(by_meas)}"
                         + (" (the same)" if by_pred == by_meas else ""))
    print("\n" + "\n".join(ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())

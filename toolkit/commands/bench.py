"""``toolkit bench``: times inference passes or full train steps in one process (``--per-layer``:
the table of bench_layers.py); the plan it times is built by toolkit/benchmarking.py."""
from __future__ import annotations

import json

import numpy as np

from ..backend.options import check_device, resolve_dtype, resolve_train_dtype
from ..benchmarking import bench_plan, time_plan
from ..compile import disabled_passes, solver_config
from ..errors import UserError
from ..frontend import Net
from ..frontend.spec import parse_overrides
from ..placement.predict import predicted_step
from ..settings import precision_policy
from ..zoo.resolve import load_net
from .bench_layers import format_table, json_rows, per_layer_table


def parse_dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit() or len(value.strip()) > 18 or int(value) < 1:
            # (18 digits: beyond any memory, and short of Python's limit on converting digits)
            shown = item if len(item) <= 60 else item[:60] + "..."
            raise UserError(f"--dim {shown}: expected NAME=SIZE with a positive size of at most 18 digits")
        dims[name.strip()] = int(value)
    return dims


def _with_objective(net: Net) -> Net:
    """A net without a loss (a deploy net) with the objective `caffe time`'s backward amounts to,
    said on stderr (frontend/heads.py)."""
    import sys

    from ..frontend.heads import with_objective
    net, note = with_objective(net)
    if note:
        print(note, file=sys.stderr)
    return net


def _int8_layers(net: Net, plan, train: bool) -> tuple[int, int] | None:
    """(int8 layers, layers) of a quantized net's infer plan; None where nothing runs in int8."""
    if train or getattr(net.spec, "quantization", None) is None or not hasattr(plan, "graph"):
        return None
    from ..passes.quantize import int8_layers
    counted = int8_layers(plan.graph)
    return counted if counted[0] else None


def _predicted_text(predicted: dict, median_ms: float) -> str:
    """The measured cost model's prediction, beside the measured median on the summary line."""
    if predicted["ms"] is None:
        return ""
    return f"; predicted {predicted['ms']:.3f} ms by the cost model ({100 * (predicted['ms'] / median_ms - 1):+.0f}%)"


def run_bench(args) -> int:
    args.device = check_device(args.device)
    args.dtype = resolve_train_dtype(args.dtype, args.device) if args.train else resolve_dtype(args.dtype, args.device)
    net = load_net(args.net, parse_overrides(args.overrides))
    if args.train:
        net = _with_objective(net)
    disable = disabled_passes(net, args.disable, args.no_optimize)
    solver = solver_config(net)
    weights_file = net.weights_or_published(args.weights)
    plan, inputs = bench_plan(net, args.batch, args.train, args.dtype, disable, parse_dims(args.dim), args.device,
                              weights_file, args.lr)
    profiles = [] if args.per_layer else None
    times = np.array(time_plan(plan, inputs, args.iters, args.warmup, profiles)) * 1e3
    median = float(np.median(times))
    report = {
        "net": net.name, "mode": "train" if args.train else "infer", "batch": args.batch,
        "device": str(args.device), "dtype": args.dtype or "float32", "iters": args.iters,
        # the float32 math policy of the GPU's convolutions (a host device's math is always strict)
        "precision": "strict" if args.device.host_memory else precision_policy(net.spec.precision),
        "solver": solver.type if args.train else None,
        "optimized": not args.no_optimize, "disabled": list(disable), "median_ms": round(median, 4),
        "p10_ms": round(float(np.percentile(times, 10)), 4),
        "p90_ms": round(float(np.percentile(times, 90)), 4),
        "items_per_s": round(args.batch / (median / 1e3), 1),
        "kernel_calls": len(plan.calls), "peak_bytes": plan.peak_bytes,
    }
    # the measured cost model's prediction of the same step (toolkit/placement/predict.py), when
    # asked: profiling a real-size net's kernels takes at least 15 more runs of it
    if args.predict:
        report["predicted"] = predicted_step(plan)
    int8 = _int8_layers(net, plan, args.train)
    if int8 is not None:
        report["int8_layers"] = {"int8": int8[0], "layers": int8[1]}
    rows = None
    if profiles is not None:
        phase = "train" if args.train else "infer"
        layers = [(layer.name, layer.type) for layer in net.spec.layers if phase in layer.phases]
        with_impls = getattr(plan, "impls", None) is not None
        rows, profiled = per_layer_table(plan, profiles, layers, solver.type if args.train else None)
        report["profiled_ms"] = round(profiled, 4)
        report["per_layer"] = json_rows(rows, profiled, with_impls)
    if args.json:
        print(json.dumps(report))
        return 0
    math = "" if args.device.host_memory else f", {report['precision']}"
    kind = report["dtype"]
    if int8 is not None:       # a quantized net: how much of it runs in int8
        kind = f"int8: {int8[0]} of {int8[1]} layers" + ("" if int8[0] == int8[1] else f"; {kind} elsewhere")
    print(f"{report['net']} {report['mode']} batch {args.batch} on {args.device} ({kind}{math}): "
          f"median {median:.3f} ms (p10 {report['p10_ms']:.3f}, p90 {report['p90_ms']:.3f}), "
          f"{report['items_per_s']:.0f} items/s, {len(plan.calls)} kernel calls, "
          f"{plan.peak_bytes / 2**20:.1f} MiB arena"
          + (_predicted_text(report["predicted"], median) if "predicted" in report else ""))
    if rows is not None:
        print(f"per layer, median of {args.iters} profiled runs, each after a timed one: {profiled:.3f} ms in all "
              f"(a timer on each of {len(plan.steps)} calls) vs {median:.3f} ms unprofiled median")
        print(format_table(rows, profiled, args.train, with_impls))
    return 0

"""``toolkit bench``: times inference passes or full train steps in one process."""
from __future__ import annotations

import json
import time

import numpy as np

from ..compile import disabled_passes, forward_graph, solver_config, train_step_graph
from ..errors import UserError
from ..frontend import Net
from ..ir.graph import FLOAT_DTYPES
from ..runtime.plan import Plan
from ..runtime.session import batch_bindings
from ..train.solvers import host_values
from .devices import check_device


def parse_dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise UserError(f"--dim {item}: expected NAME=SIZE with a positive size")
        dims[name.strip()] = int(value)
    return dims


def bench_inputs(graph, bindings, rng) -> dict[str, np.ndarray]:
    """Random normal floats and zero integers (valid labels / indices) of the declared shapes."""
    out = {}
    for name, v in graph.inputs.items():
        if name.startswith("@"):
            continue                      # per-step solver scalars: set by the caller
        shape = v.type.concrete(bindings)
        out[name] = (rng.standard_normal(shape).astype(v.dtype) if v.dtype in FLOAT_DTYPES
                     else np.zeros(shape, dtype=v.dtype))
    return out


def time_plan(plan: Plan, inputs, iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        plan.run(inputs)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        plan.run(inputs)
        times.append(time.perf_counter() - start)
    return times


def run_bench(args) -> int:
    check_device(args.device)
    net = Net.load(args.net)
    disable = disabled_passes(net, args.disable, args.no_optimize)
    solver = solver_config(net)
    weights = net.init_weights(seed=0, dtype=args.dtype)
    if args.train:
        graph = train_step_graph(net, solver, args.dtype, disable)
    else:    # as `toolkit infer` runs it: the weights frozen into the graph
        graph = forward_graph(net, "infer", args.dtype, disable=disable, weights=weights)
    bindings = batch_bindings(graph, args.batch, parse_dims(args.dim))
    for name, w in graph.weights.items():          # solver slots start at zero
        weights.setdefault(name, np.zeros(w.value.type.concrete({}), w.value.dtype))
    plan = Plan(graph, bindings, {k: weights[k] for k in graph.weights}, args.device)
    inputs = bench_inputs(graph, bindings, np.random.default_rng(0))
    if args.train:
        base_lr = args.lr if args.lr is not None else (net.spec.train.solver.base_lr if net.spec.train else 0.01)
        inputs.update(host_values(solver, base_lr, 1, args.dtype or "float32"))
    times = np.array(time_plan(plan, inputs, args.iters, args.warmup)) * 1e3
    median = float(np.median(times))
    report = {
        "net": net.name, "mode": "train" if args.train else "infer", "batch": args.batch,
        "device": args.device, "dtype": args.dtype or "float32", "iters": args.iters,
        "solver": solver.type if args.train else None,
        "optimized": not args.no_optimize, "disabled": list(disable), "median_ms": round(median, 4), "p10_ms": round(float(np.percentile(times, 10)), 4),
        "p90_ms": round(float(np.percentile(times, 90)), 4),
        "items_per_s": round(args.batch / (median / 1e3), 1),
        "kernel_calls": len(plan.calls), "peak_bytes": plan.peak_bytes,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['net']} {report['mode']} batch {args.batch} on {args.device} ({report['dtype']}): "
              f"median {median:.3f} ms (p10 {report['p10_ms']:.3f}, p90 {report['p90_ms']:.3f}), "
              f"{report['items_per_s']:.0f} items/s, {len(plan.calls)} kernel calls, "
              f"{plan.peak_bytes / 2**20:.1f} MiB arena")
    return 0

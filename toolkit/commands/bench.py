"""``toolkit bench``: times inference passes or full train steps in one process (``--per-layer``:
the table of bench_layers.py)."""
from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np

from ..backend.devices import CPU, Device
from ..backend.options import check_device, resolve_dtype, resolve_train_dtype
from ..compile import disabled_passes, forward_graph, solver_config, train_step_graph
from ..errors import UserError
from ..hostmem import human_bytes, too_big
from ..frontend import Net
from ..ir.graph import FLOAT_DTYPES, LOW_PRECISION
from ..optim.loss_scaling import MixedPrecision
from ..optim.solvers import host_values, initial_state
from ..passes.pipeline import memory_reuse
from ..runtime.plan import Plan
from ..runtime.session import batch_bindings
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


def bench_inputs(graph, bindings, rng) -> dict[str, np.ndarray]:
    """Random normal floats and zero integers (valid labels / indices) of the declared shapes."""
    out = {}
    for name, v in graph.inputs.items():
        if name.startswith("@"):
            continue                      # per-step solver scalars: set by the caller
        shape = v.type.concrete(bindings)
        nbytes = math.prod(shape) * np.dtype(v.dtype).itemsize
        why = too_big(nbytes)
        if why is not None:
            raise UserError(f"input '{name}' of shape [{', '.join(map(str, shape))}] ({v.dtype}) is "
                            f"{human_bytes(nbytes)}, {why}")
        out[name] = (rng.standard_normal(shape).astype(v.dtype) if v.dtype in FLOAT_DTYPES
                     else np.zeros(shape, dtype=v.dtype))
    return out


def time_plan(plan: Plan, inputs, iters: int, warmup: int, profiles: list | None = None) -> list[float]:
    """Seconds of each of ``iters`` runs after ``warmup``; given ``profiles``, each timed run is
    followed by a profiled one (``Plan.profile``) appended there, interleaved so that both see
    the same machine load."""
    for _ in range(warmup):
        plan.run(inputs)
    plan.synchronize()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        plan.run(inputs)
        plan.synchronize()                # a GPU's launches return before its kernels finish
        times.append(time.perf_counter() - start)
        if profiles is not None:
            profiles.append(plan.profile(inputs))
    return times


def stand_in_weights(weights: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """Filler weights with every constant-filled array (biases, BatchNorm parameters and
    statistics) given small random values, as after training: a zero bias or a unit scale
    frozen into an infer graph would let the optimiser drop work a trained model needs."""
    rng = np.random.default_rng(seed + 1)
    out = {}
    for key, w in weights.items():
        if w.size and np.all(w == w.flat[0]):
            w = w + rng.uniform(-0.1, 0.1, w.shape).astype(w.dtype)
            if key.endswith("running_var"):
                w = np.abs(w) + 0.5
        out[key] = np.asarray(w, order="C")
    return out


def bench_plan(net: Net, batch: int, train: bool, dtype: str | None = None, disable: tuple[str, ...] = (),
               dims: dict[str, int] | None = None, device: Device | str = CPU, weights_file: str | None = None,
               lr: float | None = None, capture: bool | None = None) -> tuple[Plan, dict]:
    """The plan `toolkit bench` times and its inputs: the infer phase with the weights frozen in
    (as `toolkit infer` runs it), or the train step with the net's solver. ``capture``: False
    keeps a GPU plan kernel by kernel (default: captured as a CUDA graph where it can be)."""
    solver = solver_config(net)
    if train and dtype in LOW_PRECISION:      # a half-precision train step is mixed precision
        solver = replace(solver, mixed_precision=replace(solver.mixed_precision or MixedPrecision(), dtype=dtype))
        dtype = None
    if weights_file:
        weights = net.load_weights(weights_file, dtype=dtype)
    else:
        weights = stand_in_weights(net.init_weights(seed=0, dtype=dtype))
    if train:
        graph = train_step_graph(net, solver, dtype, disable, device)
    else:
        graph = forward_graph(net, "infer", dtype, disable=disable, weights=weights, device=device,
                              consume_weights=True)
    bindings = batch_bindings(graph, batch, dims or {})
    for name, w in graph.weights.items():          # solver slots and the loss scale
        if name not in weights:
            weights[name] = initial_state(w)
    plan = Plan(graph, bindings, {k: weights[k] for k in graph.weights}, device, reuse_memory=memory_reuse(disable),
                capture=capture)
    inputs = bench_inputs(graph, bindings, np.random.default_rng(0))
    if train:
        base_lr = lr if lr is not None else (net.spec.train.solver.base_lr if net.spec.train else 0.01)
        inputs.update(host_values(solver, base_lr, 1, dtype or "float32"))
    return plan, inputs


def _with_objective(net: Net) -> Net:
    """A net without a loss (a deploy net) with the objective `caffe time`'s backward amounts to,
    said on stderr (frontend/heads.py)."""
    import sys

    from ..frontend.heads import with_objective
    net, note = with_objective(net)
    if note:
        print(note, file=sys.stderr)
    return net


def run_bench(args) -> int:
    args.device = check_device(args.device)
    args.dtype = resolve_train_dtype(args.dtype, args.device) if args.train else resolve_dtype(args.dtype, args.device)
    net = load_net(args.net)
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
        "solver": solver.type if args.train else None,
        "optimized": not args.no_optimize, "disabled": list(disable), "median_ms": round(median, 4), "p10_ms": round(float(np.percentile(times, 10)), 4),
        "p90_ms": round(float(np.percentile(times, 90)), 4),
        "items_per_s": round(args.batch / (median / 1e3), 1),
        "kernel_calls": len(plan.calls), "peak_bytes": plan.peak_bytes,
    }
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
    print(f"{report['net']} {report['mode']} batch {args.batch} on {args.device} ({report['dtype']}): "
          f"median {median:.3f} ms (p10 {report['p10_ms']:.3f}, p90 {report['p90_ms']:.3f}), "
          f"{report['items_per_s']:.0f} items/s, {len(plan.calls)} kernel calls, "
          f"{plan.peak_bytes / 2**20:.1f} MiB arena")
    if rows is not None:
        print(f"per layer, median of {args.iters} profiled runs, each after a timed one: {profiled:.3f} ms in all "
              f"(a timer on each of {len(plan.steps)} calls) vs {median:.3f} ms unprofiled median")
        print(format_table(rows, profiled, args.train, with_impls))
    return 0

"""What `toolkit bench` times, as a library: the plan of a net's infer phase (weights frozen in)
or train step, made with stand-in weights and random inputs, and the timing loop around it. The
command, the tests and the benchmarks build their plans here, so that they time the same thing.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from .backend.devices import CPU, Device
from .compile import forward_graph, solver_config, train_step_graph
from .errors import UserError
from .frontend import Net
from .hostmem import human_bytes, too_big
from .ir.graph import FLOAT_DTYPES, LOW_PRECISION
from .optim.loss_scaling import MixedPrecision
from .optim.solvers import host_values, initial_state
from .passes.pipeline import memory_reuse
from .runtime.plan import Plan
from .runtime.session import batch_bindings


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

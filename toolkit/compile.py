"""From a Net to optimised executable graphs: the forward graph of a phase, and the train step
(forward + generated backward + solver update ops) as one graph; both through the pass pipeline.

Where the weights are fixed for the graph's life (infer, and the test command), they are given
here and frozen into constants before the passes run, so that what is computed from weights
alone (a BatchNorm folded into its convolution, concatenated GEMM weights) is computed once, at
compile time. A train graph's weights change every step and are never frozen.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

import numpy as np

from .backend.devices import CPU, Device, parse_device
from .errors import UserError
from .frontend import OBJECTIVE, Net
from .ir.graph import Graph, Value
from .ops.autodiff import differentiate
from .optim.data_parallel import DataParallel, allreduce_gradients, local_share, sum_logged_losses
from .optim.loss_scaling import MixedPrecision, scaled_objective
from .optim.solvers import SolverConfig, add_solver
from .passes.constants import freeze_weights
from .passes.context import PassContext
from .passes.pipeline import PassRecord, UnknownPass, check_pass_names, no_optimize, run_pipeline
from .passes.precision import autocast, has_half, store_half_as_float32


def disabled_passes(net: Net | None = None, disable: Iterable[str] = (), no_opt: bool = False) -> tuple[str, ...]:
    """The passes switched off: the net file's ``optimize: {disable: [...]}``, then ``--disable``
    flags, and everything optional under ``--no-optimize``. An unknown name is a user error."""
    names = list(net.spec.optimize.disable) if net is not None and net.spec.optimize else []
    try:
        check_pass_names(list(disable))
    except UnknownPass as e:
        raise UserError(f"--disable: {e}") from None
    names += [n for n in disable if n not in names]
    if no_opt:
        names += [n for n in no_optimize() if n not in names]
    return tuple(names)


def optimize(graph: Graph, disable: tuple[str, ...] = (), weights: Mapping[str, np.ndarray] | None = None,
             device: Device | str = CPU, *, check: bool = False, records: list[PassRecord] | None = None,
             observe: Callable | None = None, notes: list[str] | None = None, consume_weights: bool = False) -> Graph:
    """Freeze ``weights`` (when given) into constants, then run the pass pipeline for ``device``
    with ``disable`` switched off; ``check`` verifies after every pass, ``records`` and
    ``observe`` see each pass run, ``notes`` receives one line per change. Half-typed values on
    a device without half-precision arrays are stored as float32 first. ``consume_weights``:
    the frozen arrays are taken out of ``weights`` (a dict the caller hands over and does not
    read again), so that a weight the passes fold into another array is not kept twice."""
    device = parse_device(device)
    if weights is not None:
        freeze_weights(graph, weights, consume=consume_weights)
    emulated = device.emulated_half_types
    if emulated and has_half(graph, emulated):
        store_half_as_float32(graph, emulated)
    ctx = PassContext(device, frozenset(disable), notes if notes is not None else [], check)
    return run_pipeline(graph, ctx, records, observe)


def forward_graph(net: Net, phase: str = "infer", dtype: str | None = None,
                  outputs: list[str] | None = None, disable: tuple[str, ...] = (),
                  weights: Mapping[str, np.ndarray] | None = None, device: Device | str = CPU,
                  consume_weights: bool = False) -> Graph:
    return optimize(net.graph(phase, dtype, outputs), disable, weights, device, consume_weights=consume_weights)


def add_gradients(graph: Graph, mixed_precision: MixedPrecision | None = None,
                  objective: Value | None = None) -> dict[str, Value]:
    """Append the backward pass of the train graph (from ``objective``, by default the graph's);
    returns {weight name: gradient}. Weights with lr_mult 0 (frozen) and state buffers get no
    gradient work. Under mixed precision the backward pass starts from the loss-scaled objective."""
    trainable = [w for w in graph.weights.values() if w.trainable and w.lr_mult != 0]
    if objective is None:
        objective = graph.outputs[OBJECTIVE]
    if mixed_precision is not None:
        objective = scaled_objective(graph, objective, mixed_precision)
    grads = differentiate(graph, objective, [w.value for w in trainable])
    return {w.name: grads[w.value.id] for w in trainable if grads[w.value.id] is not None}


def solver_config(net: Net) -> SolverConfig:
    """The net's own solver (its train section), or plain SGD when it has none."""
    if net.spec.train is not None:
        return SolverConfig.from_spec(net.spec.train.solver)
    return SolverConfig()


def train_graph(net: Net, solver: SolverConfig | None = None, dtype: str | None = None,
                data_parallel: DataParallel | None = None, bucketed: frozenset[str] = frozenset()) -> Graph:
    """Forward, generated backward and the solver's updates, before any pass. With
    ``data_parallel`` the gradients are summed over the ranks before the updates
    (optim/data_parallel.py); ``bucketed``: a sequence dimension whose batches come padded, with
    their lengths (train/sequences.py)."""
    options = {}
    if data_parallel is not None and data_parallel.sync_batchnorm:
        options["sync_batchnorm"] = True
    if bucketed:
        options["bucketed"] = bucketed
    graph = net.graph("train", dtype, **options)
    solver = solver or solver_config(net)
    mp = solver.mixed_precision
    if mp is not None:
        autocast(graph, mp.dtype)
    if data_parallel is None:
        add_solver(graph, add_gradients(graph, mp), solver)
        return graph
    objective = local_share(graph, graph.outputs[OBJECTIVE])
    grads = add_gradients(graph, mp, objective)
    sum_logged_losses(graph, [OBJECTIVE] + [t for t in graph.losses if t in graph.outputs and t != OBJECTIVE])
    add_solver(graph, allreduce_gradients(graph, grads, data_parallel), solver)
    return graph


def train_step_graph(net: Net, solver: SolverConfig | None = None, dtype: str | None = None,
                     disable: tuple[str, ...] = (), device: Device | str = CPU) -> Graph:
    """The optimised train step; per-step scalars (``@lr``, ...) are graph inputs."""
    return optimize(train_graph(net, solver, dtype), disable, device=device)

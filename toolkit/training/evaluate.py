"""Evaluation: the example-weighted means of a net's scalar test outputs (its losses, Accuracy)
over a split of its data. ``evaluate`` is the public face, what ``toolkit test`` and a model's
publishing measure; a training run's test passes use the same graph and the same means, on the
live weights (``test_graph`` without weights, ``mean_outputs`` over its own plan cache).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend.devices import CPU, Device, parse_device
from ..compile import disabled_passes, optimize
from ..errors import UserError
from ..frontend import Net
from ..ir.graph import Graph
from ..passes.pipeline import memory_reuse
from ..runtime.plan import RuntimeState
from .data import Dataset
from .feeding import as_fed, batch_transform, load_data, train_spec
from .plans import PlanCache
from .sequences import bucketed_dimensions

SPLITS = ("test", "train")


class NoTestData(UserError):
    """The net has nothing to evaluate: no split of that name, or no scalar output in phase test."""


@dataclass(frozen=True)
class Evaluation:
    examples: int                 # the examples the means are over
    metrics: dict[str, float]     # each scalar test output by name (a loss under its top's name)


def evaluate(net: Net, weights: dict[str, np.ndarray] | str | None, split: str = "test", *,
             device: Device | str = CPU, disable: tuple[str, ...] | None = None, comm=None) -> Evaluation:
    """The net's test phase over the ``split`` of its ``train.data`` with these weights, fed as a
    training run's test passes are (the test transform, the same batches, sequences padded to the
    same buckets). ``weights``: the arrays, or a weights file (None: a zoo net's published ones),
    read once the data is known to have the split. ``disable``: the passes left out (the net's
    own choice when None); ``comm``: the ranks of a data-parallel job share the examples out, and
    every rank gets the means."""
    if split not in SPLITS:
        raise UserError(f"no split '{split}' to evaluate (the splits are: {', '.join(SPLITS)})")
    device = parse_device(device)
    disable = disabled_passes(net) if disable is None else disable
    spec = train_spec(net)
    if split == "test":
        dataset = load_data(net, spec)[1]
    else:                          # the training examples as a test pass sees them (a centre crop)
        dataset = as_fed(load_data(net, spec, transformed=False)[0], batch_transform(net, spec), test=True)
    if dataset is None:
        raise NoTestData("the net's data has no test split: set train.data.test_fraction or test_source")
    if weights is None or isinstance(weights, str):
        weights = net.load_weights(net.default_weights(weights))
    graph = test_graph(net, disable, weights, device, bucketed=bucketed_dimensions(net))
    if graph is None:
        raise NoTestData("the test phase has no scalar output (add an Accuracy or loss layer in phase test)")
    cache = PlanCache(graph, weights, RuntimeState(np.random.default_rng(0)), device, memory_reuse(disable))
    batch = spec.data.batch_size
    metrics = mean_outputs(cache, dataset, batch) if comm is None else mean_outputs_shared(cache, dataset, batch, comm)
    return Evaluation(len(dataset), metrics)


def test_graph(net: Net, disable: tuple[str, ...] = (), weights: dict[str, np.ndarray] | None = None,
               device: Device | str = CPU, bucketed: frozenset[str] = frozenset()) -> Graph | None:
    """The test phase's scalar outputs, optimised; ``weights`` (when they stay fixed, as in
    ``toolkit test``) are frozen into it. A training run's test graph reads the live weights.
    ``bucketed``: a sequence dimension whose batches come padded, with their lengths."""
    graph = net.graph("test", bucketed=bucketed) if bucketed else net.graph("test")
    graph.outputs = {k: v for k, v in graph.outputs.items() if v.shape == ()}
    if not graph.outputs:
        return None
    return optimize(graph, disable, weights, device)


def mean_outputs(cache: PlanCache, dataset: Dataset, batch: int) -> dict[str, float]:
    """Example-weighted means of the graph's scalar outputs over a data set."""
    names = [n for n, v in cache.graph.outputs.items() if v.shape == ()]
    totals = dict.fromkeys(names, 0.0)
    inputs = list(cache.graph.inputs)
    for start in range(0, len(dataset), batch):
        rows = np.arange(start, min(start + batch, len(dataset)))
        outs = cache.run({k: v for k, v in dataset.take(rows).items() if k in inputs})
        for n in names:
            totals[n] += float(outs[n]) * len(rows)
    return {n: t / len(dataset) for n, t in totals.items()}


def mean_outputs_shared(cache: PlanCache, dataset: Dataset, batch: int, comm) -> dict[str, float]:
    """``mean_outputs`` over the whole data set shared out among the ranks of ``comm``: each rank
    its contiguous part, the example-weighted sums added up over the ranks."""
    n = len(dataset)
    lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
    names = [k for k, v in cache.graph.outputs.items() if v.shape == ()]
    part = (mean_outputs(cache, Dataset(dataset.take(np.arange(lo, hi))), batch) if hi > lo
            else dict.fromkeys(names, 0.0))
    sums = comm.sum_floats([part[k] * (hi - lo) for k in names])
    return {k: s / n for k, s in zip(names, sums)}

"""A net's tensors' ranges over calibration data: the fp32 infer phase compiled with the
chosen tops as extra outputs, run a batch at a time over at most ``max_examples`` examples (a
seeded draw), each batch's inputs transformed as ``toolkit infer`` transforms them; each
batch's tops fed to an observer (calibrate.py) and dropped, so memory holds one batch's
activations and the observer's histograms, however many examples there are.

The data is arrays by input name, or a stream of them read a range of rows at a time (what
``toolkit infer`` opens its ``--input`` files as: commands/io.py's ``open_inputs``, given the
input transform's ``image_reader`` for image files, as infer gives it)."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator, Mapping, Protocol

import numpy as np

from ..errors import UserError
from ..inference import infer_phase
from ..ir.graph import FLOAT_DTYPES
from ..training.data import InputTransform
from .calibrate import METHODS, make_observer

DEFAULT_EXAMPLES = 256
DEFAULT_BATCH = 32


class RowSource(Protocol):
    """Rows read by range, in step across the inputs (commands/io.py's InputStream)."""

    @property
    def rows(self) -> int | None: ...

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]: ...


class _Arrays:
    """Whole arrays by input name as a RowSource."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        self.arrays = {name: np.asarray(a) for name, a in arrays.items()}
        counts = {name: (a.shape[0] if a.ndim else None) for name, a in self.arrays.items()}
        if len(set(counts.values())) > 1 or None in counts.values():
            said = ", ".join(f"'{n}' {c if c is not None else 'a scalar'}" for n, c in counts.items())
            raise UserError(f"the calibration arrays must have as many rows each: {said}")
        self.rows = next(iter(counts.values()), 0)

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {name: a[start:stop] for name, a in self.arrays.items()}


def calibration_batches(source: RowSource, max_examples: int = DEFAULT_EXAMPLES, batch_size: int = DEFAULT_BATCH,
                        seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Batches of at most ``batch_size`` rows of ``source``: ``max_examples`` of its rows drawn
    without replacement in an order fixed by ``seed`` (all its rows when it has fewer),
    each read as runs of consecutive rows."""
    total = _check_counts(source, max_examples, batch_size)
    order = np.random.default_rng(seed).permutation(total)[:max_examples]
    for first in range(0, len(order), batch_size):
        picked = order[first:first + batch_size]
        pieces = [source.read(int(start), int(stop)) for start, stop in _runs(picked)]
        yield {name: np.concatenate([p[name] for p in pieces]) if len(pieces) > 1 else pieces[0][name]
               for name in pieces[0]}


def _check_counts(source: RowSource, max_examples: int, batch_size: int) -> int:
    """The rows of ``source``, after the counts asked for are checked."""
    if max_examples < 1 or batch_size < 1:
        raise UserError(f"calibration needs at least one example and one row a batch "
                        f"(got {max_examples} examples, batches of {batch_size})")
    total = source.rows
    if not total:
        raise UserError("the calibration data has no rows")
    return total


def _runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive rows, in the order given."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([int(i), int(i) + 1])
    return [(a, b) for a, b in runs]


def float_runs(phase, weights: Mapping[str, np.ndarray], source: RowSource, tops: list[str],
               max_examples: int = DEFAULT_EXAMPLES, batch_size: int = DEFAULT_BATCH, seed: int = 0,
               transform: bool = True) -> Iterator[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """The fp32 infer ``phase`` compiled with ``tops`` (tops it computes) kept as outputs, run
    over the calibration batches of ``source``: for each, the batch as fed (transformed as
    ``toolkit infer`` transforms it, where ``transform``) and the values computed (the phase's
    outputs and ``tops``; nothing is run where ``tops`` is empty)."""
    total = _check_counts(source, max_examples, batch_size)
    # the model's outputs and the tops asked for: a top that only an output's path computes
    # is kept by the plan as an output of its own (the passes do not fuse it away)
    graph = phase.net.graph("infer", "float32", outputs=list(dict.fromkeys([*phase.graph.outputs, *tops])))
    size = min(batch_size, max_examples, total)
    last = min(max_examples, total) % size
    session = replace(phase, graph=graph).session(dict(weights), sorted({size, last} - {0}))
    step = InputTransform.of(phase.net) if transform else None
    for batch in calibration_batches(source, max_examples, batch_size, seed):
        batch = {k: v for k, v in batch.items() if k in graph.inputs}
        if step is not None:
            batch = step(batch)
        yield batch, (dict(session.run(batch)) if tops else {})


def float_tops(net, dtype: str = "float32") -> list[str]:
    """The names of the infer phase's float blobs, its inputs first then each layer's tops in
    the net's order (an in-place top, such as a ReLU's, names the value after the layer)."""
    blobs = net.lower("infer", dtype).blobs
    return [name for name, v in blobs.items() if v.dtype in FLOAT_DTYPES]


def collect_ranges(net, weights: "str | Mapping[str, np.ndarray] | None", data: "Mapping[str, np.ndarray] | RowSource",
                   tops: Iterable[str] | None = None, method: str = "minmax", symmetric: bool | None = None, *,
                   max_examples: int = DEFAULT_EXAMPLES, batch_size: int = DEFAULT_BATCH, seed: int = 0,
                   device: str = "cpu", transform: bool = True, overrides=(), say=None,
                   **options) -> dict[str, tuple[float, float]]:
    """The range (min, max as floats) of each of ``tops`` (default: ``float_tops``) over the
    calibration ``data``, by ``method`` (``minmax``, ``percentile``, ``entropy``; ``symmetric``
    (None: ONNX Runtime's default for the method) and ``options`` as ``make_observer`` takes
    them). ``net``: a file, ``zoo:NAME`` or a loaded Net; ``weights``: a weights file (None: a
    zoo model's published weights) or arrays by name. ``overrides``: parsed ``--set`` pairs
    (frontend/spec.py's ``parse_overrides``). An input's range is that of the transformed inputs
    fed; every other top's that of the values the fp32 infer plan computes for it. ``say``: a
    function of one line, told the examples fed after each batch."""
    if method not in METHODS:
        raise UserError(f"calibration method '{method}' is not one of {', '.join(METHODS)}")
    observer = make_observer(method, symmetric, **options)
    source = _Arrays(data) if isinstance(data, Mapping) else data
    _check_counts(source, max_examples, batch_size)
    phase = infer_phase(net, device, "float32", overrides=overrides)
    available = float_tops(phase.net, "float32")
    wanted = list(dict.fromkeys(available if tops is None else tops))
    unknown = [t for t in wanted if t not in available]
    if unknown:
        raise UserError(f"no float top named {', '.join(repr(t) for t in unknown)} in the infer phase "
                        f"(tops: {', '.join(available)})")
    inputs = [t for t in wanted if t in phase.graph.inputs or t in phase.net.spec.inputs]
    computed = [t for t in wanted if t not in inputs]
    loaded = (dict(weights) if isinstance(weights, Mapping) and weights is not None
              else phase.load_weights(weights))
    fed = 0
    for batch, results in float_runs(phase, loaded, source, computed, max_examples, batch_size, seed, transform):
        observer.update({t: batch[t] for t in inputs if t in batch})
        if computed:
            observer.update({t: results[t] for t in computed})
        fed += len(next(iter(batch.values())))
        if say is not None:
            say(f"calibration: {fed} examples")
    ranges = observer.ranges()
    missing = [t for t in wanted if t not in ranges]
    if missing:
        raise UserError(f"the calibration data gave no values for {', '.join(missing)}")
    return {t: ranges[t] for t in wanted}

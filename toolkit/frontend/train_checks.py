"""The train section's rules, checked when the net file is read, each problem located at the
key it is about (``FILE:LINE:COL``): the solver's and lr policy's settings that do not go
together (schemas/train.py states them), a crop that is not the image inputs' size, sequence
lengths without a sequence dimension, and a best-model or early-stopping metric that the test
phase does not measure. `toolkit check` so refuses what `toolkit train` would; what depends on
the data or the device is left to the run.
"""
from __future__ import annotations

from ..errors import Problem
from ..ir.graph import FLOAT_DTYPES
from .yaml_loader import Positions

# names a training log gives its own columns: a test output of one of these names (or of a
# loss top) is logged as test_NAME
LOGGED = frozenset({"iter", "loss", "lr"})


def image_inputs(inputs: dict) -> list[str]:
    """The float inputs of rank 4 ([N, C, H, W]): what crop_size and mirror act on."""
    return [n for n, s in inputs.items() if s.dtype in FLOAT_DTYPES and len(s.shape) == 4]


def sequence_dims(inputs: dict) -> tuple[set[str], list[str]]:
    """The symbols of the inputs' batch dimension, and their other symbolic dimensions."""
    batch = {str(s.shape[0]) for s in inputs.values() if s.shape and isinstance(s.shape[0], str)}
    return batch, sorted({d for s in inputs.values() for d in s.shape[1:] if isinstance(d, str)} - batch)


def sequence_problem(inputs: dict) -> str | None:
    """Why the inputs have no one sequence dimension T besides the batch (train.data.lengths and
    padding_value need one), or None."""
    batch, others = sequence_dims(inputs)
    if len(batch) != 1 or len(others) != 1:
        return ("train.data.lengths and padding_value are for inputs [N, T, ...] with one symbolic "
                f"length besides the batch; the net's inputs have: {', '.join(others) or 'none'}")
    return None


def logged_name(name: str, loss_tops) -> str:
    """A test output's name in the log: a loss or a name the log keeps for itself gets ``test_``."""
    return f"test_{name}" if name in LOGGED or name in loss_tops else name


def metric_name(name: str, measured: list[str]) -> str | None:
    """The logged test metric a config names ('loss' is the test loss, logged as test_loss)."""
    if name in measured:
        return name
    if f"test_{name}" in measured:
        return f"test_{name}"
    return None


def unmeasured(name: str, measured: list[str]) -> str:
    return f"the test phase measures no '{name}' (it measures: {', '.join(measured) or 'nothing'})"


NO_TEST_METRIC = {
    "early_stop": "train.early_stop needs test data and a test metric (train.data.test_fraction or test_source, "
                  "and an Accuracy or loss layer in phase test)",
    "best": "train.best needs test data and a test metric",
}


def train_problems(spec, positions: Positions, train_graph, test_graph) -> list[Problem]:
    """The problems of ``spec.train`` (none without one). ``train_graph``, ``test_graph``: the
    phases lowered, or None where they have problems of their own (the metrics are not judged)."""
    from schemas.train import solver_problems
    train = spec.train
    if train is None:
        return []

    def at(paths, message: str, value: bool = False) -> Problem:
        full = [("train",) + p for p in paths]
        written = next((p for p in full if p in positions.keys or p in positions.values), full[0])
        return Problem(message, positions.locate(written, prefer_key=not value))

    problems = [at([("solver",) + key for key in keys], message) for keys, message in solver_problems(train.solver)]
    data = train.data
    if data.crop_size is not None:
        crop = data.crop_size
        for name in image_inputs(spec.inputs):
            if tuple(spec.inputs[name].shape[2:]) != (crop, crop):
                problems.append(at([("data", "crop_size")], f"train.data.crop_size {crop}: the net's input '{name}' is "
                                   f"{list(spec.inputs[name].shape)}; its height and width must be the crop size",
                                   value=True))
    if data.lengths is not None or data.padding_value is not None:
        key = ("data", "lengths" if data.lengths is not None else "padding_value")
        why = sequence_problem(spec.inputs)
        if why is not None:
            problems.append(at([key], why))
        elif data.padding_value is not None:
            symbol = sequence_dims(spec.inputs)[1][0]
            if not any(s.dtype in FLOAT_DTYPES and symbol in s.shape[1:] for s in spec.inputs.values()):
                problems.append(at([key], "train.data.padding_value needs a float input with the sequence dimension"))
    if test_graph is not None and train_graph is not None:
        problems += _metric_problems(train, at, train_graph, test_graph)
    return problems


def _metric_problems(train, at, train_graph, test_graph) -> list[Problem]:
    """train.early_stop's and train.best's metrics: measured by the test phase, which has data."""
    has_test_data = bool(train.data.test_source) or bool(train.data.test_fraction)
    loss_tops = [t for t in train_graph.losses if t not in LOGGED]
    measured = ([logged_name(k, loss_tops) for k, v in test_graph.outputs.items() if v.shape == ()]
                if has_test_data else [])
    problems = []
    for key in ("early_stop", "best"):
        rule = getattr(train, key)
        if rule is None:
            continue
        if not measured:
            problems.append(at([(key,)], NO_TEST_METRIC[key]))
        elif metric_name(rule.metric, measured) is None:
            problems.append(at([(key, "metric")], unmeasured(rule.metric, measured), value=True))
    return problems

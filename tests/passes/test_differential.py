"""Randomized differential test of the graph optimiser: whatever PIPELINE holds must not change
a single number beyond rounding.

Each run draws random valid nets from ``netgen`` (the whole layer catalog, shaped like what the
passes rewrite) and compares, net by net:

- forward (infer and test phases): the reference interpreter on the unoptimised graph
  ``net.graph(phase, dtype)`` against a Plan of the optimised graph, both as ``forward_graph``
  gives it and with the weights frozen into constants (what ``toolkit infer`` and ``toolkit test``
  compile, and what lets folding passes see the weights), at batch sizes 1 and 3;
- train: the unoptimised train step (forward, ``add_gradients``, ``add_solver``) interpreted,
  against a Plan of ``train_step_graph`` under a random solver configuration, for two steps:
  every output (each loss, the objective, train-phase Accuracy) and every weight update, solver
  slots and BatchNorm running statistics included.

Weights are the fillers' values moved by random amounts (biases and running statistics too),
solver slots random (positive where they hold squares), inputs standard normal, labels valid
class indices. Tolerances: 1e-4 (float32) and 1e-9 (float64) relative to each output's scale
(``output_tolerance``), and for a weight update to the scale of its step (``update_tolerance``).
A float32 difference beyond that is judged against the same computation in float64: it passes
when the optimised result is about as close to float64 as the reference's own float32 result
is, because some nets are ill-conditioned in float32 (a gradient that cancels almost to 0
through BatchNorm).

The run's seed comes from TOOLKIT_DIFF_SEED, else it is drawn at random; it is printed (``-s``)
and every failure message carries it, the net's index and seed and the net's YAML. Replay::

    TOOLKIT_DIFF_SEED=<seed> python -m pytest tests/passes/test_differential.py

The slow variant draws 3000 nets (about three minutes)::

    python -m pytest -m slow tests/passes/test_differential.py
"""
from __future__ import annotations

import copy
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import netgen
import numpy as np
import pytest

from toolkit.compile import add_gradients, forward_graph, train_step_graph
from toolkit.frontend import Net
from toolkit.ops.interpreter import interpret
from toolkit.optim.solvers import SolverConfig, add_solver, host_values
from toolkit.runtime.plan import Plan, RuntimeState

SEED_ENV = "TOOLKIT_DIFF_SEED"
FORWARD_NETS, TRAIN_NETS = 300, 150
SLOW_FORWARD_NETS, SLOW_TRAIN_NETS = 2000, 1000
FORWARD_BATCHES = (1, 3)
TRAIN_BATCH = 3              # BatchNorm's batch statistics need more than one value per channel
TRAIN_STEPS = 2              # the second step runs the same plan again, on the weights it wrote
TOL = {"float32": 1e-4, "float64": 1e-9}
EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}
OUTPUT_SCALE_FLOOR = 1e-3
# float32 arbitration: the optimised result may be this many times further from float64 than
# the reference's float32 result is (two evaluation orders rarely differ by more than 2x).
CONDITIONING_FACTOR = 4.0
MAX_REPORTED = 3             # failures described in full; the rest are counted


def run_seed() -> int:
    value = os.environ.get(SEED_ENV)
    if value:
        return int(value)
    return random.SystemRandom().randrange(2**32)


@pytest.fixture(scope="module")
def seed() -> int:
    value = run_seed()
    print(f"\n{SEED_ENV}={value}")
    return value


def net_seed(seed: int, mode: str, index: int) -> int:
    """Net ``index`` of a run: the same whatever number of nets the run draws."""
    return int(np.random.SeedSequence([seed, ["forward", "train"].index(mode), index]).generate_state(1)[0])


class Mismatch(AssertionError):
    """The optimised graph disagrees with the reference; the message says where."""


@dataclass
class Case:
    """One drawn net, with what a failure message needs to replay it."""

    seed: int
    mode: str
    index: int
    net_seed: int
    net: netgen.GeneratedNet

    def report(self, problem: str) -> str:
        return (f"{problem}\n  {SEED_ENV}={self.seed}, {self.mode} net #{self.index} "
                f"(netgen.generate({self.net_seed}), {self.net.dtype})\n"
                f"---- net ----\n{self.net.text}-------------")


def load(text: str, folder: Path) -> Net:
    path = folder / "net.yaml"
    path.write_text(text)
    return Net.load(str(path))


# -- data --------------------------------------------------------------------------------------
def perturbed_weights(net: Net, rng: np.random.Generator, dtype: str) -> dict[str, np.ndarray]:
    """The fillers' values moved by random amounts: weights by half their spread, constant
    arrays (biases, BatchNorm and Scale parameters, running means, constant fillers) by 0.2;
    running variances stay positive."""
    weights = {}
    for key, w in net.init_weights(0, dtype).items():
        if key.endswith(".running_var"):
            w = w * rng.uniform(0.5, 1.5, w.shape) + rng.uniform(0.1, 0.5, w.shape)
        else:
            # compared with ==, not by np.std, which need not be exactly 0 for a constant: a
            # weight whose rows stayed equal would tie class scores and make Accuracy (and max
            # pooling's choice) a coin toss between two evaluation orders
            constant = w.size <= 1 or bool(np.all(w == w.flat[0]))
            w = w + rng.normal(0.0, 0.2 if constant else 0.5 * float(np.std(w)), w.shape)
        weights[key] = np.array(w, dtype=dtype, order="C")       # keeps 0-d weights 0-d
    return weights


def slot_value(name: str, shape: tuple, rng: np.random.Generator, dtype: str) -> np.ndarray:
    """A solver slot as after some steps: running squares positive and not tiny (an adaptive
    step divides the gradient by their square root: over the bare eps, the rounding noise of a
    gradient that is 0 in exact arithmetic would become a full-size step), the others of
    either sign."""
    slot = name.rsplit("@", 1)[1]
    if slot in ("exp_avg_sq", "square_avg"):
        value = rng.uniform(1e-2, 1e-1, shape)
    elif slot == "sum":
        value = rng.uniform(5e-2, 5e-1, shape)
    else:
        value = rng.normal(0.0, 0.05, shape)
    return np.asarray(value, dtype=dtype)


def feed(graph, gen: netgen.GeneratedNet, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs for every graph input except the solver's host values ('@...')."""
    inputs = {}
    for name, v in graph.inputs.items():
        if name.startswith("@"):
            continue
        shape = v.type.concrete({"N": batch})
        if name in gen.labels:
            label = rng.integers(0, gen.labels[name], shape)
            flat = label.reshape(-1)
            if flat.size >= 2:
                flat[:2] = (0, 1)      # two classes, so no ignore_label ignores every position
            inputs[name] = label.astype(v.dtype)
        elif name in gen.unit_inputs:
            inputs[name] = rng.uniform(0.0, 1.0, shape).astype(v.dtype)
        else:
            inputs[name] = rng.standard_normal(shape).astype(v.dtype)
    return inputs


def as_float64(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in arrays.items()}


class Float32Draws:
    """A generator for the float64 re-run of a float32 train step: Dropout draws float32
    numbers whatever it is asked for, so its masks are those the float32 run drew."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def random(self, size=None, dtype=np.float64):
        return self.rng.random(size, dtype=np.float32).astype(dtype)


def random_solver(rng: np.random.Generator) -> tuple[SolverConfig, float]:
    kind = str(rng.choice(["sgd", "sgd", "nesterov", "adam", "adamw", "rmsprop", "adagrad"]))
    momentum = {"sgd": float(rng.choice([0.0, 0.9])), "nesterov": 0.9,
                "rmsprop": float(rng.choice([0.0, 0.5]))}.get(kind, 0.0)
    cfg = SolverConfig(
        type=kind, momentum=momentum,
        weight_decay=float(rng.choice([0.0, 5e-4, 0.01])),
        betas=(0.9, 0.999) if rng.random() < 0.7 else (0.8, 0.99),
        eps={"adagrad": 1e-10, "sgd": 1e-8, "nesterov": 1e-8}.get(kind, float(rng.choice([1e-8, 1e-6]))),
        alpha=float(rng.choice([0.99, 0.9])),
        clip_gradients=float(rng.choice([0.1, 1.0, 10.0])) if rng.random() < 0.3 else None)
    return cfg, float(rng.choice([0.01, 0.1]))


# -- comparison --------------------------------------------------------------------------------
@dataclass
class Quantity:
    """One array the optimised graph must reproduce, and how far it may be off, elementwise."""

    what: str                 # "output 'prob1'", "update of 'conv1.weight'"
    actual: np.ndarray
    expected: np.ndarray
    allowed: np.ndarray

    def bad(self) -> bool:
        return not np.all(np.abs(self.actual - self.expected) <= self.allowed)

    def describe(self) -> str:
        excess = np.abs(self.actual - self.expected) - self.allowed
        i = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.ndim else ()
        return (f"{self.what}: {int(np.sum(excess > 0))} of {excess.size} elements differ; worst at "
                f"{tuple(int(j) for j in i)}: optimised {self.actual[i]!r}, reference {self.expected[i]!r}, "
                f"allowed difference {self.allowed[i]:.3g}")


def output_tolerance(expected: np.ndarray, dtype: str) -> np.ndarray:
    """tol (|e| + scale): relative to the element and to the output's scale, max|e| but at least
    OUTPUT_SCALE_FLOOR. Below that an output is rounding noise, as a Euclidean loss between two
    blobs that are equal in exact arithmetic (x and Log of Exp of x)."""
    scale = max(float(np.abs(expected).max()) if expected.size else 0.0, OUTPUT_SCALE_FLOOR)
    return TOL[dtype] * (np.abs(expected) + scale)


def update_tolerance(expected: np.ndarray, old: np.ndarray, dtype: str, step_scale: float) -> np.ndarray:
    """For a new weight: tol times the size of the step (new - old) of the element, of this
    weight's largest and, as a floor, a tenth of the largest step of any weight (``step_scale``),
    plus a few ulps of the weight for the rounding of ``old - step`` on each side. Relative to
    the step, so that an error in a gradient shows however small the step; the floor is for
    gradients that are 0 in exact arithmetic (a bias just before BatchNorm's batch statistics),
    whose step is all rounding noise."""
    step = np.abs(expected - old)
    return (TOL[dtype] * (step + step.max() + 0.1 * step_scale)
            + 4 * EPS[dtype] * np.maximum(np.abs(expected), np.abs(old)))


def quantity(what: str, actual, expected, allowed_of: Callable[[np.ndarray], np.ndarray], where: str) -> Quantity:
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise Mismatch(f"{where}: {what} has shape {a.shape}, the reference {e.shape}")
    if not np.all(np.isfinite(e)):
        raise Mismatch(f"{where}: the reference {what} is not finite (a generator bug: nets must stay finite)")
    return Quantity(what, a, e, allowed_of(e))


def judge(quantities: dict, dtype: str, where: str, truth: Callable[[], dict]) -> None:
    """Raise Mismatch unless every quantity is within its tolerance, or (float32) the optimised
    result is about as close to ``truth()`` (the same computation in float64) as the reference's
    own float32 result: an ill-conditioned value is then as good on both sides."""
    bad = {key: q for key, q in quantities.items() if q.bad()}
    if not bad:
        return
    if dtype == "float32":
        exact = truth()
        still = {}
        for key, q in bad.items():
            t = np.asarray(exact[key], dtype=np.float64)
            reference_error = float(np.abs(q.expected - t).max())
            if not np.all(np.abs(q.actual - t) <= q.allowed + CONDITIONING_FACTOR * reference_error):
                still[key] = (q, reference_error, float(np.abs(q.actual - t).max()))
        if not still:
            return
        q, reference_error, error = next(iter(still.values()))
        raise Mismatch(f"{where}: {q.describe()}; against float64 the optimised result is off by "
                       f"{error:.3g}, the reference's by {reference_error:.3g}")
    raise Mismatch(f"{where}: {next(iter(bad.values())).describe()}")


# -- the two checks ----------------------------------------------------------------------------
def check_forward(case: Case, folder: Path) -> None:
    """Reference interpreter vs optimised plans, infer and test phases."""
    gen, dtype = case.net, case.net.dtype
    net = load(gen.text, folder)
    rng = np.random.default_rng(case.net_seed)
    weights = perturbed_weights(net, rng, dtype)
    for phase in ("infer", "test"):
        reference = net.graph(phase, dtype)
        if not reference.outputs:
            if phase == "infer":
                raise Mismatch("the infer phase has no output (a generator bug)")
            continue
        candidates = {"optimised": forward_graph(net, phase, dtype),
                      "optimised, weights frozen": forward_graph(net, phase, dtype, weights=weights)}
        for batch in FORWARD_BATCHES:
            inputs = feed(reference, gen, batch, rng)
            expected, _ = interpret(reference, inputs, weights)

            def truth(phase=phase, inputs=inputs):
                return interpret(net.graph(phase, "float64"), as_float64(inputs), as_float64(weights))[0]

            for label, graph in candidates.items():
                where = f"{phase} phase, {label}, batch {batch}"
                if set(graph.outputs) != set(expected):
                    raise Mismatch(f"{where}: outputs {sorted(graph.outputs)}, the reference has {sorted(expected)}")
                got = Plan(graph, {"N": batch}, {k: weights[k] for k in graph.weights}).run(inputs)
                judge({name: quantity(f"output '{name}'", got[name], e, lambda e: output_tolerance(e, dtype), where)
                       for name, e in expected.items()}, dtype, where, truth)


def check_train(case: Case, folder: Path) -> None:
    """Interpreted unoptimised train step vs the optimised one's plan, TRAIN_STEPS steps.

    Dropout: the interpreter draws each mask from its ``rng`` node by node in graph order, the
    plan from its RuntimeState's generator kernel by kernel in plan order, with the same calls;
    seeded alike they give the same masks, as long as the passes keep the masks' order, shapes
    and dtypes (they do today; a pass that legitimately reorders random draws would show up
    here, and ``netgen.generate_net(seed, train_dropout=False)`` then keeps Dropout out of train).
    """
    gen, dtype = case.net, case.net.dtype
    net = load(gen.text, folder)
    rng = np.random.default_rng(case.net_seed)
    cfg, lr = random_solver(rng)
    reference = net.graph("train", dtype)
    add_solver(reference, add_gradients(reference), cfg)
    optimised = train_step_graph(net, cfg, dtype)
    solver = f"{cfg} at lr {lr}"
    if set(optimised.updates) != set(reference.updates):
        raise Mismatch(f"train, {solver}: the optimised step updates {sorted(optimised.updates)}, "
                       f"the reference {sorted(reference.updates)}")

    params = perturbed_weights(net, rng, dtype)
    weights = {name: params[name] if name in params else slot_value(name, w.value.type.concrete({}), rng, dtype)
               for name, w in reference.weights.items()}
    arrays = {name: weights[name].copy() for name in optimised.weights}     # the plan updates these
    seed = int(rng.integers(2**31))
    plan = Plan(optimised, {"N": TRAIN_BATCH}, arrays, runtime=RuntimeState(np.random.default_rng(seed)))
    interpreter_rng = np.random.default_rng(seed)
    for step in range(1, TRAIN_STEPS + 1):
        where = f"train step {step}, {solver}"
        inputs = feed(reference, gen, TRAIN_BATCH, rng)
        inputs.update(host_values(cfg, lr, step, dtype))
        rng_before = copy.deepcopy(interpreter_rng)
        expected, updates = interpret(reference, inputs, weights, rng=interpreter_rng)
        got = plan.run(inputs)
        if set(got) != set(expected):
            raise Mismatch(f"{where}: outputs {sorted(got)}, the reference has {sorted(expected)}")

        def truth(inputs=inputs, weights=weights, rng_before=rng_before):
            graph = net.graph("train", "float64")
            add_solver(graph, add_gradients(graph), cfg)
            outputs, new = interpret(graph, as_float64(inputs), as_float64(weights), rng=Float32Draws(rng_before))
            return {**{("output", k): v for k, v in outputs.items()}, **{("update", k): v for k, v in new.items()}}

        step_scale = max((float(np.abs(new - weights[name]).max(initial=0.0)) for name, new in updates.items()),
                         default=0.0)
        quantities = {("output", name): quantity(f"output '{name}'", got[name], e,
                                                 lambda e: output_tolerance(e, dtype), where)
                      for name, e in expected.items()}
        for name, new in updates.items():
            old = weights[name].astype(np.float64)
            quantities["update", name] = quantity(f"update of '{name}'", arrays[name], new,
                                                  lambda e, old=old: update_tolerance(e, old, dtype, step_scale),
                                                  where)
        judge(quantities, dtype, where, truth)
        # both sides go on from the reference's weights, so that an error is reported once, at
        # the step where it happens
        weights = dict(weights, **updates)
        for name in arrays:
            np.copyto(arrays[name], weights[name])


def run_nets(seed: int, mode: str, count: int, folder: Path) -> None:
    check = check_forward if mode == "forward" else check_train
    failures = []
    for index in range(count):
        ns = net_seed(seed, mode, index)
        case = Case(seed, mode, index, ns, netgen.generate_net(ns))
        try:
            check(case, folder)
        except Exception as e:           # a crash in a pass or a kernel is a failure too
            kind = "" if isinstance(e, Mismatch) else f"{type(e).__name__}: "
            failures.append(case.report(f"{kind}{e}"))
    if failures:
        shown = "\n\n".join(failures[:MAX_REPORTED])
        more = f"\n\n... and {len(failures) - MAX_REPORTED} more" if len(failures) > MAX_REPORTED else ""
        pytest.fail(f"{len(failures)} of {count} {mode} nets disagree ({SEED_ENV}={seed}):\n\n{shown}{more}",
                    pytrace=False)


# -- tests -------------------------------------------------------------------------------------
def test_forward_matches_reference(seed, tmp_path):
    run_nets(seed, "forward", FORWARD_NETS, tmp_path)


def test_train_step_matches_reference(seed, tmp_path):
    run_nets(seed, "train", TRAIN_NETS, tmp_path)


def skip_unless_selected(request) -> None:
    """The slow variants run only when asked for with ``-m slow`` (the suite's configuration
    would otherwise run every marked test)."""
    if "slow" not in (request.config.option.markexpr or ""):
        pytest.skip("many nets: run with -m slow")


@pytest.mark.slow
def test_forward_matches_reference_many(seed, tmp_path, request):
    skip_unless_selected(request)
    run_nets(seed, "forward", SLOW_FORWARD_NETS, tmp_path)


@pytest.mark.slow
def test_train_step_matches_reference_many(seed, tmp_path, request):
    skip_unless_selected(request)
    run_nets(seed, "train", SLOW_TRAIN_NETS, tmp_path)


def test_generator_is_deterministic_and_valid(tmp_path):
    """The same seed gives the same text; the net loads (every phase is checked), has a loss in
    train and an output in infer."""
    for s in range(20):
        text = netgen.generate(s)
        assert text == netgen.generate(s)
        net = load(text, tmp_path)
        assert net.graph("train").losses, text
        assert net.graph("infer").outputs, text


def test_generator_covers_its_catalog():
    """Every layer type the generator knows (and layers/ registers) turns up within a few
    hundred nets."""
    expected = netgen.GENERATED_TYPES & netgen.catalog()
    seen = set().union(*(netgen.generate_net(s).layer_types for s in range(300)))
    assert expected <= seen, f"never generated: {sorted(expected - seen)}"

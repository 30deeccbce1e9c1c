"""Helpers for pass tests: tiny graphs built op by op, passes applied with a context that holds
each pass to its word (a pass that changes the graph must say so), and the check every pass
test makes, that the reference interpreter gives the same numbers on the graph before and after
the pass (and a compiled plan of the graph after it, too).

(Named ``pass_helpers`` so that it cannot clash with another test folder's helper module under
pytest's default ``prepend`` import mode.)
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from toolkit.ir.dims import Sym
from toolkit.ir.graph import Graph, TensorType, Value, Weight
from toolkit.ops import Builder
from toolkit.ops.control import bodies_of
from toolkit.ops.interpreter import interpret
from toolkit.ops.verify import verify
from toolkit.passes.context import PassContext
from toolkit.runtime.plan import Plan

Pass = Callable[[Graph, PassContext], bool]

N = Sym.named("N")


class Tiny:
    """A graph under construction: ``t.input``, ``t.weight``, ``t.b`` (a Builder), ``t.out``."""

    def __init__(self, phase: str = "infer"):
        self.g = Graph(phase)
        self.b = Builder(self.g, "t")

    def input(self, name: str, shape, dtype: str = "float64") -> Value:
        v = Value(TensorType(tuple(shape), dtype), name=name)
        self.g.inputs[name] = v
        return v

    def weight(self, name: str, shape, dtype: str = "float64", trainable: bool = True) -> Value:
        v = Value(TensorType(tuple(shape), dtype), name=name)
        self.g.weights[name] = Weight(name, v, trainable, {"type": "constant", "value": 0.0})
        return v

    def const(self, value, dtype: str = "float64") -> Value:
        return self.b.op("constant", value=np.asarray(value, dtype=dtype))

    def out(self, name: str, v: Value) -> None:
        self.g.outputs[name] = v


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


def random_feeds(graph: Graph, rng: np.random.Generator, batch: int = 3, special: bool = False) -> dict:
    """Arrays for every input (and weight) of ``graph``; ``special`` mixes in 0, -0, inf, -inf and
    nan so that a rewrite that is wrong on them shows."""
    feeds = {}
    for name, v in list(graph.inputs.items()) + [(k, w.value) for k, w in graph.weights.items()]:
        shape = v.type.concrete({"N": batch})
        if v.dtype.startswith("float"):
            a = rng.uniform(-2, 2, shape).astype(v.dtype)
            if special and a.size:
                flat = a.reshape(-1)
                picks = rng.choice(flat.size, min(5, flat.size), replace=False)
                flat[picks] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=v.dtype)[:len(picks)]
        elif v.dtype == "bool":
            a = rng.integers(0, 2, shape).astype(bool)
        else:
            a = rng.integers(-3, 4, shape).astype(v.dtype)
        feeds[name] = a
    return feeds


def split_feeds(graph: Graph, feeds: dict) -> tuple[dict, dict]:
    return ({k: feeds[k] for k in graph.inputs if k in feeds}, {k: feeds[k] for k in graph.weights if k in feeds})


def assert_same_numbers(before: Graph, after: Graph, feeds: dict, rtol: float = 1e-12, plan: bool = True,
                        batch: int = 3) -> None:
    """Interpreter(before) == interpreter(after) == Plan(after) on ``feeds`` (nan where nan)."""
    with np.errstate(all="ignore"):             # inf and nan inputs are on purpose
        _compare(before, after, feeds, rtol, plan, batch)


def _compare(before: Graph, after: Graph, feeds: dict, rtol: float, plan: bool, batch: int) -> None:
    ins, ws = split_feeds(before, feeds)
    expected, expected_updates = interpret(before, ins, ws)
    ins2, ws2 = split_feeds(after, feeds)
    got, got_updates = interpret(after, ins2, ws2)
    results = [("interpreter", got, got_updates)]
    if plan:
        weights = {k: np.array(v) for k, v in ws2.items()}
        bindings = {"N": batch} if any(not isinstance(d, int) for v in after.inputs.values() for d in v.shape) else {}
        outs = Plan(after, bindings, weights).run(ins2)
        results.append(("plan", {k: np.array(v) for k, v in outs.items()}, {k: weights[k] for k in after.updates}))
    for who, outs, updates in results:
        assert set(outs) == set(expected)
        for name in expected:
            np.testing.assert_allclose(outs[name], expected[name], rtol=rtol, atol=rtol,
                                       err_msg=f"{who}: output {name}", equal_nan=True)
        for name in expected_updates:
            np.testing.assert_allclose(updates[name], expected_updates[name], rtol=rtol, atol=rtol,
                                       err_msg=f"{who}: update {name}", equal_nan=True)


def structure(graph: Graph) -> tuple:
    """What a pass can change, short of values inside attributes: the nodes (which, in what
    order, reading and making what), their attribute dicts, bodies' sizes, outputs, updates."""
    return (tuple((id(n), n.op, tuple(v.id for v in n.inputs), tuple(o.id for o in n.outputs), id(n.attrs),
                   len(n.attrs), tuple(len(b.graph.nodes) for b in bodies_of(n))) for n in graph.nodes),
            tuple(v.id for v in graph.outputs.values()), tuple(v.id for v in graph.updates.values()),
            tuple(graph.weights), tuple(graph.inputs))


def apply(graph: Graph, *passes: Pass, ctx: PassContext | None = None) -> Graph:
    """``graph`` after ``passes``, in order, with one context (``ctx`` gathers their notes).
    Each pass must say it changed the graph when its structure changed."""
    ctx = ctx if ctx is not None else PassContext()
    for run in passes:
        before = structure(graph)
        said = run(graph, ctx)
        assert isinstance(said, bool), f"{run.__name__} returned {said!r}, not whether it changed the graph"
        if structure(graph) != before:
            assert said, f"{run.__name__} changed the graph but said it did not"
    return graph


def check_pass(make: Callable[[], Graph], run: Pass | Sequence[Pass], rng: np.random.Generator,
               special: bool = False, rtol: float = 1e-12, plan: bool = True,
               ctx: PassContext | None = None) -> Graph:
    """Build the graph twice, run the pass (or passes, in order) on one copy, verify it, compare
    numbers; returns the graph after the pass for structural assertions (``ctx``: its notes)."""
    before = make()
    after = apply(make(), *(run if isinstance(run, (list, tuple)) else [run]), ctx=ctx)
    verify(after)
    feeds = random_feeds(before, rng, special=special)
    assert_same_numbers(before, after, feeds, rtol=rtol, plan=plan)
    return after

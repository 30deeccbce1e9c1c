"""The memory planner: figures (naive, lower bound, planned), arena placement that never overlaps
two storages alive at once (random schedules), reuse switched off, contiguous slices as views,
and the figures a compile report gives equal to a built plan's."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.passes.pipeline import memory_reuse
from toolkit.runtime.memory import ALIGN, Storage, _place
from toolkit.runtime.plan import Plan, memory_figures


def add_input(graph, name, shape, dtype="float64"):
    v = Value(TensorType(tuple(shape), dtype), name=name)
    graph.inputs[name] = v
    return v


def matmul_chain(n: int):
    """x -> 8 products with a constant matrix: no kernel runs in place, each result dies at the next."""
    g = Graph("infer")
    x = add_input(g, "x", (16, 16))
    b = Builder(g, "chain")
    w = b.op("constant", value=np.eye(16) * 0.5)
    h = x
    for _ in range(n):
        h = b.op("matmul", h, w, trans_a=False, trans_b=False)
    g.outputs["y"] = h
    return g


def test_figures_of_a_chain():
    one = 16 * 16 * 8
    plan = Plan(matmul_chain(8), {}, {})
    figures = plan.memory.summary()
    assert figures["naive_bytes"] == 9 * one               # the input and eight results
    assert figures["lower_bound_bytes"] == 2 * one         # a product reads one and writes another
    assert figures["peak_bytes"] == 2 * one
    assert memory_figures(matmul_chain(8), {}) == figures


def test_no_reuse_when_planning_is_off():
    plan = Plan(matmul_chain(8), {}, {}, reuse_memory=memory_reuse({"plan_memory"}))
    assert plan.memory.peak_bytes == plan.memory.naive_bytes == 9 * 16 * 16 * 8
    assert memory_figures(matmul_chain(8), {}, reuse_memory=False) == plan.memory.summary()
    x = np.random.default_rng(0).normal(size=(16, 16))
    np.testing.assert_allclose(plan.run({"x": x})["y"], x * 0.5 ** 8)


@pytest.mark.parametrize("seed", range(20))
def test_placement_never_overlaps_storages_alive_together(seed):
    rng = np.random.default_rng(seed)
    storages = []
    for _ in range(40):
        first = int(rng.integers(-1, 30))
        storages.append(Storage(int(rng.integers(1, 5000)), first=first, last=first + int(rng.integers(0, 10))))
    peak = _place(storages)
    for i, a in enumerate(storages):
        assert a.offset % ALIGN == 0 and a.offset + a.nbytes <= peak
        for b in storages[i + 1:]:
            if a.first <= b.last and b.first <= a.last:
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset
    # never worse than giving everything its own memory, never better than the most live at once
    steps = range(-1, 40)
    most = max(sum(s.nbytes for s in storages if s.first <= t <= s.last) for t in steps)
    assert most <= peak <= sum(-(-s.nbytes // ALIGN) * ALIGN for s in storages)


def slices_of(shape, axis):
    g = Graph("infer")
    x = add_input(g, "x", shape)
    b = Builder(g, "t")
    y = b.op("exp", x)
    size = shape[axis]
    g.outputs["a"] = b.op("slice", y, axis=axis, start=0, stop=size // 2)
    g.outputs["b"] = b.op("slice", y, axis=axis, start=size // 2, stop=size)
    return g


@pytest.mark.parametrize("shape,axis,views", [((4, 6), 0, 2), ((1, 6), 1, 2), ((4, 6), 1, 0)])
def test_contiguous_slices_are_views(shape, axis, views):
    """Rows of a matrix, or the columns of a one-row matrix, are one contiguous run: no copy."""
    plan = Plan(slices_of(shape, axis), {}, {})
    assert len(plan.memory.views) == views
    assert [n.op for n in plan.steps].count("slice") == 2 - views
    x = np.random.default_rng(1).normal(size=shape)
    out = plan.run({"x": x})
    half = shape[axis] // 2
    np.testing.assert_array_equal(out["a"], np.exp(x).take(range(half), axis=axis))
    np.testing.assert_array_equal(out["b"], np.exp(x).take(range(half, shape[axis]), axis=axis))

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


# -- concatenations gathered in place ----------------------------------------------------------

def concat_net(shape, build):
    """x [shape] -> ``build(builder, x)`` -> (the concatenation's inputs, extra graph outputs);
    y = their concatenation along axis 1."""
    g = Graph("infer")
    x = add_input(g, "x", shape)
    b = Builder(g, "t")
    parts, extra = build(b, x)
    g.outputs["y"] = b.op("concat", *parts, axis=1)
    g.outputs.update(extra)
    return g


def concat_steps(plan) -> int:
    return [n.op for n in plan.steps].count("concat")


CONCAT_CASES = {
    # producers that own their memory, batch 1: gathered
    "two kernels": (True, lambda b, x: ([b.op("exp", x), b.op("tanh", x)], {})),
    # relu may run in place on its input: it must still write into the concatenation
    "in-place producer": (True, lambda b, x: ([b.op("relu", b.op("exp", x)), b.op("sigmoid", x)], {})),
    # a part read again after the concatenation lives on in its slice
    "part read later": (True,
                        lambda b, x: (lambda e: ([e, b.op("tanh", x)], {"z": b.op("exp", e)}))(b.op("square", x))),
    # the graph input has no producer to redirect
    "graph input": (False, lambda b, x: ([x, b.op("exp", x)], {})),
    # one value cannot sit at two offsets
    "same value twice": (False, lambda b, x: (lambda e: ([e, e], {}))(b.op("exp", x))),
    # a graph output keeps its own buffer
    "part is an output": (False, lambda b, x: (lambda e: ([e, b.op("tanh", x)], {"e": e}))(b.op("exp", x))),
    # a reshape is a view of its source: it cannot move
    "view part": (False, lambda b, x: ([b.op("reshape", b.op("exp", x), shape=(1, 3, 4)), b.op("tanh", x)], {})),
}


@pytest.mark.parametrize("case", list(CONCAT_CASES))
def test_a_batch_1_concatenation_is_gathered_when_its_parts_can_move(case):
    gathered, build = CONCAT_CASES[case]
    g = concat_net((1, 3, 4), build)
    plan = Plan(g, {}, {})
    assert concat_steps(plan) == (0 if gathered else 1)
    x = np.random.default_rng(2).normal(size=(1, 3, 4))
    reference = Plan(concat_net((1, 3, 4), build), {}, {}, reuse_memory=False)   # no gathering
    assert concat_steps(reference) == 1
    want = reference.run({"x": x})
    got = plan.run({"x": x})
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_concatenation_at_batch_2_is_a_copy():
    """Each image's parts are strided in the output: the producers cannot write them in one run."""
    build = CONCAT_CASES["two kernels"][1]
    plan = Plan(concat_net((2, 3, 4), build), {}, {})
    assert concat_steps(plan) == 1
    x = np.random.default_rng(3).normal(size=(2, 3, 4))
    np.testing.assert_array_equal(plan.run({"x": x})["y"], np.concatenate([np.exp(x), np.tanh(x)], axis=1))


def test_nested_concatenations_gather_the_inner_one():
    """The outer concatenation's part is the inner one, which is itself gathered: the outer copies."""
    g = Graph("infer")
    x = add_input(g, "x", (1, 2, 5))
    b = Builder(g, "t")
    inner = b.op("concat", b.op("exp", x), b.op("tanh", x), axis=1)
    g.outputs["y"] = b.op("concat", inner, b.op("square", x), axis=1)
    plan = Plan(g, {}, {})
    assert concat_steps(plan) == 1
    xv = np.random.default_rng(4).normal(size=(1, 2, 5))
    np.testing.assert_array_equal(plan.run({"x": xv})["y"], np.concatenate([np.exp(xv), np.tanh(xv), np.square(xv)], 1))


def test_gathered_parts_never_share_memory_with_values_alive_beside_them():
    """Fire modules in a chain (squeeze, two expands, concatenation, at batch 1) with every
    concatenation gathered: the arena's placement keeps each gathered storage apart from the
    values alive during its whole span, so the result is the unplanned plan's."""
    g = Graph("infer")
    x = add_input(g, "x", (1, 4, 3))
    b = Builder(g, "t")
    h = x
    for i in range(4):
        squeeze = b.op("tanh", b.op("mul", h, b.op("constant", value=np.array(0.5 + i))))
        h = b.op("concat", b.op("exp", squeeze), b.op("relu", b.op("square", squeeze)), axis=1)
        h = b.op("slice", h, axis=1, start=0, stop=4)        # back to 4 channels
    g.outputs["y"] = h
    plan = Plan(g, {}, {})
    assert concat_steps(plan) == 0
    unplanned = Plan(g, {}, {}, reuse_memory=False)
    xv = np.random.default_rng(5).normal(size=(1, 4, 3))
    np.testing.assert_array_equal(plan.run({"x": xv})["y"], unplanned.run({"x": xv})["y"])


def test_a_concatenation_along_the_batch_axis_is_gathered_at_any_batch():
    """Along axis 0 every part is one contiguous run of the output, whatever the batch."""
    g = Graph("infer")
    x = add_input(g, "x", (3, 4))
    b = Builder(g, "t")
    g.outputs["y"] = b.op("concat", b.op("exp", x), b.op("tanh", x), axis=0)
    plan = Plan(g, {}, {})
    assert concat_steps(plan) == 0 and not plan.memory.image_stride_of
    xv = np.random.default_rng(6).normal(size=(3, 4))
    np.testing.assert_array_equal(plan.run({"x": xv})["y"], np.concatenate([np.exp(xv), np.tanh(xv)], 0))

"""A plan's build (runtime/build.py) and the memory plan made from it (runtime/layout.py): the
nodes evaluated once when the plan is built, and ``memory_figures``, which makes the same build
and memory plan without kernels or arenas, giving a built plan's own figures."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from toolkit.backend.placement import Placement
from toolkit.backend.registry import KERNELS, KernelEntry
from toolkit.compile import forward_graph, train_step_graph
from toolkit.frontend import Net
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.runtime.build import build_plan
from toolkit.runtime.execution import choose_execution
from toolkit.runtime.plan import Plan, memory_figures

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def add_input(graph, name, shape, dtype):
    v = Value(TensorType(tuple(shape), dtype), name=name)
    graph.inputs[name] = v
    return v


def test_constant_folding_of_scalar_nodes():
    g = Graph("infer")
    x = add_input(g, "x", (2, 3), "float64")
    b = Builder(g, "t")
    six = b.mul(b.scalar(2.0, "float64"), b.scalar(3.0, "float64"))
    shift = b.op("exp", b.scalar(0.0, "float64"))                  # = 1, also foldable
    y = b.add(b.mul(x, six), shift)
    g.outputs["y"] = y
    plan = Plan(g, {}, {})
    assert [n.op for n in plan.steps] == ["mul", "add"]
    assert len(plan.calls) == 2
    assert all(n.inputs[0] is x or n.inputs[0].producer.op == "mul" for n in plan.steps)
    xv = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(plan.run({"x": xv})["y"], xv * 6 + 1)
    # an output that is entirely constant needs no call at all
    g2 = Graph("infer")
    g2.outputs["c"] = Builder(g2).mul(Builder(g2).scalar(2.0, "float32"), Builder(g2).scalar(4.0, "float32"))
    plan2 = Plan(g2, {}, {})
    assert plan2.calls == []
    out = plan2.run({})["c"]
    assert out.dtype == np.float32 and float(out) == 8.0


def test_random_ops_are_not_folded():
    """dropout_mask of a constant is impure: it runs every time and gives fresh masks."""
    g = Graph("train")
    b = Builder(g, "t")
    c = b.op("broadcast_to", b.scalar(1.0, "float64"), shape=(1000,))
    g.outputs["m"] = b.op("dropout_mask", c, ratio=0.5)
    plan = Plan(g, {}, {})
    assert [n.op for n in plan.steps] == ["dropout_mask"]
    first = np.array(plan.run({})["m"])
    second = np.array(plan.run({})["m"])
    assert not np.array_equal(first, second)
    assert set(np.unique(first)) == {0.0, 2.0}


def _exp_of_a_constant():
    """y = x * exp(c) with c a [4, 5] constant: exp(c) is computed when the plan is built."""
    g = Graph("infer")
    x = add_input(g, "x", (4, 5), "float64")
    b = Builder(g, "t")
    folded = b.op("exp", b.op("constant", value=np.full((4, 5), 2.0)))
    g.outputs["y"] = b.mul(x, folded)
    return g, folded


def test_the_build_evaluates_constants_only_for_a_plan(monkeypatch):
    """With an execution, the build runs the host's exp kernel once and keeps its result; for the
    figures alone (no execution) it runs no kernel and holds a placeholder of no bytes, and the
    step left to run (the product) is the same."""
    g, folded = _exp_of_a_constant()
    placement = Placement.of(g, "cpu")
    figures_only = build_plan(g, {}, None, placement)
    assert [n.op for n in figures_only.steps] == ["mul"]
    assert figures_only.fixed[folded.id].external.size == 0
    entry = KERNELS.lookup("exp", placement.default, "float64")
    ran = []

    def counting(ctx):
        fn = entry.factory(ctx)

        def call(ins, outs):
            ran.append(ins[0].shape)
            fn(ins, outs)
        return call
    monkeypatch.setitem(KERNELS.entries, ("exp", "cpu", "*"), KernelEntry(counting, entry.inplace))
    build_plan(g, {}, None, placement)
    assert ran == []
    execution = choose_execution(placement.devices(g), {}, 1, False, None, True, None)
    built = build_plan(g, {}, {}, placement, execution)
    assert ran == [(4, 5)]
    assert [n.op for n in built.steps] == ["mul"]
    np.testing.assert_allclose(built.fixed[folded.id].external, np.exp(np.full((4, 5), 2.0)))


def _zoo_graph(name: str, train: bool):
    net = Net.load(str(ZOO / name / "net.yaml"))
    return train_step_graph(net) if train else forward_graph(net, "infer")


@pytest.mark.parametrize("name, train, batch", [("lenet", True, 4), ("branchnet", False, 1),
                                                ("branchnet", False, 2), ("resnet", False, 2)])
def test_memory_figures_are_the_built_plans_own(name, train, batch):
    """The figures `toolkit compile` prints without building a plan are those of the plan built
    for the same graph and sizes, with and without buffer reuse (and a concatenation gathered
    in place, branchnet's at batch 1, counted by both)."""
    graph = _zoo_graph(name, train)
    bindings = {"N": batch}
    weights = {k: np.zeros(w.value.type.concrete(bindings), w.value.dtype) for k, w in graph.weights.items()}
    peaks = {}
    for reuse in (True, False):
        plan = Plan(graph, bindings, weights, threads=1, native=False, reuse_memory=reuse)
        figures = memory_figures(graph, bindings, reuse_memory=reuse)
        assert figures == plan.memory.summary()
        peaks[reuse] = plan.peak_bytes
        assert figures["peak_bytes"] == plan.peak_bytes > 0
    assert peaks[True] < peaks[False]
    if (name, batch) == ("branchnet", 1):      # its concatenation gathered in place, in both
        assert figures["gathered_concats"] == 0 and memory_figures(graph, bindings)["gathered_concats"] == 1

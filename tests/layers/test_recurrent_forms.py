"""The two forms of the recurrent layers agree: one loop node (unroll: false) and the steps
written out (unroll: true) give the same outputs and gradients; the loop form runs a symbolic
T at several lengths from one graph, planning its bodies once."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.compile import add_gradients
from toolkit.frontend import OBJECTIVE, Net
from toolkit.ops.autodiff import differentiate
from toolkit.runtime.plan import Plan, RuntimeState

NET = """
name: forms
inputs:
  x: {shape: [N, STEPS, 3]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: rec, type: KIND, bottom: x, top: [seq, hn], num_output: 4, num_layers: 2, bidirectional: true,
     unroll: UNROLL}
  - {name: last, type: Permute, bottom: hn, top: hp, order: [1, 0, 2]}
  - {name: f1, type: Flatten, bottom: hp, top: f1}
  - {name: tmaj, type: Permute, bottom: seq, top: st, order: [0, 2, 1]}
  - {name: pool, type: Reduction, bottom: st, top: f2, operation: sum, axis: 2}
  - {name: cat, type: Concat, bottom: [f1, f2], top: cat}
  - {name: head, type: InnerProduct, bottom: cat, top: head, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [head, label], top: loss, phase: train}
"""


def net_of(tmp_path, kind: str, unroll: bool, steps="T") -> Net:
    path = tmp_path / f"{kind}_{unroll}_{steps}.yaml"
    path.write_text(NET.replace("KIND", kind).replace("UNROLL", str(unroll).lower()).replace("STEPS", str(steps)))
    return Net.load(str(path))


def train_graph(net: Net):
    graph = net.graph("train", "float64")
    for key, g in add_gradients(graph).items():
        graph.outputs[f"grad:{key}"] = g
    graph.outputs["grad:x"] = differentiate(graph, graph.outputs[OBJECTIVE], [graph.inputs["x"]])[graph.inputs["x"].id]
    return graph


def data(steps: int, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(3, steps, 3)), "label": rng.integers(0, 3, 3)}


@pytest.mark.parametrize("kind", ["GRU", "LSTM", "RNN"])
def test_the_loop_and_the_unrolled_steps_agree(tmp_path, kind):
    looped, unrolled = net_of(tmp_path, kind, False, 5), net_of(tmp_path, kind, True, 5)
    ops = {n.op for n in looped.graph("infer").nodes}
    assert "loop" in ops and "loop" not in {n.op for n in unrolled.graph("infer").nodes}
    weights = looped.init_weights(seed=4, dtype="float64")
    a = Plan(train_graph(looped), {"N": 3}, weights).run(data(5))
    b = Plan(train_graph(unrolled), {"N": 3}, weights).run(data(5))
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-10, atol=1e-13, err_msg=name)


def test_a_symbolic_length_runs_at_several_lengths_with_bodies_planned_once(tmp_path):
    looped = net_of(tmp_path, "GRU", False)          # T symbolic: the loop form
    graph = train_graph(looped)
    weights = looped.init_weights(seed=5, dtype="float64")
    runtime = RuntimeState(np.random.default_rng(0))
    for steps in (2, 3, 7):
        got = Plan(graph, {"N": 3, "T": steps}, weights, runtime=runtime).run(data(steps, seed=steps))
        fixed = Plan(train_graph(net_of(tmp_path, "GRU", True, steps)), {"N": 3}, weights).run(data(steps, seed=steps))
        for name in fixed:
            np.testing.assert_allclose(got[name], fixed[name], rtol=1e-10, atol=1e-13, err_msg=f"T={steps}: {name}")
    loops = sum(1 for n in graph.nodes if n.op == "loop")
    assert loops >= 8                               # 2 layers x 2 directions, forward and backward
    assert len(runtime.body_plans) == loops, "a body was planned again for a new length"


def test_unroll_true_needs_a_fixed_length(tmp_path):
    from toolkit.errors import SpecError
    with pytest.raises(SpecError, match="unroll: true needs a fixed sequence length, but T is T"):
        net_of(tmp_path, "GRU", True)

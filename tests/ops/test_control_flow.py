"""The loop and if ops: shape rules (the carried-type fixpoint), reference semantics against plain
numpy, gradients against central finite differences, plans (with and without the passes) against
the interpreter, dead-branch elimination, and the errors."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.ir.dims import Sym
from toolkit.ir.graph import Graph, TensorType, Value, Weight
from toolkit.ops.autodiff import AutodiffError, differentiate
from toolkit.ops.base import Builder, ShapeError
from toolkit.ops.control import if_, loop
from toolkit.ops.interpreter import interpret
from toolkit.ops.verify import VerifyError, verify
from toolkit.passes.context import PassContext
from toolkit.passes.pipeline import run_pipeline
from toolkit.runtime.plan import Plan

N = Sym.named("N")
F64 = "float64"


def new_graph(inputs: dict, weights: dict = (), phase="train"):
    g = Graph(phase)
    vals = {}
    for name, shape in inputs.items():
        dtype = "bool" if shape == "bool" else F64
        vals[name] = Value(TensorType(() if shape == "bool" else shape, dtype), name=name)
        g.inputs[name] = vals[name]
    for name, shape in dict(weights).items():
        vals[name] = Value(TensorType(shape, F64), name=name)
        g.weights[name] = Weight(name, vals[name], True, {})
    return g, Builder(g, "cf"), vals


def total(b: Builder, *values) -> Value:
    """sum over i of (i + 1) * sum(v_i * tanh(v_i)): a scalar whose gradient differs per element."""
    parts = [b.scale(b.reduce_sum(b.mul(v, b.op("tanh", v)), tuple(range(v.rank))), i + 1.0)
             for i, v in enumerate(values)]
    return b.add_all(parts)


def plain_total(*arrays) -> float:
    return sum((i + 1) * (a * np.tanh(a)).sum() for i, a in enumerate(arrays))


def with_gradients(g: Graph, objective: Value, wrt: list[Value]) -> Graph:
    g.outputs["objective"] = objective
    grads = differentiate(g, objective, wrt)
    for v in wrt:
        if grads[v.id] is not None:
            g.outputs[f"d_{v.name}"] = grads[v.id]
    verify(g)
    return g


def finite_difference(g: Graph, inputs: dict, weights: dict, name: str, eps=1e-6) -> np.ndarray:
    source = inputs if name in inputs else weights
    base = source[name]
    fd = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        vals = []
        for sign in (1, -1):
            moved = base.copy()
            moved[i] += sign * eps
            ins = dict(inputs, **({name: moved} if name in inputs else {}))
            ws = dict(weights, **({name: moved} if name in weights else {}))
            vals.append(interpret(g, ins, ws)[0]["objective"])
        fd[i] = (vals[0] - vals[1]) / (2 * eps)
    return fd


def check_everything(g: Graph, inputs: dict, weights: dict, bindings: dict):
    """Gradients against finite differences; a plan, and a plan after the passes, against the
    interpreter. Returns the interpreter's outputs."""
    expected, _ = interpret(g, inputs, weights)
    for name in list(inputs) + list(weights):
        if f"d_{name}" in expected:
            np.testing.assert_allclose(expected[f"d_{name}"], finite_difference(g, inputs, weights, name),
                                       rtol=1e-6, atol=1e-7, err_msg=f"d objective / d {name}")
    planned = Plan(g, bindings, weights).run(inputs)
    for k in expected:
        np.testing.assert_allclose(planned[k], expected[k], rtol=1e-12, atol=1e-12, err_msg=f"plan: {k}")
    optimized = run_pipeline(g, PassContext(check=True))
    planned = Plan(optimized, bindings, weights).run(inputs)
    for k in expected:
        np.testing.assert_allclose(planned[k], expected[k], rtol=1e-10, atol=1e-12, err_msg=f"optimized plan: {k}")
    return expected


def rnn_step(W, U):
    def step(bb, carries, xs):
        h, = carries
        a = bb.add(bb.op("matmul", xs[0], W, trans_a=False, trans_b=True),
                   bb.op("matmul", h, U, trans_a=False, trans_b=True))
        h_new = bb.op("tanh", a)
        return [h_new], [bb.op("square", h_new)]
    return step


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_loop_is_an_rnn_with_exact_gradients(reverse):
    g, b, v = new_graph({"x": (4, N, 3), "h0": (N, 2)}, {"W": (2, 3), "U": (2, 2)})
    h_last, per_step = loop(b, [v["h0"]], [v["x"]], rnn_step(v["W"], v["U"]), reverse=reverse)
    g = with_gradients(g, total(b, h_last, per_step), [v["x"], v["h0"], v["W"], v["U"]])
    rng = np.random.default_rng(3)
    inputs = {"x": rng.normal(size=(4, 2, 3)), "h0": rng.normal(size=(2, 2))}
    weights = {"W": rng.normal(size=(2, 3)) * 0.7, "U": rng.normal(size=(2, 2)) * 0.7}
    out = check_everything(g, inputs, weights, {"N": 2})
    # the recurrence written out in numpy
    h, steps = inputs["h0"], [None] * 4
    for t in (range(3, -1, -1) if reverse else range(4)):
        h = np.tanh(inputs["x"][t] @ weights["W"].T + h @ weights["U"].T)
        steps[t] = h ** 2
    np.testing.assert_allclose(out["objective"], plain_total(h, np.stack(steps)), rtol=1e-12)


def _state(node):
    """A loop node's attrs and outputs, and its body graph's outputs and nodes: each container
    and what it holds."""
    body = node.attrs["body"].graph
    return [(c, list(c.items()) if isinstance(c, dict) else list(c))
            for c in (node.attrs, node.outputs, body.outputs, body.nodes)]


def _assert_unchanged(node, state):
    for (container, items), (now, now_items) in zip(state, _state(node)):
        assert now is container and len(now_items) == len(items)
        for a, b in zip(items, now_items):
            assert (a[0] == b[0] and a[1] is b[1]) if isinstance(container, dict) else a is b


def test_differentiating_a_loop_leaves_its_forward_node_as_it_was():
    """The gradient reads the carries each step started from: autodiff puts a copy of the forward
    loop that also stacks them in the node's place and leaves the node itself as it was; a second
    differentiation of the graph reuses them."""
    g, b, v = new_graph({"x": (4, N, 3), "h0": (N, 2)}, {"W": (2, 3), "U": (2, 2)})
    h_last, per_step = loop(b, [v["h0"]], [v["x"]], rnn_step(v["W"], v["U"]))
    node = h_last.producer
    state = _state(node)
    g = with_gradients(g, total(b, h_last, per_step), [v["x"], v["h0"], v["W"], v["U"]])
    _assert_unchanged(node, state)
    assert "saved" not in node.attrs and all(n is not node for n in g.nodes)
    (forward,) = [n for n in g.nodes if n.op == "loop" and n.attrs.get("saved")]
    assert forward.attrs["saved"] == 1 and forward.inputs == node.inputs
    assert forward.outputs[:2] == node.outputs and len(forward.outputs) == 3
    assert all(o.producer is forward for o in forward.outputs)

    g.outputs["saved"] = forward.outputs[2]
    nodes = list(g.nodes)
    again = differentiate(g, g.outputs["objective"], [v["W"], v["h0"]])
    g.outputs.update(again_W=again[v["W"].id], again_h0=again[v["h0"].id])
    verify(g)
    assert g.nodes[:len(nodes)] == nodes and len(forward.outputs) == 3     # nothing replaced, nothing added

    rng = np.random.default_rng(3)
    inputs = {"x": rng.normal(size=(4, 2, 3)), "h0": rng.normal(size=(2, 2))}
    weights = {"W": rng.normal(size=(2, 3)) * 0.7, "U": rng.normal(size=(2, 2)) * 0.7}
    out = check_everything(g, inputs, weights, {"N": 2})
    np.testing.assert_array_equal(out["again_W"], out["d_W"])
    np.testing.assert_array_equal(out["again_h0"], out["d_h0"])
    h, starts = inputs["h0"], []
    for t in range(4):
        starts.append(h)
        h = np.tanh(inputs["x"][t] @ weights["W"].T + h @ weights["U"].T)
    np.testing.assert_allclose(out["saved"], np.stack(starts), rtol=1e-12, atol=1e-15)
    _assert_unchanged(node, state)            # the passes that ran on the graph did not reach it either


def test_nested_loops_differentiate_and_keep_their_forward_nodes():
    """An outer scan whose step runs an inner two-step loop: the inner loop is differentiated
    inside the outer gradient's body, on a copy; neither forward node changes."""
    g, b, v = new_graph({"x": (3, N, 3), "h0": (N, 2)}, {"W": (2, 3), "U": (2, 2)})

    def outer_step(bb, carries, xs):
        def inner_step(ib, inner_carries, _):
            a = ib.add(ib.op("matmul", xs[0], v["W"], trans_a=False, trans_b=True),
                       ib.op("matmul", inner_carries[0], v["U"], trans_a=False, trans_b=True))
            return [ib.op("tanh", a)], []
        (h,) = loop(bb, carries, [], inner_step, trips=2)
        return [h], [bb.op("square", h)]
    h_last, per_step = loop(b, [v["h0"]], [v["x"]], outer_step)
    outer = h_last.producer
    (inner,) = [n for n in outer.attrs["body"].graph.nodes if n.op == "loop"]
    states = [_state(outer), _state(inner)]
    g = with_gradients(g, total(b, h_last, per_step), [v["x"], v["h0"], v["W"], v["U"]])
    _assert_unchanged(outer, states[0])
    _assert_unchanged(inner, states[1])
    assert "saved" not in inner.attrs and "saved" not in outer.attrs

    rng = np.random.default_rng(8)
    inputs = {"x": rng.normal(size=(3, 2, 3)), "h0": rng.normal(size=(2, 2))}
    weights = {"W": rng.normal(size=(2, 3)) * 0.7, "U": rng.normal(size=(2, 2)) * 0.7}
    out = check_everything(g, inputs, weights, {"N": 2})
    h, steps = inputs["h0"], []
    for t in range(3):
        for _ in range(2):
            h = np.tanh(inputs["x"][t] @ weights["W"].T + h @ weights["U"].T)
        steps.append(h ** 2)
    np.testing.assert_allclose(out["objective"], plain_total(h, np.stack(steps)), rtol=1e-12)


def test_trip_count_loop_and_a_carried_shape_that_settles_by_broadcasting():
    """x <- tanh(x @ A + c) three times from a [1, 2] start that the step widens to [N, 2]: the
    carried type is the fixpoint [N, 2], and the start's gradient is summed back to [1, 2]."""
    g, b, v = new_graph({"x0": (1, 2), "c": (N, 2)}, {"A": (2, 2)})

    def step(bb, carries, xs):
        x, = carries
        return [bb.op("tanh", bb.add(bb.op("matmul", x, v["A"], trans_a=False, trans_b=False), v["c"]))], []
    (x_final,) = loop(b, [v["x0"]], [], step, trips=3)
    assert tuple(x_final.shape) == (N, 2)
    assert tuple(x_final.producer.attrs["body"].inputs[0].shape) == (N, 2)
    g = with_gradients(g, total(b, x_final), [v["x0"], v["c"], v["A"]])
    assert tuple(g.outputs["d_x0"].shape) == (1, 2)
    rng = np.random.default_rng(4)
    inputs = {"x0": rng.normal(size=(1, 2)), "c": rng.normal(size=(3, 2))}
    weights = {"A": rng.normal(size=(2, 2))}
    check_everything(g, inputs, weights, {"N": 3})


def test_carries_that_swap_places():
    g, b, v = new_graph({"a": (N, 2), "c": (N, 2)})
    (p, q) = loop(b, [v["a"], v["c"]], [], lambda bb, cs, xs: ([cs[1], bb.op("tanh", cs[0])], []), trips=3)
    g = with_gradients(g, total(b, p, q), [v["a"], v["c"]])
    rng = np.random.default_rng(5)
    inputs = {"a": rng.normal(size=(2, 2)), "c": rng.normal(size=(2, 2))}
    out = check_everything(g, inputs, {}, {"N": 2})
    a, c = inputs["a"], inputs["c"]
    for _ in range(3):
        a, c = c, np.tanh(a)
    np.testing.assert_allclose(out["objective"], plain_total(a, c), rtol=1e-12)


def test_a_loop_with_a_condition_stops_after_the_step_whose_flag_is_false():
    """Doubling until the sum passes 10 (at most 20 steps): a while loop, forward only."""
    g, b, v = new_graph({"x": (3,)}, phase="infer")

    def step(bb, carries, xs):
        x, n = carries
        doubled = bb.scale(x, 2.0)
        below = bb.op("ge_mask", bb.scalar(10.0, F64), bb.reduce_sum(doubled, (0,)))
        return bb.op("cast", below, dtype="bool"), [doubled, bb.add(n, bb.scalar(1.0, F64))]
    counter = b.op("broadcast_to", b.scalar(0.0, F64), shape=())
    x_final, steps = loop(b, [v["x"], counter], [], step, trips=20, condition=True)
    g.outputs.update(x=x_final, steps=steps)
    verify(g)
    x = np.array([0.25, 0.5, 0.25])
    expected, _ = interpret(g, {"x": x}, {})
    assert expected["steps"] == 4 and expected["x"].sum() == 16.0     # 2, 4, 8, 16: stops past 10
    planned = Plan(g, {}, {}).run({"x": x})
    np.testing.assert_array_equal(planned["x"], expected["x"])
    assert planned["steps"] == 4
    g.phase = "train"
    with pytest.raises(AutodiffError, match="condition has no gradient"):
        differentiate(g, b.reduce_sum(x_final, (0,)), [v["x"]])


@pytest.mark.parametrize("flag", [True, False])
def test_if_runs_one_branch_and_differentiates_through_it(flag):
    g, b, v = new_graph({"c": "bool", "x": (N, 3)}, {"W": (3, 3)})
    y, = if_(b, v["c"], lambda bb: [bb.op("tanh", bb.op("matmul", v["x"], v["W"], trans_a=False, trans_b=False))],
             lambda bb: [bb.op("sigmoid", v["x"])])
    g = with_gradients(g, total(b, y), [v["x"], v["W"]])
    rng = np.random.default_rng(6)
    inputs = {"c": np.array(flag), "x": rng.normal(size=(2, 3))}
    weights = {"W": rng.normal(size=(3, 3))}
    out = check_everything(g, inputs, weights, {"N": 2})
    want = np.tanh(inputs["x"] @ weights["W"]) if flag else 1 / (1 + np.exp(-inputs["x"]))
    np.testing.assert_allclose(out["objective"], plain_total(want), rtol=1e-12)
    if not flag:
        assert not out["d_W"].any()           # the branch taken never read W


@pytest.mark.parametrize("flag", [True, False])
def test_an_if_on_a_condition_known_when_compiling_keeps_one_branch(flag):
    g, b, v = new_graph({"x": (N, 3)}, phase="infer")
    # the condition is computed, not written: constant folding makes it a constant first
    cond = b.op("cast", b.op("ge_mask", b.scalar(1.0 if flag else -1.0, F64), b.scalar(0.0, F64)), dtype="bool")
    y, = if_(b, cond, lambda bb: [bb.op("tanh", v["x"])], lambda bb: [bb.op("exp", v["x"])])
    g.outputs["y"] = y
    ctx = PassContext(check=True)
    g = run_pipeline(g, ctx)
    assert [n.op for n in g.nodes] == (["tanh"] if flag else ["exp"])
    assert any("only its " + ("then" if flag else "else") + " branch is kept" in n for n in ctx.notes)


def test_unread_per_step_outputs_are_not_stacked():
    g, b, v = new_graph({"x": (4, N, 3), "h0": (N, 2)}, {"W": (2, 3), "U": (2, 2)}, phase="infer")
    h_last, _per_step = loop(b, [v["h0"]], [v["x"]], rnn_step(v["W"], v["U"]))
    g.outputs["h"] = h_last
    g = run_pipeline(g, PassContext(check=True))
    (node,) = [n for n in g.nodes if n.op == "loop"]
    assert len(node.outputs) == 1
    assert "square" not in [n.op for n in node.attrs["body"].graph.nodes]


def test_shape_errors_name_what_does_not_fit():
    g, b, v = new_graph({"x": (N, 3), "c": "bool"})
    with pytest.raises(ShapeError, match="carried value 0 enters the loop as f64\\[N, 3\\] but one step makes it"):
        loop(b, [v["x"]], [], lambda bb, cs, xs: ([bb.op("reduce_sum", cs[0], axes=(1,), keepdims=True)], []),
             trips=2)
    with pytest.raises(ShapeError, match="output 0 is f64\\[N, 3\\] in the then branch but f64\\[N, 1\\]"):
        if_(b, v["c"], lambda bb: [v["x"]], lambda bb: [bb.op("reduce_sum", v["x"], axes=(1,), keepdims=True)])


def test_random_ops_in_a_body_refuse_differentiation():
    g, b, v = new_graph({"x": (4, N, 3), "h0": (N, 3)})

    def step(bb, carries, xs):
        h = bb.add(carries[0], bb.mul(xs[0], bb.op("dropout_mask", xs[0], ratio=0.5)))
        return [h], []
    (h,) = loop(b, [v["h0"]], [v["x"]], step)
    with pytest.raises(AutodiffError, match="random ops"):
        differentiate(g, b.reduce_sum(h, (0, 1)), [v["x"]])


def test_verify_rejects_a_body_that_reads_an_outer_value():
    g, b, v = new_graph({"x": (4, N, 3), "h0": (N, 3)})
    (h, _) = loop(b, [v["h0"]], [v["x"]], lambda bb, cs, xs: ([bb.add(cs[0], xs[0])], [cs[0]]))
    g.outputs["h"] = h
    verify(g)
    body = h.producer.attrs["body"].graph
    body.nodes[0].inputs[1] = v["h0"]           # a pass that forgot to capture
    with pytest.raises(VerifyError, match="in its body: .* reads .* not defined"):
        verify(g)

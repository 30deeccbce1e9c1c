"""GEMM batching: InnerProducts on one bottom become one GEMM in the forward pass, and their
weight and input gradients one GEMM each in the backward pass; small independent products of
one shape become a batched matmul; and nothing batches where operands would be needed before
they exist or where the joined axis is not a fixed size."""
from __future__ import annotations

import numpy as np
import pytest
from pass_helpers import N, Tiny, check_pass, ops

from toolkit.compile import optimize, solver_config, train_graph
from toolkit.frontend import Net
from toolkit.ops.interpreter import interpret
from toolkit.ops.verify import verify
from toolkit.optim.solvers import host_values
from toolkit.passes.gemm import batch_gemms
from toolkit.passes.prune import eliminate_dead_code
from toolkit.runtime.plan import Plan

BRANCHES = """\
name: branches
inputs:
  data: {shape: [N, 12], dtype: float64}
  label: {shape: [N], dtype: int64}
layers:
  - {name: trunk, type: InnerProduct, bottom: data, top: trunk, num_output: 10}
  - {name: a, type: InnerProduct, bottom: trunk, top: a, num_output: 7}
  - {name: ra, type: ReLU, bottom: a, top: a}
  - {name: b, type: InnerProduct, bottom: trunk, top: b, num_output: 5}
  - {name: tb, type: TanH, bottom: b, top: b}
  - {name: c, type: InnerProduct, bottom: trunk, top: c, num_output: 6, bias_term: false}
  - {name: cat, type: Concat, bottom: [a, b, c], top: cat}
  - {name: out, type: InnerProduct, bottom: cat, top: out, num_output: 4}
  - {name: loss, type: SoftmaxWithLoss, bottom: [out, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: out, top: prob, phase: infer}
train:
  solver: {type: sgd, base_lr: 0.1, momentum: 0.9, weight_decay: 0.001}
"""


@pytest.fixture
def net(tmp_path) -> Net:
    path = tmp_path / "net.yaml"
    path.write_text(BRANCHES)
    return Net.load(str(path))


def gemms(graph) -> list[dict]:
    """Every GEMM of a graph (also those heading a fused epilogue), as its flags and shapes."""
    out = []
    for n in graph.nodes:
        if n.op == "matmul":
            attrs, ins = n.attrs, n.inputs
        elif n.op == "fused_epilogue" and n.attrs["head"] == "matmul":
            attrs, ins = dict(n.attrs["head_attrs"]), n.inputs[:2]
        else:
            continue
        out.append({"trans_a": attrs["trans_a"], "trans_b": attrs["trans_b"], "a": ins[0], "b": ins[1]})
    return out


def random_weights(net: Net, rng) -> dict:
    return {k: v + rng.uniform(-0.3, 0.3, v.shape) for k, v in net.init_weights(0, "float64").items()}


def test_branches_run_as_one_gemm_in_the_forward_pass(net, rng):
    weights = random_weights(net, rng)
    before = net.graph("infer")
    notes: list[str] = []
    after = optimize(net.graph("infer"), (), weights, notes=notes)
    verify(after)
    trunk_out = [g for g in gemms(after) if not g["trans_a"]]
    assert len(trunk_out) == 3                               # trunk, the three branches as one, out
    x = rng.standard_normal((5, 12))
    expected, _ = interpret(before, {"data": x}, weights)
    got = Plan(after, {"N": 5}, {}).run({"data": x})
    np.testing.assert_allclose(got["prob"], expected["prob"], rtol=1e-12)
    assert any("3 matmuls sharing an operand" in n for n in notes)


def count_train_gemms(graph) -> dict[str, int]:
    """GEMMs by their role in an InnerProduct's train step: forward (x W^T), weight gradient
    (g^T x), input gradient (g W)."""
    roles = {"forward": 0, "weight_gradient": 0, "input_gradient": 0}
    for g in gemms(graph):
        if g["trans_a"]:
            roles["weight_gradient"] += 1
        elif g["trans_b"]:
            roles["forward"] += 1
        else:
            roles["input_gradient"] += 1
    return roles


def test_forward_and_backward_gemms_batch_in_the_train_step(net, rng):
    cfg = solver_config(net)
    unbatched = optimize(train_graph(net, cfg), ("batch_gemms",))
    notes: list[str] = []
    batched = optimize(train_graph(net, cfg), notes=notes)
    verify(batched)
    # trunk, branches, out: 5 forward GEMMs -> 3; 5 weight gradients -> 3; the input gradients of
    # the branches (summed into the trunk's output gradient) and of out: 4 -> 2
    assert count_train_gemms(unbatched) == {"forward": 5, "weight_gradient": 5, "input_gradient": 4}
    assert count_train_gemms(batched) == {"forward": 3, "weight_gradient": 3, "input_gradient": 2}
    # the branches' bias gradients: one column sum of the joined output gradient (c has no bias)
    assert any(n.startswith("batch_gemms: 2 bias gradients") for n in notes)
    bias_sums = [n for n in batched.nodes if n.op == "reduce_sum" and n.inputs[0].shape[-1] == 18]
    assert len(bias_sums) == 1

    weights = random_weights(net, rng)
    reference = train_graph(net, cfg)
    for name, w in reference.weights.items():
        weights.setdefault(name, rng.uniform(-0.1, 0.1, w.value.type.concrete({})))   # momentum buffers
    feeds = {"data": rng.standard_normal((6, 12)), "label": rng.integers(0, 4, 6)}
    feeds.update(host_values(cfg, 0.1, 1, "float64"))
    expected, expected_updates = interpret(reference, feeds, weights)
    state = {k: np.array(weights[k]) for k in batched.weights}
    got = Plan(batched, {"N": 6}, state).run(feeds)
    np.testing.assert_allclose(got["@objective"], expected["@objective"], rtol=1e-12)
    for name, value in expected_updates.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-10, atol=1e-12, err_msg=name)


def test_no_batching_where_an_operand_depends_on_another_product(rng):
    """x @ W^T and x @ relu(x @ W^T)^T share x, but the second's operand needs the first's result."""
    def make():
        t = Tiny()
        x, w = t.input("x", (4, 4)), t.input("w", (4, 4))
        m1 = t.b.op("matmul", x, w, trans_a=False, trans_b=True)
        m2 = t.b.op("matmul", x, t.b.op("relu", m1), trans_a=False, trans_b=True)
        t.out("y", t.b.add(m1, m2))
        return t.g
    g = check_pass(make, batch_gemms, rng)
    assert ops(g).count("matmul") == 2 and "concat" not in ops(g)


def test_no_batching_along_a_symbolic_axis(rng):
    """x1 @ W^T and x2 @ W^T share W, but joining x1 and x2 would stack along the batch N."""
    def make():
        t = Tiny()
        x1, x2, w = t.input("x1", (N, 6)), t.input("x2", (N, 6)), t.input("w", (3, 6))
        t.out("y1", t.b.op("matmul", x1, w, trans_a=False, trans_b=True))
        t.out("y2", t.b.op("matmul", x2, w, trans_a=False, trans_b=True))
        return t.g
    g = check_pass(make, batch_gemms, rng)
    assert ops(g).count("matmul") == 2 and "concat" not in ops(g)


def test_no_batching_of_different_flags(rng):
    def make():
        t = Tiny()
        x, w1, w2 = t.input("x", (4, 6)), t.input("w1", (3, 6)), t.input("w2", (6, 3))
        t.out("y1", t.b.op("matmul", x, w1, trans_a=False, trans_b=True))
        t.out("y2", t.b.op("matmul", x, w2, trans_a=False, trans_b=False))
        return t.g
    g = check_pass(make, batch_gemms, rng)
    assert ops(g).count("matmul") == 2


def test_small_independent_products_become_one_batched_matmul(rng):
    def make():
        t = Tiny()
        a1, b1, a2, b2 = (t.input(n, (4, 8)) for n in ("a1", "b1", "a2", "b2"))
        t.out("y1", t.b.op("matmul", a1, b1, trans_a=False, trans_b=True))
        t.out("y2", t.b.op("matmul", a2, b2, trans_a=False, trans_b=True))
        return t.g
    g = check_pass(make, [batch_gemms, eliminate_dead_code], rng)
    products = [n for n in g.nodes if n.op == "matmul"]
    assert len(products) == 1 and products[0].inputs[0].shape == (2, 4, 8)


def test_compile_json_shows_the_gemm_counts(net, tmp_path):
    import contextlib
    import io
    import json

    from toolkit.cli import main
    path = tmp_path / "net.yaml"

    def compile_json(*flags):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["compile", str(path), "--phase", "train", "--json", *flags]) == 0
        report = json.loads(out.getvalue())
        return report["ops"].get("matmul", 0) + report["fused"].get("fused_epilogue", {}).get("matmul", 0)
    assert compile_json() == 8 and compile_json("--disable", "batch_gemms") == 14

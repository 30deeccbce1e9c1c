"""Fusions: BatchNorm and Scale folded into convolutions and InnerProducts, elementwise groups,
GEMM/convolution epilogues, conv + max-pool; each where it must fire and where it must not, with
the numbers before and after equal (bit for bit where the fused kernel runs the same numpy
calls), and only where the registry has the fused kernel for the graph's device and dtype."""
from __future__ import annotations

import numpy as np
import pytest
from pass_helpers import N, Tiny, apply, check_pass, ops, random_feeds

from toolkit.backend.registry import KERNELS, load_device
from toolkit.compile import optimize
from toolkit.frontend import Net
from toolkit.ops.interpreter import interpret
from toolkit.ops.verify import verify
from toolkit.passes.batchnorm import fold_batch_norm
from toolkit.passes.fuse import fuse_elementwise, fuse_epilogue
from toolkit.passes.pipeline import no_optimize
from toolkit.runtime.plan import Plan

HEAD = """\
name: t
inputs:
  data: {shape: [N, 3, 6, 6], dtype: DTYPE}
  label: {shape: [N], dtype: int64}
layers:
"""
TAIL = """\
  - {name: pool, type: Pooling, bottom: top, top: pool, pool: ave, global_pooling: true}
  - {name: ip, type: InnerProduct, bottom: pool, top: ip, num_output: 4}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss, phase: train}
"""


def load(tmp_path, layers: str, dtype="float64") -> Net:
    path = tmp_path / "net.yaml"
    path.write_text(HEAD.replace("DTYPE", dtype) + layers + TAIL)
    return Net.load(str(path))


def trained_like(net: Net, rng, dtype="float64") -> dict:
    """Filler weights moved off their defaults (biases not 0, BatchNorm statistics not 0 / 1)."""
    weights = {}
    for k, v in net.init_weights(0, dtype).items():
        v = v + rng.uniform(-0.5, 0.5, v.shape).astype(dtype)
        weights[k] = np.abs(v) + 0.5 if k.endswith("running_var") else v
    return weights


def infer_pair(net: Net, weights: dict, dtype: str, disable=()):
    """(the infer graph as lowered, the same optimised with the weights frozen, the passes' notes)."""
    notes: list[str] = []
    return net.graph("infer", dtype), optimize(net.graph("infer", dtype), tuple(disable), weights, notes=notes), notes


def assert_infer_equal(net: Net, weights: dict, dtype: str, rtol: float, rng, disable=()):
    """The optimised infer graph and its notes, after checking it gives the lowered one's numbers."""
    before, after, notes = infer_pair(net, weights, dtype, disable)
    verify(after)
    x = rng.standard_normal((3, 3, 6, 6)).astype(dtype)
    expected, _ = interpret(before, {"data": x}, weights)
    got = Plan(after, {"N": 3}, {k: weights[k] for k in after.weights}).run({"data": x})
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=rtol, atol=rtol * np.abs(expected[name]).max())
    return after, notes


def arithmetic(graph) -> list[str]:
    """Normalisation arithmetic left anywhere in the graph, fused programs included."""
    found = [n.op for n in graph.nodes if n.op in ("sub", "mul", "rsqrt", "div", "add")]
    for n in graph.nodes:
        if n.op in ("fused_elementwise", "fused_epilogue"):
            found += [s[0] for s in n.attrs["program"] if s[0] in ("sub", "mul", "rsqrt", "div")]
    return found


CONV_BN = """\
  - {name: conv, type: Convolution, bottom: data, top: top, num_output: 5, kernel_size: 3, pad: 1}
  - {name: bn, type: BatchNorm, bottom: top, top: top}
  - {name: relu, type: ReLU, bottom: top, top: top}
"""
CONV_BN_SCALE = """\
  - {name: conv, type: Convolution, bottom: data, top: top, num_output: 5, kernel_size: 3, bias_term: false, group: 1}
  - {name: bn, type: BatchNorm, bottom: top, top: top, affine: false}
  - {name: scale, type: Scale, bottom: top, top: top, bias_term: true}
"""


@pytest.mark.parametrize("dtype,rtol", [("float32", 1e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("layers", [CONV_BN, CONV_BN_SCALE], ids=["bn-affine", "bn-then-scale"])
def test_batch_norm_and_scale_fold_into_the_convolution(tmp_path, rng, layers, dtype, rtol):
    net = load(tmp_path, layers, dtype)
    after, notes = assert_infer_equal(net, trained_like(net, rng, dtype), dtype, rtol, rng)
    assert arithmetic(after) == []
    assert any(n.startswith("fold_batch_norm: ") for n in notes)


def test_fold_without_frozen_weights_computes_the_new_weights_per_call(tmp_path, rng):
    """A training run's test graph reads live weights: the fold still fires, and W * s is
    computed from them on each call (weights are small next to activations)."""
    net = load(tmp_path, CONV_BN)
    weights = trained_like(net, rng)
    before = net.graph("test")
    after = apply(optimize(net.graph("test"), no_optimize()), fold_batch_norm)
    verify(after)
    assert any(n.op == "conv2d" and n.inputs[1].producer is not None and n.inputs[1].producer.op == "mul"
               for n in after.nodes)                                   # conv(x, W * s, ...)
    feeds = {"data": rng.standard_normal((2, 3, 6, 6)), "label": np.array([1, 2])}
    expected, _ = interpret(before, feeds, weights)
    got, _ = interpret(after, feeds, weights)
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-12)


@pytest.mark.parametrize("layers,why", [
    ("""\
  - {name: conv, type: Convolution, bottom: data, top: conv, num_output: 5, kernel_size: 3, pad: 1}
  - {name: bn, type: BatchNorm, bottom: conv, top: bn}
  - {name: sum, type: Eltwise, bottom: [conv, bn], top: top}
""", "the convolution's output has a second reader"),
    ("""\
  - {name: conv, type: Convolution, bottom: data, top: top, num_output: 5, kernel_size: 3, pad: 1}
  - {name: scale, type: Scale, bottom: top, top: top, axis: 2, num_axes: 1}
""", "a scale along the height, not the channels"),
    ("""\
  - {name: conv, type: Convolution, bottom: data, top: top, num_output: 6, kernel_size: 1}
  - {name: gate, type: Sigmoid, bottom: data, top: gate}
  - {name: pooled, type: Pooling, bottom: gate, top: pooled, pool: ave, global_pooling: true}
  - {name: expand, type: Convolution, bottom: pooled, top: s, num_output: 6, kernel_size: 1}
  - {name: flat, type: Reshape, bottom: s, top: s2, shape: [0, 6]}
  - {name: scale, type: Scale, bottom: [top, s2], top: top, axis: 0}
""", "a scale computed from the input, not from weights"),
])
def test_fold_must_not_fire(tmp_path, rng, layers, why):
    net = load(tmp_path, layers)
    after, notes = assert_infer_equal(net, trained_like(net, rng), "float64", 1e-12, rng)
    assert not any(n.startswith("fold_batch_norm") for n in notes), why


def test_fold_never_fires_in_training(tmp_path):
    """Batch statistics come from the input, and the backward pass reads the conv output."""
    net = load(tmp_path, CONV_BN)
    from toolkit.compile import train_graph
    notes: list[str] = []
    optimize(train_graph(net), notes=notes)
    assert notes and not any(n.startswith("fold_batch_norm") for n in notes)


def test_inner_product_with_batch_norm_folds(tmp_path, rng):
    layers = """\
  - {name: flat, type: Flatten, bottom: data, top: flat}
  - {name: fc, type: InnerProduct, bottom: flat, top: fc, num_output: 6}
  - {name: bn, type: BatchNorm, bottom: fc, top: fc}
  - {name: back, type: Reshape, bottom: fc, top: top, shape: [0, 6, 1, 1]}
"""
    net = load(tmp_path, layers)
    after, notes = assert_infer_equal(net, trained_like(net, rng), "float64", 1e-12, rng)
    assert "fold_batch_norm: bn into fc" in notes and "rsqrt" not in ops(after)


# -- elementwise groups ----------------------------------------------------------------------------
def chain(train=False):
    """A tree of elementwise ops: sigmoid(x) * x + b, with a value (the product) read outside."""
    t = Tiny()
    x, b = t.input("x", (N, 5)), t.input("b", (5,))
    p = t.b.mul(t.b.op("sigmoid", x), x)
    y = t.b.op("tanh", t.b.add(p, b))
    t.out("y", y)
    t.out("s", t.b.reduce_sum(p, (1,)))                  # p leaves the group
    return t.g


def test_elementwise_group_is_one_op_with_the_values_read_outside_as_outputs(rng):
    g = check_pass(chain, fuse_elementwise, rng)
    fused = [n for n in g.nodes if n.op == "fused_elementwise"]
    assert len(fused) == 1 and len(fused[0].outputs) == 2
    assert [s[0] for s in fused[0].attrs["program"]] == ["sigmoid", "mul", "add", "tanh"]


def test_fused_results_equal_unfused_bit_for_bit(rng):
    before, after = chain(), apply(chain(), fuse_elementwise)
    feeds = random_feeds(before, rng)
    a = Plan(before, {"N": 3}, {}).run(feeds)
    b = Plan(after, {"N": 3}, {}).run(feeds)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_a_group_closes_at_its_first_outside_reader(rng):
    """x -> exp -> (read by a reduction) ... then neg(exp): joining would move the group past the
    reduction that needs its value, so a new group starts."""
    def make():
        t = Tiny()
        x = t.input("x", (3, 4))
        e = t.b.op("exp", t.b.op("abs", x))
        s = t.b.reduce_sum(e, (1,), keepdims=True)
        t.out("y", t.b.mul(t.b.op("neg", e), s))
        return t.g
    g = check_pass(make, fuse_elementwise, rng)
    assert ops(g) == ["fused_elementwise", "reduce_sum", "fused_elementwise"]


def test_groups_only_of_one_shape(rng):
    """A broadcast operand joins as an input; an op whose result has another shape does not join."""
    def make():
        t = Tiny()
        x, v = t.input("x", (3, 4)), t.input("v", (4,))
        small = t.b.op("exp", t.b.op("neg", v))                         # [4]: a group of its own
        t.out("y", t.b.op("relu", t.b.add(x, small)))
        return t.g
    g = check_pass(make, fuse_elementwise, rng)
    shapes = [n.outputs[0].shape for n in g.nodes if n.op == "fused_elementwise"]
    assert shapes == [(4,), (3, 4)]


def test_fusion_asks_the_registry(monkeypatch, rng):
    """No fused kernel registered for the device and dtype: nothing fuses."""
    load_device("cpu")                                   # registered first, then taken away
    for key in [k for k in KERNELS.entries if k[0] in ("fused_elementwise", "fused_epilogue")]:
        monkeypatch.delitem(KERNELS.entries, key)
    g = apply(chain(), fuse_elementwise, fuse_epilogue)
    assert not any(op.startswith("fused_") for op in ops(g))


# -- epilogues -------------------------------------------------------------------------------------
def dense(trans_a=False, second_reader=False):
    t = Tiny()
    x, w, b = t.input("x", (N, 6)), t.weight("w", (4, 6)), t.weight("b", (4,))
    h = t.b.op("matmul", x, w, trans_a=trans_a, trans_b=True) if not trans_a else \
        t.b.op("matmul", t.b.op("transpose", x, perm=(1, 0)), w, trans_a=True, trans_b=True)
    y = t.b.op("relu", t.b.add(h, b))
    t.out("y", y)
    if second_reader:
        t.out("h", h)
    return t.g


def test_gemm_bias_activation_is_one_kernel(rng):
    g = check_pass(dense, [fuse_elementwise, fuse_epilogue], rng)
    assert ops(g) == ["fused_epilogue"]
    node = g.nodes[0]
    assert node.attrs["head"] == "matmul" and [s[0] for s in node.attrs["program"]] == ["add", "relu"]


@pytest.mark.parametrize("variant", ["second-reader", "weight-gradient-gemm"])
def test_epilogue_must_not_fire(rng, variant):
    """Not where the GEMM's result is read elsewhere, nor on a trans_a GEMM (a weight gradient:
    the plan sums its per-core shares after the GEMM, so nothing can run on a share)."""
    make = (lambda: dense(second_reader=True)) if variant == "second-reader" else (lambda: dense(trans_a=True))
    g = check_pass(make, [fuse_elementwise, fuse_epilogue], rng)
    assert "fused_epilogue" not in ops(g)


def test_conv_epilogue_and_pooling_in_a_train_graph(tmp_path, rng):
    """In training, conv + ReLU still fuse (the backward pass reads the ReLU's output, not the
    convolution's); conv + max-pool do not (the pooling gradient reads the convolution's output)."""
    net = load(tmp_path, """\
  - {name: conv, type: Convolution, bottom: data, top: c, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu, type: ReLU, bottom: c, top: c}
  - {name: mp, type: Pooling, bottom: c, top: top, kernel_size: 2, stride: 2}
""")
    from toolkit.compile import train_graph
    g = optimize(train_graph(net))
    heads = [n.attrs["head"] for n in g.nodes if n.op == "fused_epilogue"]
    assert "conv2d" in heads and "conv2d_max_pool2d" not in ops(g)
    infer = optimize(net.graph("infer"), (), net.init_weights())
    assert any(n.op == "fused_epilogue" and n.attrs["head"] == "conv2d_max_pool2d" for n in infer.nodes)

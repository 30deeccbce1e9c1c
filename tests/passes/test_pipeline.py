"""Graph passes: what each changed (structure) and that the numbers did not change (reference
interpreter before vs compiled plan after), including cases where a pass must not fire."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.compile import add_gradients, forward_graph
from toolkit.frontend import Net
from toolkit.ir.verify import VerifyError, verify
from toolkit.passes.pipeline import PIPELINE, run_pipeline
from toolkit.runtime.interpreter import interpret
from toolkit.runtime.plan import Plan
from toolkit.train.solvers import SolverConfig, add_solver

NET = """\
name: convpool
inputs:
  data: {shape: [N, 2, 18, 18]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, kernel_size: 2, stride: 2}
  - {name: conv2, type: Convolution, bottom: pool1, top: conv2, num_output: 5, kernel_size: 3, bias_term: false}
  - {name: pool2, type: Pooling, bottom: conv2, top: pool2, kernel_size: 3, stride: 2, pad: 1}
  - {name: conv3, type: Convolution, bottom: pool2, top: conv3, num_output: 3, kernel_size: 1}
  - {name: relu3, type: ReLU, bottom: conv3, top: conv3}
  - {name: pool3, type: Pooling, bottom: conv3, top: pool3, kernel_size: 2, stride: 1}
  - {name: side, type: Pooling, bottom: conv1, top: side, pool: ave, kernel_size: 2, stride: 2, phase: test}
  - {name: loss, type: EuclideanLoss, bottom: [pool3, pool3], top: loss, phase: train}
"""


@pytest.fixture
def net(tmp_path) -> Net:
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    return Net.load(str(path))


def ops_of(graph):
    return [n.op for n in graph.nodes]


def test_fuses_only_where_the_pooling_is_the_sole_unpadded_reader(net):
    graph = forward_graph(net, "infer")
    ops = ops_of(graph)
    # conv1 -> pool1 fuses; conv2 -> pool2 does not (padded pooling); conv3 -> relu -> pool3 does
    # once simplify has moved the relu after the pooling (max commutes with a monotone activation)
    assert ops.count("conv2d_max_pool2d") == 2
    assert ops.count("conv2d") == 1 and ops.count("max_pool2d") == 1
    fused = [n for n in graph.nodes if n.op == "conv2d_max_pool2d"]
    assert fused[0].scope == "conv1+pool1" and fused[0].attrs["pool_kernel"] == (2, 2)
    assert fused[1].scope == "conv3+pool3" and ops[-1] == "relu"
    verify(graph)


def test_no_fusion_when_the_convolution_has_another_reader(net):
    graph = forward_graph(net, "test")            # the test phase also average-pools conv1
    assert not any(n.op == "conv2d_max_pool2d" and n.scope.startswith("conv1") for n in graph.nodes)


def test_no_fusion_in_train_graphs(net):
    graph = net.graph("train")
    add_solver(graph, add_gradients(graph), SolverConfig())
    graph = run_pipeline(graph, check=True)
    assert "conv2d_max_pool2d" not in ops_of(graph)  # the pooling gradient reads the conv output


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float64", 1e-12)])
def test_numbers_unchanged_by_the_pipeline(net, rng, dtype, tol):
    before = net.graph("infer", dtype)
    after = run_pipeline(net.graph("infer", dtype), check=True)
    weights = {k: v.astype(dtype) for k, v in net.init_weights(3).items()}
    for k in weights:
        weights[k] += rng.uniform(-0.5, 0.5, weights[k].shape).astype(dtype)
    for n in (1, 3):
        x = rng.standard_normal((n, 2, 18, 18)).astype(dtype)
        expected, _ = interpret(before, {"data": x}, weights)
        got = Plan(after, {"N": n}, {k: weights[k] for k in after.weights}).run({"data": x})
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=tol, atol=tol)


def test_passes_switch_off_by_name(net):
    graph = run_pipeline(net.graph("infer"), disable=("fuse_conv_max_pool",))
    assert "conv2d_max_pool2d" not in ops_of(graph)
    with pytest.raises(ValueError, match="unknown pass"):
        run_pipeline(net.graph("infer"), disable=("fuse_everything",))
    assert PIPELINE[0].name == "eliminate_dead_code"


def test_verifier_names_the_broken_invariant(net):
    graph = net.graph("infer")
    verify(graph)
    graph.nodes[0], graph.nodes[1] = graph.nodes[1], graph.nodes[0]
    with pytest.raises(VerifyError, match="not defined above"):
        verify(graph)
    graph = net.graph("infer")
    graph.nodes[0].attrs = dict(graph.nodes[0].attrs, pad=(0, 0))   # the type no longer follows
    with pytest.raises(VerifyError, match="shape rule gives"):
        verify(graph)

"""Batch splitting across threads: split plans give the reference interpreter's numbers, for
row-split ops and batch-sum ops (weight gradients), in inference and in a full train step."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.compile import forward_graph, train_step_graph
from toolkit.frontend import Net
from toolkit.ops.interpreter import interpret
from toolkit.optim.solvers import SolverConfig, host_values
from toolkit.runtime import parallel
from toolkit.runtime.plan import Plan

NET = """\
name: split
inputs:
  data: {shape: [N, 2, 12, 12]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, kernel_size: 2, stride: 2}
  - {name: conv2, type: Convolution, bottom: pool1, top: conv2, num_output: 6, kernel_size: 3, group: 2}
  - {name: relu2, type: ReLU, bottom: conv2, top: conv2}
  - {name: pool2, type: Pooling, bottom: conv2, top: pool2, pool: ave, kernel_size: 2, stride: 2}
  - {name: ip1, type: InnerProduct, bottom: pool2, top: ip1, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
"""


@pytest.fixture
def net(tmp_path) -> Net:
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    return Net.load(str(path))


@pytest.fixture
def split_everything(monkeypatch):
    monkeypatch.setattr(parallel, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(parallel, "MIN_SPLIT_BYTES", 0)


def weights_of(net, graph, rng):
    w = {k: v.astype(np.float64) + rng.uniform(-0.1, 0.1, v.shape) for k, v in net.init_weights(1).items()}
    for name, weight in graph.weights.items():
        w.setdefault(name, np.zeros(weight.value.type.concrete({}), np.float64))
    return w


@pytest.mark.parametrize("threads,batch", [(2, 5), (3, 7), (2, 1)])
def test_split_inference_matches_the_interpreter(net, rng, split_everything, threads, batch):
    graph = forward_graph(net, "infer", "float64")
    weights = weights_of(net, graph, rng)
    x = rng.standard_normal((batch, 2, 12, 12))
    plan = Plan(graph, {"N": batch}, weights, threads=threads, native=False)   # the numpy split path
    assert (plan.made.split_steps > 0) == (batch >= threads)
    expected, _ = interpret(graph, {"data": x}, weights)
    np.testing.assert_allclose(plan.run({"data": x})["prob"], expected["prob"], rtol=1e-12, atol=1e-14)


def test_split_train_step_matches_the_interpreter(net, rng, split_everything):
    graph = train_step_graph(net, SolverConfig(momentum=0.9), "float64")
    weights = weights_of(net, graph, rng)
    feed = {"data": rng.standard_normal((6, 2, 12, 12)), "label": rng.integers(0, 5, 6),
            **host_values(SolverConfig(momentum=0.9), 0.1, 1, "float64")}
    _, expected = interpret(graph, feed, weights)
    live = {k: v.copy() for k, v in weights.items()}
    plan = Plan(graph, {"N": 6}, live, threads=2, native=False)   # the numpy split path
    kinds = {parallel.split_kind(n)[0] for n in plan.steps if parallel.split_kind(n)}
    assert kinds == {"rows", "sum"}            # both ways of splitting are exercised
    plan.run(feed)
    for name, value in expected.items():
        np.testing.assert_allclose(live[name], value, rtol=1e-11, atol=1e-13, err_msg=name)


def test_small_ops_are_not_split(net, rng):
    graph = forward_graph(net, "infer")
    weights = weights_of(net, graph, rng)
    plan = Plan(graph, {"N": 2}, {k: v.astype(np.float32) for k, v in weights.items()}, threads=2)
    assert plan.made.split_steps == 0               # all below the work threshold


def test_a_failing_share_raises_in_the_caller():
    workers = parallel.Workers.shared(2)

    def boom():
        raise ValueError("share failed")
    with pytest.raises(ValueError, match="share failed"):
        workers.run([lambda: None, boom])
    workers.run([lambda: None, lambda: None])  # the pool still works afterwards

"""A net lowers each phase once (per lowering key) and hands out copies: a train of LeNet lowers
train, test and infer once each; a graph a caller changes leaves the next one handed out as it
was; a graph's copy shares nothing a pass changes."""
from __future__ import annotations

import re

import numpy as np
import pytest

import toolkit.frontend.net as net_module
from toolkit.cli import main
from toolkit.frontend import Net
from toolkit.ir.graph import copy_graph
from toolkit.ops.interpreter import interpret

LENET = """\
name: lenet
inputs:
  data:  {shape: [N, 1, 8, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, pool: max, kernel_size: 2, stride: 2}
  - {name: ip1, type: InnerProduct, bottom: pool1, top: ip1, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss, phase: [train, test]}
  - {name: accuracy, type: Accuracy, bottom: [ip1, label], top: accuracy, phase: test}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
outputs: [prob]
train:
  data: {source: "builtin:digits", test_fraction: 0.2, batch_size: 16, scale: 0.0625}
  solver: {type: sgd, base_lr: 0.05}
  max_iter: 3
  test_interval: 3
  seed: 0
"""


@pytest.fixture
def lenet(tmp_path) -> str:
    path = tmp_path / "lenet.yaml"
    path.write_text(LENET)
    return str(path)


def shape_of(graph) -> str:
    """The graph's text with value ids numbered in order of appearance: equal for equal graphs."""
    ids: dict[str, str] = {}
    return re.sub(r"%\d+", lambda m: ids.setdefault(m.group(), f"%{len(ids)}"), graph.dump())


def counting(monkeypatch, module, name: str) -> list:
    """Calls of ``module.name`` from here on, each as its arguments."""
    calls: list = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_train_lowers_each_phase_once(lenet, tmp_path, monkeypatch, capsys):
    calls = counting(monkeypatch, net_module, "lower_phase")
    assert main(["train", lenet, "--out", str(tmp_path / "run")]) == 0
    assert "trained lenet for 3 iterations" in capsys.readouterr().out
    # before, 8: three to check the file, the train and test graphs again, three for the fillers
    assert sorted(args[2] for args in calls) == ["infer", "test", "train"]


def test_a_changed_graph_leaves_the_next_one_as_lowered(lenet):
    net = Net.load(lenet)
    first = net.graph("infer")
    before = shape_of(net.graph("infer"))
    # what passes do to a graph: nodes dropped, attributes and outputs rewritten, weights renamed
    first.nodes[0].attrs["stride"] = (7, 7)
    first.nodes[0].inputs.clear()
    del first.nodes[1:]
    first.outputs.clear()
    first.weights.pop("conv1.weight")
    first.inputs["data"].type = None
    second = net.graph("infer")
    assert shape_of(second) == before and "conv2d" in before
    assert {v.id for v in second.inputs.values()}.isdisjoint({v.id for v in first.inputs.values()})
    weights = net.init_weights(seed=1)
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    out, _ = interpret(second, {"data": x}, weights)
    assert out["prob"].shape == (2, 10) and np.allclose(out["prob"].sum(axis=1), 1.0, atol=1e-6)
    # a float type that changes the lowering is a lowering of its own; the net's float type is not
    assert net.graph("infer", "float64").inputs["data"].dtype == "float64"
    assert shape_of(net.lower("infer", "float32").graph) == shape_of(net.lower("infer").graph)


def test_copy_graph_copies_bodies_and_maps_values():
    from toolkit.ir.graph import Graph, TensorType, Value
    from toolkit.ops.base import Builder
    from toolkit.ops.control import bodies_of, build_body
    graph = Graph("infer")
    x = graph.inputs["x"] = Value(TensorType((3,), "float32"), name="x")
    body, _ = build_body([TensorType((3,), "float32")], lambda bb, args: [bb.add(args[0], args[0])], "then")
    y = Builder(graph, "r").op("relu", x)
    graph.nodes[0].attrs["then_body"] = body          # any attribute holding a body is copied
    graph.outputs["y"] = y
    values: dict = {}
    copied = copy_graph(graph, values)
    (inner,) = bodies_of(copied.nodes[0])
    assert inner is not body and inner.graph is not body.graph
    assert [n.op for n in inner.graph.nodes] == ["add"] and inner.graph.nodes[0] is not body.graph.nodes[0]
    assert copied.nodes[0].inputs == [values[x.id]]
    assert copied.outputs["y"] is values[y.id] is copied.nodes[0].outputs[0]
    assert values[x.id] is not x and values[x.id].type == x.type and copied.nodes[0] is not graph.nodes[0]
    copied.nodes[0].attrs.clear()
    inner.graph.nodes.clear()
    assert bodies_of(graph.nodes[0]) == [body] and len(body.graph.nodes) == 1

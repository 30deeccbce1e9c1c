"""Placement on several devices, tested with two CPU devices (cpu and cpu:1 share the host's
memory but are separate arenas and kernels' homes): transfers where values cross, none inside a
device, fusions that never span two devices, and results equal to the one-device run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from toolkit.backend.devices import parse_device
from toolkit.backend.placement import Placement
from toolkit.benchmarking import bench_plan
from toolkit.cli import main
from toolkit.frontend import Net

NET = """\
name: placed
inputs:
  data:  {shape: [N, 1, 8, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1DEV_RELU}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1, pool: max, kernel_size: 2, stride: 2DEV_POOL}
  - {name: ip1, type: InnerProduct, bottom: pool1, top: ip1, num_output: 10DEV_IP}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
outputs: [prob]
train:
  data: {source: "builtin:digits"}
  solver: {type: sgd, base_lr: 0.1, momentum: 0.9}
  max_iter: 10
"""


def _net(tmp_path, placed: bool, name="net.yaml") -> Net:
    text = NET
    for key, dev in (("DEV_RELU", "cpu:1"), ("DEV_POOL", "cpu:1"), ("DEV_IP", "cpu:1")):
        text = text.replace(key, f", device: {dev}" if placed else "")
    path = tmp_path / name
    path.write_text(text)
    return Net.load(str(path))


def _transfers(graph):
    return [n for n in graph.nodes if n.op == "transfer"]


def _check_no_cross_reads(graph, placement: Placement):
    """Every node (but a transfer) reads values of its own device or constants."""
    weights = {w.value.id: w for w in graph.weights.values()}
    for node in graph.nodes:
        if node.op == "transfer":
            continue
        here = placement.node(node)
        for v in node.inputs:
            p = v.producer
            if p is None:
                if v.id not in weights:
                    assert here == placement.default, f"{node} reads a graph input off its device"
            elif p.op not in ("constant", "scalar"):
                assert placement.node(p) == here, f"{node.op} ({node.scope}) on {here} reads {p.op} on " \
                                                  f"{placement.node(p)}"


@pytest.mark.parametrize("train", [False, True], ids=["infer", "train"])
def test_placed_net_equals_one_device(tmp_path, train):
    runs = {}
    for placed in (False, True):
        net = _net(tmp_path, placed, f"{placed}.yaml")
        plan, inputs = bench_plan(net, 8, train)
        outs = [{k: v.copy() for k, v in plan.run(inputs).items()} for _ in range(2 if train else 1)]
        weights = {name: plan.memory.storage_of[w.value.id].external.copy() for name, w in plan.graph.weights.items()}
        runs[placed] = (outs, weights, plan)
    (outs0, w0, plan0), (outs1, w1, plan1) = runs[False], runs[True]
    for a, b in zip(outs0, outs1):
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-7, err_msg=k)
    for k in w0:
        np.testing.assert_allclose(w1[k], w0[k], rtol=1e-6, atol=1e-7, err_msg=k)
    assert not _transfers(plan0.graph)
    moves = _transfers(plan1.graph)
    # forward: conv1's output goes to cpu:1 (relu, pool, ip1) and ip1's back (softmax, loss);
    # backward: the loss gradient to cpu:1, relu's gradient back to conv1, and the step's
    # learning rate (a graph input, on the graph's device) to ip1's update on cpu:1
    assert {(n.attrs["src"], n.attrs["dst"]) for n in moves} == {("cpu", "cpu:1"), ("cpu:1", "cpu")}
    assert len(moves) == (5 if train else 2)
    assert len(moves) == (len({id(n.inputs[0]) for n in moves}))       # one transfer per value
    assert plan1.build.placement.default == parse_device("cpu") and plan1.build.placement.by_layer
    _check_no_cross_reads(plan1.graph, plan1.build.placement)
    assert set(plan1.memory.peak_by_device) == {parse_device("cpu"), parse_device("cpu:1")}


def test_fusions_stay_inside_one_device(tmp_path):
    net = _net(tmp_path, True)
    plan, _ = bench_plan(net, 4, False)
    for node in plan.graph.nodes:
        if node.op.startswith("fused") or node.op == "conv2d_max_pool2d":
            # conv1 (cpu) never takes relu1 or pool1 (cpu:1) as its epilogue
            assert "conv1" not in node.scope or "relu1" not in node.scope
    assert not any(n.op == "conv2d_max_pool2d" for n in plan.graph.nodes)
    one, _ = bench_plan(_net(tmp_path, False, "one.yaml"), 4, False)
    assert any(n.op in ("fused_epilogue", "conv2d_max_pool2d") and "conv1" in n.scope for n in one.graph.nodes)


def test_compile_reports_transfers(tmp_path, capsys):
    path = tmp_path / "net.yaml"
    _net(tmp_path, True)
    assert main(["compile", str(path), "--phase", "infer", "--explain"]) == 0
    out = capsys.readouterr().out
    line = next(t for t in out.splitlines() if "place_devices:" in t)
    # one transfer of conv1's output: 4 channels x 8 x 8 float32 per image
    # conv1's output (4 x 8 x 8 float32 per image) to cpu:1, ip1's (10 float32) back
    assert "2 transfer(s) moving 1064*N bytes" in line and "cpu -> cpu:1, cpu:1 -> cpu" in line
    assert main(["compile", str(path), "--phase", "train", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ops"]["transfer"] == 5


def test_a_bad_device_key_points_at_its_line(tmp_path, capsys):
    path = tmp_path / "net.yaml"
    path.write_text(NET.replace("DEV_RELU", ", device: tpu").replace("DEV_POOL", "").replace("DEV_IP", ""))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:7:" in err and "device" in err and "Traceback" not in err


def test_a_layer_whose_name_has_dots_runs_on_its_device(tmp_path):
    """ONNX models name layers "layer1.0.conv1": the scope's longest head naming a placed layer
    decides, so "ip.one.grad" runs where "ip.one" does and "ip" (no device) on the default."""
    text = (NET.replace("name: ip1, type: InnerProduct, bottom: pool1, top: ip1, num_output: 10DEV_IP",
                        "name: ip.one, type: InnerProduct, bottom: pool1, top: ip1, num_output: 10, device: cpu:1")
            .replace("DEV_RELU", "").replace("DEV_POOL", ""))
    (tmp_path / "net.yaml").write_text(text)
    net = Net.load(str(tmp_path / "net.yaml"))
    plan, inputs = bench_plan(net, 4, True)
    placement = Placement.of(plan.graph, "cpu")
    on = {n.scope: placement.node(n) for n in plan.graph.nodes if n.op != "transfer"}
    placed = [s for s in on if s.split("+")[0].startswith("ip.one")]
    assert placed and all(on[s] == parse_device("cpu:1") for s in placed), on
    assert on[next(s for s in on if s.startswith("conv1"))] == parse_device("cpu")
    assert _transfers(plan.graph)
    whole, _ = bench_plan(_net(tmp_path, placed=False, name="plain.yaml"), 4, True)
    np.testing.assert_allclose(float(plan.run(inputs)["loss"]), float(whole.run(inputs)["loss"]), rtol=1e-6)

"""The slides' three schedules and the placer's choice on real nets (toolkit/placement/schedules.py),
predicted by the FLOP-rate cost model, whose answers are known by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.ir.dims import evaluate
from toolkit.ops.flops import graph_flops
from toolkit.passes.rewrite import CONSTANT_OPS
from toolkit.placement.model import FlopsModel, Link
from toolkit.placement.placer import Sharing, host_sharing
from toolkit.placement.schedules import blocks, compare, net_graph, parallel, placed_graph, serial
from toolkit.zoo.resolve import load_net

ROOT = Path(__file__).resolve().parents[2]
INCEPTION = str(ROOT / "benchmarks" / "nets" / "inception.yaml")
BATCH = {"N": 16}
TOWERS = [["t1", "t1_relu"], ["t2_reduce", "t2_reduce_relu", "t2", "t2_relu"],
          ["t3_reduce", "t3_reduce_relu", "t3", "t3_relu"], ["t4_pool", "t4", "t4_relu"]]


def _model() -> FlopsModel:
    return FlopsModel(BATCH, {"cpu": 20e9}, kernel_overhead_s=5e-6, default_link=Link(2e-6, 10e9))


def test_the_branches_of_an_inception_block_and_of_branchnet():
    assert blocks(net_graph(load_net(INCEPTION), "infer")) == [TOWERS]
    # in the train step too: the gradients and updates are not the forward structure
    assert blocks(net_graph(load_net(INCEPTION), "train")) == [TOWERS]
    assert blocks(net_graph(load_net("zoo:branchnet"), "infer")) == [
        [[f"branch_{k}", f"act_{k}"] for k in ("relu", "tanh", "sigmoid", "elu")]]


def test_the_parallel_schedule_deals_the_towers_over_the_devices_in_turn():
    lowered = net_graph(load_net(INCEPTION), "infer")
    layers = parallel(lowered, ["cpu", "cpu:1"])
    on_second = {layer for layer, d in layers.items() if d == "cpu:1"}
    assert on_second == set(TOWERS[1] + TOWERS[3])
    assert layers["joined"] == layers["fc"] == "cpu"
    assert set(serial(lowered, "cpu:1").values()) == {"cpu:1"}


def test_every_layer_on_one_device_is_predicted_as_the_sum_of_its_kernels():
    net = load_net(INCEPTION)
    graph = placed_graph(net, "infer", {}, "cpu", net.init_weights())
    kernels = [n for n in graph.nodes if n.op not in CONSTANT_OPS]
    by_hand = len(kernels) * 5e-6 + evaluate(graph_flops(graph), BATCH) / 20e9
    rows = {r.name: r for r in compare(net, "infer", _model(), BATCH, ["cpu", "cpu:1"], weights=net.init_weights())}
    assert rows["serial on cpu"].predicted.seconds == pytest.approx(by_hand)
    # on cpu:1 the input moves first: 16 x 64 x 28 x 28 float32 over the default link
    moved = 2e-6 + 16 * 64 * 28 * 28 * 4 / 10e9
    assert rows["serial on cpu:1"].predicted.seconds == pytest.approx(by_hand + moved)


@pytest.mark.parametrize("net_name,phase", [(INCEPTION, "infer"), (INCEPTION, "train"), ("zoo:branchnet", "infer"),
                                            ("zoo:branchnet", "train")])
@pytest.mark.parametrize("sharing", ["own cores", "core groups", "serial host", "concurrent host"])
def test_the_placers_choice_is_within_ten_percent_of_the_best_schedule_by_the_model(net_name, phase, sharing):
    net = load_net(net_name)
    devices = ["cpu", "cpu:1"]
    share = {"own cores": Sharing(), "core groups": host_sharing(devices, threads=2, groups=True),
             "serial host": host_sharing(devices, groups=False),
             "concurrent host": host_sharing(devices, concurrent=True, threads=2, groups=False)}[sharing]
    rows = {r.name: r.predicted.seconds for r in compare(net, phase, _model(), BATCH, devices, share,
                                                         weights=net.init_weights())}
    assert set(rows) == {"serial on cpu", "serial on cpu:1", "parallel", "greedy", "auto"}
    assert rows["auto"] <= rows["serial on cpu"] * (1 + 1e-12)
    assert rows["auto"] <= 1.1 * min(rows.values())
    if sharing in ("serial host", "concurrent host"):
        # cpu and cpu:1 share the cores: a split only adds transfers, so one device is best
        assert rows["auto"] == pytest.approx(rows["serial on cpu"])
        assert rows["parallel"] > rows["serial on cpu"]

"""The placer and its schedule simulation (toolkit/placement/placer.py), against hand arithmetic
with the FLOP-rate cost model: every answer here is known before the placer runs."""
from __future__ import annotations

import pytest

from toolkit.errors import UserError
from toolkit.ir.dims import Sym
from toolkit.ir.graph import Graph, TensorType, Value, Weight
from toolkit.ops import Builder
from toolkit.placement.model import FlopsModel, Link
from toolkit.placement.placer import host_sharing, layer_groups, place, simulate

N = Sym.named("N")
BATCH = {"N": 64}
OVERHEAD = 1e-6


class Net:
    """Layers of matmuls on [N, width] activations, each with its own [width, width] weight."""

    def __init__(self, width: int = 256):
        self.g, self.width = Graph("infer"), width
        self.x = Value(TensorType((N, width), "float32"), name="x")
        self.g.inputs["x"] = self.x

    def dense(self, layer: str, v: Value, width: int | None = None) -> Value:
        width = width or self.width
        w = Value(TensorType((v.shape[1], width), "float32"), name=f"{layer}.w")
        self.g.weights[w.name] = Weight(w.name, w, True, {"type": "xavier"}, layer=layer)
        return Builder(self.g, layer).op("matmul", v, w, trans_a=False, trans_b=False)

    def add(self, layer: str, a: Value, b: Value) -> Value:
        return Builder(self.g, layer).op("add", a, b)

    def matmul_seconds(self, rate: float, k: int | None = None, m: int | None = None) -> float:
        k, m = k or self.width, m or self.width
        return OVERHEAD + 2 * BATCH["N"] * k * m / rate

    def add_seconds(self, rate: float) -> float:
        return OVERHEAD + BATCH["N"] * self.width / rate


def model(link: Link, rates=(1e9, 1e9), memory=None) -> FlopsModel:
    return FlopsModel(BATCH, {"cpu": rates[0], "cpu:1": rates[1]}, kernel_overhead_s=OVERHEAD,
                      default_link=link, memory=memory or {})


def activation_bytes(width: int = 256) -> int:
    return BATCH["N"] * width * 4


def test_the_simulation_gives_a_placements_time_by_hand():
    # two branches on two devices, joined on the first: a [0, t]; b waits for x's transfer,
    # runs [tx, tx + t]; its output moves back and the add runs after both
    net = Net()
    a, b = net.dense("a", net.x), net.dense("b", net.x)
    net.g.outputs["y"] = net.add("join", a, b)
    link = Link(1e-5, 1e9)
    m = model(link)
    t, tx = net.matmul_seconds(1e9), link.seconds(activation_bytes())
    s = simulate(net.g, m, BATCH, "cpu", {"a": "cpu", "b": "cpu:1", "join": "cpu"})
    j = net.add_seconds(1e9)
    assert s.seconds == pytest.approx(max(t, tx + t + tx) + j)
    assert s.busy == pytest.approx({"cpu": t + j, "cpu:1": t})
    weight = 256 * 256 * 4
    # cpu: x, a's weight and output, b's output moved back, the sum; cpu:1: x moved, b's weight and output
    assert s.memory == {"cpu": 4 * activation_bytes() + weight, "cpu:1": 2 * activation_bytes() + weight}
    serial = simulate(net.g, m, BATCH, "cpu")
    assert serial.seconds == pytest.approx(2 * t + j)
    assert serial.layers == {"a": "cpu", "b": "cpu", "join": "cpu"}


def test_a_chain_stays_on_one_device_when_transfers_cost_more_than_they_save():
    net = Net()
    v = net.x
    for i in range(4):
        v = net.dense(f"l{i}", v)
    net.g.outputs["y"] = v
    # cpu:1 is 1.5x faster, but moving an activation costs more than the whole chain saves
    m = model(Link(2e-2, 1e9), rates=(1e9, 1.5e9))
    s = place(net.g, m, BATCH, ["cpu", "cpu:1"])
    assert set(s.layers.values()) == {"cpu"}
    assert s.seconds == pytest.approx(4 * net.matmul_seconds(1e9))
    # with a link that costs nothing much, the faster device takes the whole chain (one move of x)
    fast = model(Link(1e-9, 1e15), rates=(1e9, 1.5e9))
    s = place(net.g, fast, BATCH, ["cpu", "cpu:1"])
    assert set(s.layers.values()) == {"cpu:1"}
    assert s.seconds == pytest.approx(4 * net.matmul_seconds(1.5e9) + Link(1e-9, 1e15).seconds(activation_bytes()))


def _two_branches(width: int = 512) -> Net:
    net = Net(width)
    a, b = net.dense("a", net.x), net.dense("b", net.x)
    net.g.outputs["y"] = net.add("join", a, b)
    return net


def test_two_independent_heavy_branches_go_to_two_devices_when_that_pays():
    net = _two_branches()
    link = Link(1e-5, 1e10)
    s = place(net.g, model(link), BATCH, ["cpu", "cpu:1"])
    assert s.layers["a"] != s.layers["b"]
    t, tx, j = net.matmul_seconds(1e9), link.seconds(activation_bytes(512)), net.add_seconds(1e9)
    # the join goes where the last branch ends, so only the other branch's output moves
    assert s.seconds == pytest.approx(tx + t + j)
    assert s.seconds < 2 * t + j           # every layer on one device
    # a link so slow that one move costs more than a branch: both stay on one device
    slow = place(net.g, model(Link(1.0, 1e10)), BATCH, ["cpu", "cpu:1"])
    assert set(slow.layers.values()) == {"cpu"} and slow.seconds == pytest.approx(2 * t + j)


def test_a_memory_limit_forces_a_split():
    net = Net(512)
    v = net.dense("first", net.x)
    net.g.outputs["y"] = net.dense("second", v)
    weight, act = 512 * 512 * 4, activation_bytes(512)
    unbounded = place(net.g, model(Link(1e-3, 1e9)), BATCH, ["cpu", "cpu:1"])
    assert set(unbounded.layers.values()) == {"cpu"}
    # room for the input, one layer's weight and its output, and a moved activation; not two weights
    limit = weight + 3 * act
    m = model(Link(1e-3, 1e9), memory={"cpu": limit, "cpu:1": limit})
    s = place(net.g, m, BATCH, ["cpu", "cpu:1"])
    assert s.layers == {"first": "cpu", "second": "cpu:1"}
    assert all(used <= limit for used in s.memory.values())
    t = net.matmul_seconds(1e9)
    assert s.seconds == pytest.approx(2 * t + Link(1e-3, 1e9).seconds(act))
    with pytest.raises(UserError, match="no device has room|fits their memory"):
        place(net.g, model(Link(1e-3, 1e9), memory={"cpu": weight, "cpu:1": weight}), BATCH, ["cpu", "cpu:1"])


@pytest.mark.parametrize("latency", [1e-7, 1e-5, 1e-4, 1e-3])
@pytest.mark.parametrize("rates", [(1e9, 1e9), (1e9, 3e9), (4e9, 1e9)])
def test_never_worse_than_every_layer_on_one_device_by_the_model(latency, rates):
    # an Inception-like block: four towers of different depth and width off one stem, joined
    net = Net(128)
    stem = net.dense("stem", net.x)
    towers = []
    for i, depth in enumerate((1, 2, 3, 1)):
        v = stem
        for j in range(depth):
            v = net.dense(f"tower{i}_{j}", v, 128)
        towers.append(v)
    joined = net.add("join01", towers[0], towers[1])
    joined = net.add("join012", joined, towers[2])
    net.g.outputs["y"] = net.dense("head", net.add("join", joined, towers[3]))
    m = model(Link(latency, 1e9), rates=rates)
    s = place(net.g, m, BATCH, ["cpu", "cpu:1"])
    one = min(simulate(net.g, m, BATCH, "cpu", {k: d for k in s.layers}).seconds for d in ("cpu", "cpu:1"))
    assert s.seconds <= one * (1 + 1e-12)
    # and what it reports is what the simulation of its placement predicts
    assert s.seconds == pytest.approx(simulate(net.g, m, BATCH, "cpu", s.layers).seconds)


def test_layers_fused_into_one_node_are_placed_together():
    g = Graph("infer")
    x = Value(TensorType((N, 8), "float32"), name="x")
    g.inputs["x"] = x
    y = Builder(g, "conv1+relu1").op("relu", x)
    g.outputs["z"] = Builder(g, "relu1.grad").op("relu", y)
    assert layer_groups(g) == {"conv1": "conv1", "relu1": "conv1"}


def test_devices_that_share_the_hosts_cores_take_turns():
    # with core groups off, cpu and cpu:1 are two arenas on the same cores: run one node at a
    # time, a split only adds transfers, and the placer keeps every layer on one device
    net = _two_branches()
    link = Link(1e-5, 1e10)
    m = model(link)
    t, tx, j = net.matmul_seconds(1e9), link.seconds(activation_bytes(512)), net.add_seconds(1e9)
    serial = host_sharing(["cpu", "cpu:1"], threads=2, groups=False)
    split = simulate(net.g, m, BATCH, "cpu", {"a": "cpu", "b": "cpu:1", "join": "cpu"}, sharing=serial)
    assert split.seconds == pytest.approx(max(t, tx) + t + tx + j)
    s = place(net.g, m, BATCH, ["cpu", "cpu:1"], sharing=serial)
    assert set(s.layers.values()) == {"cpu"} and s.seconds == pytest.approx(2 * t + j)
    # concurrent waves on two threads run the branches side by side on one device, no transfer
    waves = host_sharing(["cpu", "cpu:1"], concurrent=True, threads=2, groups=False)
    assert simulate(net.g, m, BATCH, "cpu", sharing=waves).seconds == pytest.approx(t + j)
    s = place(net.g, m, BATCH, ["cpu", "cpu:1"], sharing=waves)
    assert s.seconds == pytest.approx(t + j)


class GroupCosts(FlopsModel):
    """The FLOP-rate model with what a grouped run costs beyond its nodes (cost.py measures it)."""
    start_s, wait_s = 3e-5, 2e-6

    def group_seconds(self, waits: int) -> float:
        return self.start_s + waits * self.wait_s


def test_core_groups_run_two_equal_independent_branches_side_by_side():
    """cpu and cpu:1 as core groups: two equal branches on the two devices take the longer of the
    two (plus the moves and the groups' own cost), not their sum; one device runs them in turn."""
    net = _two_branches()
    link = Link(1e-5, 1e10)
    m = GroupCosts(BATCH, {"cpu": 1e9}, kernel_overhead_s=OVERHEAD, default_link=link)
    t, tx, j = net.matmul_seconds(1e9), link.seconds(activation_bytes(512)), net.add_seconds(1e9)
    groups = host_sharing(["cpu", "cpu:1"], threads=2, groups=True)
    assert groups.groups and groups.describe().startswith("each host device runs its own nodes")
    split = simulate(net.g, m, BATCH, "cpu", {"a": "cpu", "b": "cpu:1", "join": "cpu"}, sharing=groups)
    # a on cpu [0, t]; x moves to cpu:1, b runs, its output moves back; the join after both;
    # the groups' start, and one wait: the join's for b (x is the run's input, there from the start)
    overhead = m.start_s + m.wait_s
    assert split.seconds == pytest.approx(max(t, tx + t + tx) + j + overhead)
    assert split.busy == pytest.approx({"cpu": t + j, "cpu:1": t})
    one = simulate(net.g, m, BATCH, "cpu", sharing=groups)
    assert one.seconds == pytest.approx(2 * t + j)           # one device: no group, no cost
    s = place(net.g, m, BATCH, ["cpu", "cpu:1"], sharing=groups)
    assert s.layers["a"] != s.layers["b"] and s.seconds == pytest.approx(tx + t + j + m.start_s + m.wait_s)
    # branches too small to pay for the groups' start stay on one device
    small = GroupCosts(BATCH, {"cpu": 1e9}, kernel_overhead_s=OVERHEAD, default_link=link)
    small.start_s = 2 * t
    assert set(place(net.g, small, BATCH, ["cpu", "cpu:1"], sharing=groups).layers.values()) == {"cpu"}


def test_a_placement_names_every_layer_of_a_fused_node():
    net = _two_branches()
    (node,) = [n for n in net.g.nodes if n.op == "add"]
    node.scope = "join+join_relu"
    s = simulate(net.g, model(Link(1e-5, 1e10)), BATCH, "cpu", {"a": "cpu", "b": "cpu:1", "join": "cpu:1"})
    assert s.layers == {"a": "cpu", "b": "cpu:1", "join": "cpu:1", "join_relu": "cpu:1"}


def test_the_hosts_devices_count_their_bytes_together_against_the_hosts_memory():
    net = Net(512)
    v = net.dense("first", net.x)
    net.g.outputs["y"] = net.dense("second", v)
    weight, act = 512 * 512 * 4, activation_bytes(512)
    limit = weight + 3 * act       # what forced a split over two separate memories
    m = model(Link(1e-3, 1e9), memory={"cpu": limit, "cpu:1": limit})
    split = simulate(net.g, m, BATCH, "cpu", {"first": "cpu", "second": "cpu:1"})
    assert split.fits(m)
    # cpu and cpu:1 draw on one memory: the split holds more than the limit in all
    assert sum(split.memory.values()) > limit and not split.fits(m, host_sharing(["cpu", "cpu:1"]))
    with pytest.raises(UserError):
        place(net.g, m, BATCH, ["cpu", "cpu:1"], sharing=host_sharing(["cpu", "cpu:1"]))

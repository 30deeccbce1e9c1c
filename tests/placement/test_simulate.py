"""The schedule simulation (toolkit/placement/simulate.py) on a hand-made diamond, against times
worked out by hand from a FlopsModel whose numbers are exact."""
from __future__ import annotations

import pytest

from toolkit.ir.graph import Graph, Node, TensorType, Value
from toolkit.placement.model import FlopsModel, Link
from toolkit.placement.simulate import dependency_waves, list_schedule, wave_schedule, waves_seconds


def _node(op: str, inputs: list[Value], scope: str, attrs: dict | None = None) -> Node:
    node = Node(op, inputs, attrs or {}, scope)
    node.outputs = [Value(TensorType((250,), "float32"), node)]      # 1,000 bytes each
    return node


def _diamond():
    """a -> (b, c) -> d: four unary ops of 0 FLOPs, so each costs the kernel overhead alone."""
    g = Graph("infer")
    x = Value(TensorType((250,), "float32"), name="x")
    g.inputs = {"x": x}
    a = _node("relu", [x], "a")
    b = _node("relu", a.outputs, "b")
    c = _node("relu", a.outputs, "c")
    d = _node("add", [b.outputs[0], c.outputs[0]], "d")
    return [a, b, c, d]


# every op 1 ms; a copy 0.5 ms + 1,000 bytes at 2 kB/s = 1 ms in all
MODEL = FlopsModel({}, {"cpu": 1e12}, kernel_overhead_s=1e-3, default_link=Link(0.5e-3, 2e6))


def _where(placed: dict[str, str]):
    return lambda node: placed.get(node.scope, "cpu")


def test_one_lane_runs_the_nodes_one_after_another_whatever_their_device():
    nodes = _diamond()
    t = list_schedule(nodes, _where({"c": "cpu:1"}), MODEL, lanes="one")
    # a 0-1, b 1-2, c waits for a's value to arrive on cpu:1 (1 + 1 ms) then 2-3, d waits for c's
    # value back on cpu (3 + 1 ms) then 4-5
    assert t.start == pytest.approx([0.0, 1e-3, 2e-3, 4e-3])
    assert t.seconds == pytest.approx(5e-3)


def test_lanes_per_device_overlap_the_branches_and_pay_the_transfers():
    nodes = _diamond()
    t = list_schedule(nodes, _where({"c": "cpu:1"}), MODEL, lanes="device")
    # b runs 1-2 on cpu while c runs 2-3 on cpu:1 (its input arrives at 2); d starts at 3 + 1
    assert t.start == pytest.approx([0.0, 1e-3, 2e-3, 4e-3])
    assert t.busy == pytest.approx({"cpu": 3e-3, "cpu:1": 1e-3})
    same = list_schedule(nodes, _where({}), MODEL, lanes="device")
    assert same.seconds == pytest.approx(4e-3)        # one device: four ops, no transfers
    # a link ten times faster makes the split worth it: a 0-1, b 1-2 | c 1.1-2.1, d at 2.2, ends 3.2
    fast = FlopsModel({}, {"cpu": 1e12}, kernel_overhead_s=1e-3, default_link=Link(0.05e-3, 2e7))
    assert list_schedule(nodes, _where({"c": "cpu:1"}), fast, lanes="device").seconds == pytest.approx(3.2e-3)


def test_a_transfer_node_is_the_copy_and_carries_the_value_without_a_second_charge():
    g_nodes = _diamond()
    a, b, c, d = g_nodes
    move = Node("transfer", [a.outputs[0]], {"src": "cpu", "dst": "cpu:1"}, "c")
    move.outputs = [Value(a.outputs[0].type, move)]
    c.inputs = [move.outputs[0]]
    t = list_schedule([a, b, move, c, d], _where({"c": "cpu:1"}), MODEL, lanes="device")
    # the copy runs on cpu:1 from 1 to 2, c 2-3; d reads c's value on cpu: 3 + 1, ends 5
    assert t.start == pytest.approx([0.0, 1e-3, 1e-3, 2e-3, 4e-3])
    assert t.seconds == pytest.approx(5e-3)


def test_waves_deal_each_waves_nodes_to_the_threads_and_wait_for_the_longest_share():
    nodes = _diamond()
    assert dependency_waves(nodes) == [[0], [1, 2], [3]]
    assert wave_schedule(nodes, _where({}), MODEL, workers=2).seconds == pytest.approx(3e-3)
    assert wave_schedule(nodes, _where({}), MODEL, workers=1).seconds == pytest.approx(4e-3)
    # the plan's own waves, given: all four in one wave on two threads is two ops per thread
    assert wave_schedule(nodes, _where({}), MODEL, workers=2, waves=[[0, 1, 2, 3]]).seconds == pytest.approx(2e-3)


def test_an_unknown_lane_rule_is_refused():
    with pytest.raises(ValueError, match="lanes"):
        list_schedule(_diamond(), _where({}), MODEL, lanes="threads")


def test_the_time_of_waves_is_the_sum_of_their_longest_shares():
    # shares dealt in turn: in wave [1, 2, 4] on two threads, steps 1 and 4 (2 + 5 s) beside step 2 (3 s)
    assert waves_seconds([[0], [1, 2, 4], [3]], [1.0, 2.0, 3.0, 4.0, 5.0], 2) == 1.0 + 7.0 + 4.0
    assert waves_seconds([[0, 1]], [1.0, 2.0], 1) == 3.0


class _Each:
    """Every step 1 ms, every copy 0.5 ms; a grouped run costs 0.3 ms to start and 0.1 ms a wait."""
    group_start_s, group_wait_s = 3e-4, 1e-4

    def op_seconds(self, node, device):
        return 0.5e-3 if node.op == "transfer" else 1e-3

    def transfer_seconds(self, value, src, dst):
        return 0.5e-3

    def measured(self, node, device):
        return True

    def group_seconds(self, waits):
        return self.group_start_s + waits * self.group_wait_s


def test_a_grouped_plan_is_predicted_by_its_devices_side_by_side(monkeypatch, tmp_path):
    """Two chains of InnerProducts, one on each core group: the prediction is each device's steps
    beside the other's, waits across them and the groups' own cost, not the sum of the steps."""
    import functools

    import toolkit.benchmarking as bench
    from toolkit.frontend.spec import parse_overrides
    from toolkit.placement.predict import predict_plan
    from toolkit.runtime import device_groups
    from toolkit.runtime.plan import Plan
    from toolkit.zoo.resolve import load_net
    path = tmp_path / "chains.yaml"
    path.write_text("""
name: chains
inputs: {data: {shape: [N, 64], dtype: float32}}
layers:
  - {name: a1, type: InnerProduct, bottom: data, top: a1, num_output: 64}
  - {name: a2, type: InnerProduct, bottom: a1, top: a2, num_output: 64}
  - {name: b1, type: InnerProduct, bottom: data, top: b1, num_output: 64}
  - {name: b2, type: InnerProduct, bottom: b1, top: b2, num_output: 64}
  - {name: joined, type: Concat, bottom: [a2, b2], top: joined}
outputs: [joined]
""")
    monkeypatch.setattr(device_groups, "MIN_GROUP_FLOPS", 0)
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=2, concurrent=False))
    placed = load_net(str(path), parse_overrides(["layers.b1.device=cpu:1", "layers.b2.device=cpu:1"]))
    plan, _ = bench.bench_plan(placed, 4, False)
    groups = plan.schedule.groups
    assert groups is not None
    on = [[plan.steps[s] for s in steps] for steps in groups.order]
    cpu1 = [n.op for n in on[1]]
    # cpu:1: the input's copy, then its chain (whatever the passes made of it); cpu: its chain,
    # then the copy of cpu:1's output back and the concatenation, after cpu:1's last step
    assert cpu1[0] == "transfer" and "transfer" not in cpu1[1:]
    assert [n.op for n in on[0]][-2:] == ["transfer", "concat"]
    cpu_chain, cpu1_chain = len(on[0]) - 2, len(cpu1) - 1
    by_hand = max(cpu_chain * 1e-3, 0.5e-3 + cpu1_chain * 1e-3) + 0.5e-3 + 1e-3
    predicted = predict_plan(plan, _Each())
    assert predicted.schedule == "groups"
    assert predicted.seconds == pytest.approx(by_hand + 3e-4 + groups.cross_edges() * 1e-4)
    serial = sum(0.5e-3 if n.op == "transfer" else 1e-3 for n in plan.steps)
    assert predicted.seconds < serial

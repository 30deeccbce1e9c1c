"""Host devices as core groups (runtime/device_groups.py): a plan placed over cpu and cpu:1 runs
each device's steps on its own thread, waiting only for the other device's steps it must follow;
its results equal the one-device plan's bit for bit, its devices' steps overlap in time, and an
error in either device is raised as the serial plan raises it."""
from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import toolkit.benchmarking as bench
from toolkit import settings
from toolkit.backend.devices import CPU, parse_device
from toolkit.frontend.spec import parse_overrides
from toolkit.runtime import device_groups
from toolkit.runtime.device_groups import GroupRun, group_schedule
from toolkit.runtime.plan import Plan
from toolkit.zoo.resolve import load_net

ROOT = Path(__file__).resolve().parents[2]
INCEPTION = str(ROOT / "benchmarks" / "nets" / "inception.yaml")
CPU1 = parse_device("cpu:1")

# Two independent chains of wide InnerProducts on one input, joined: one chain per device.
TWO_CHAINS = """
name: two_chains
inputs:
  data: {shape: [N, 512], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: a1, type: InnerProduct, bottom: data, top: a1, num_output: 512}
  - {name: a1_relu, type: ReLU, bottom: a1, top: a1}
  - {name: a1_drop, type: Dropout, bottom: a1, top: a1, dropout_ratio: 0.3}
  - {name: a2, type: InnerProduct, bottom: a1, top: a2, num_output: 512}
  - {name: b1, type: InnerProduct, bottom: data, top: b1, num_output: 512}
  - {name: b1_relu, type: ReLU, bottom: b1, top: b1}
  - {name: b1_drop, type: Dropout, bottom: b1, top: b1, dropout_ratio: 0.3}
  - {name: b2, type: InnerProduct, bottom: b1, top: b2, num_output: 512}
  - {name: joined, type: Concat, bottom: [a2, b2], top: joined}
  - {name: fc, type: InnerProduct, bottom: joined, top: fc, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: fc, top: prob, phase: infer}
outputs: [prob]
train:
  data: {source: "builtin:digits", batch_size: 16}
  solver: {type: sgd, base_lr: 0.01, momentum: 0.9}
  max_iter: 10
"""
B_CHAIN = ["b1", "b1_relu", "b1_drop", "b2"]


@pytest.fixture(autouse=True)
def small_nets_run_as_groups(request, monkeypatch):
    """These nets are small, so that the tests are quick: their plans run as groups whatever
    their work (the threshold has a test of its own)."""
    if "threshold" not in request.node.name:
        monkeypatch.setattr(device_groups, "MIN_GROUP_FLOPS", 0)


@pytest.fixture
def two_chains(tmp_path):
    path = tmp_path / "two_chains.yaml"
    path.write_text(TWO_CHAINS)
    return str(path)


def _plans(monkeypatch, source, layers, batch, train):
    """(the plan with ``layers`` on cpu:1 on two threads, the same placement run one step after
    another, the one-device plan, inputs): each kernel of every one runs on one thread, so their
    results can be equal bit for bit."""
    placed = load_net(source, parse_overrides([f"layers.{name}.device=cpu:1" for name in layers]))
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=2, concurrent=False))
    grouped, inputs = bench.bench_plan(placed, batch, train)
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=1, concurrent=False))
    serial, _ = bench.bench_plan(placed, batch, train)
    single, _ = bench.bench_plan(load_net(source), batch, train)
    return grouped, serial, single, inputs


def _same(got, want, exact, what):
    for k in want:
        if exact:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what} {k}")
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{what} {k}")


def test_schedule_waits_only_for_the_other_devices_steps_it_follows():
    cpu, cpu1 = CPU, CPU1
    # 0 (cpu) writes A; 1 (cpu:1) writes B; 2 (cpu:1) reads A: waits for cpu's first step;
    # 3 (cpu) writes C; 4 (cpu) reads B and C: waits for cpu:1's first step only (its two
    # steps' latest that it follows), 5 (cpu:1) reads A again: covered by step 2's wait
    a, b, c = (0, 0, 8), (1, 0, 8), (0, 8, 16)
    reads = [[], [], [a], [], [b, c], [a]]
    writes = [[a], [b], [(1, 8, 16)], [c], [(0, 16, 24)], [(1, 16, 24)]]
    on = [cpu, cpu1, cpu1, cpu, cpu, cpu1]
    s = group_schedule((cpu, cpu1), on, reads, writes, [False] * 6, threads=1)
    assert s.order == [[0, 3, 4], [1, 2, 5]]
    assert s.waits == [[], [], [(0, 1)], [], [(1, 1)], []]
    assert s.signals == {0, 1}


def test_random_draws_keep_their_order_across_devices():
    regions = [[(k, 0, 8)] for k in range(3)]
    s = group_schedule((CPU, CPU1), [CPU, CPU1, CPU], [[]] * 3, regions, [True, True, True], threads=1)
    assert s.waits == [[], [(0, 1)], [(1, 1)]]


# ``exact``: the placement compiles to the one-device plan's kernels, so its results are the
# one-device plan's bit for bit; branches apart on two devices are not batched into one GEMM
# (batch_gemms stops at a device boundary), which rounds differently: equal to the same placement
# run one step after another, and to the one-device plan within float32 rounding
@pytest.mark.parametrize("source, layers, batch, exact", [
    ("zoo:branchnet", ["branch_tanh", "act_tanh", "branch_elu", "act_elu"], 16, False),
    (INCEPTION, ["t4_pool", "t4", "t4_relu", "t2_reduce", "t2_reduce_relu", "t2", "t2_relu"], 4, True),
    ("two_chains", B_CHAIN, 8, False),
])
def test_a_two_device_plan_runs_as_two_groups_with_the_one_device_results(monkeypatch, two_chains, source, layers,
                                                                          batch, exact):
    source = two_chains if source == "two_chains" else source
    grouped, serial, single, inputs = _plans(monkeypatch, source, layers, batch, train=False)
    assert grouped.execution.groups == (CPU, CPU1) and grouped.schedule.groups is not None
    assert grouped.execution.kernel_threads == 1
    assert single.schedule.groups is None and single.execution.groups == ()
    one = {k: np.array(v) for k, v in single.run(inputs).items()}
    apart = {k: np.array(v) for k, v in serial.run(inputs).items()}
    for _ in range(2):
        got = grouped.run(inputs)
        _same(got, apart, True, "the same placement one step after another:")
        _same(got, one, exact, "the one-device plan:")


@pytest.mark.parametrize("source, layers, exact", [("zoo:lenet", ["ip1", "relu1", "ip2"], True),
                                                   ("zoo:branchnet", ["branch_tanh", "act_tanh"], False),
                                                   ("two_chains", B_CHAIN, False)])
def test_a_two_device_train_step_gives_the_one_device_losses_and_masks(monkeypatch, two_chains, source, layers,
                                                                       exact):
    """Three train steps (the weights updated in each): the losses of the same placement run one
    step after another bit for bit, dropout's masks drawn on both devices in the serial order."""
    source = two_chains if source == "two_chains" else source
    grouped, serial, single, inputs = _plans(monkeypatch, source, layers, 16, train=True)
    assert grouped.schedule.groups is not None
    for step in range(3):
        one = {k: np.array(v) for k, v in single.run(inputs).items()}
        apart = {k: np.array(v) for k, v in serial.run(inputs).items()}
        got = {k: np.array(v) for k, v in grouped.run(inputs).items()}
        _same(got, apart, True, f"step {step}, the same placement one step after another:")
        _same(got, one, exact, f"step {step}, the one-device plan:")


def test_one_running_device_or_the_switch_off_runs_as_before(monkeypatch):
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=2))
    whole = load_net("zoo:branchnet", parse_overrides([f"layers.{s.name}.device=cpu:1"
                                                        for s in load_net("zoo:branchnet").spec.layers]))
    plan, _ = bench.bench_plan(whole, 4, False)           # the inputs arrive on cpu, every step on cpu:1
    assert plan.execution.groups == () and plan.schedule.groups is None and plan.execution.kernel_threads == 2
    split = load_net("zoo:branchnet", parse_overrides(["layers.hidden.device=cpu:1"]))
    with settings.use(device_groups=False):
        plan, _ = bench.bench_plan(split, 4, False)
    assert plan.schedule.groups is None and plan.execution.kernel_threads == 2


def test_devices_that_only_hand_a_chain_back_and_forth_run_one_after_another(monkeypatch):
    """LeNet's ip1 on cpu:1: every step follows the one before, across the devices, so nothing
    could overlap and the plan keeps every thread for each kernel; its train step overlaps (ip1's
    backward beside the convolutions' weight gradients) and runs as groups."""
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=2, concurrent=False))
    placed = load_net("zoo:lenet", parse_overrides(["layers.ip1.device=cpu:1"]))
    infer, _ = bench.bench_plan(placed, 4, False)
    assert {str(infer.build.placement.node(n)) for n in infer.steps} == {"cpu", "cpu:1"}
    assert infer.schedule.groups is None and infer.execution.kernel_threads == 2
    train, _ = bench.bench_plan(placed, 4, True)
    assert train.schedule.groups is not None and train.execution.kernel_threads == 1


def test_the_threshold_keeps_too_little_work_on_one_device(monkeypatch):
    """branchnet's tanh branch on cpu:1 is 0.3 MFLOP at batch 16: less than the handoffs cost,
    so the plan runs one step after another; the Inception block's 3x3 tower there (over 100
    MFLOP at batch 16) runs as two groups."""
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=2, concurrent=False))
    small = load_net("zoo:branchnet", parse_overrides(["layers.branch_tanh.device=cpu:1",
                                                       "layers.act_tanh.device=cpu:1"]))
    plan, _ = bench.bench_plan(small, 16, False)
    assert plan.schedule.groups is None and plan.execution.kernel_threads == 2
    tower = ["t2_reduce", "t2_reduce_relu", "t2", "t2_relu"]
    large = load_net(INCEPTION, parse_overrides([f"layers.{name}.device=cpu:1" for name in tower]))
    plan, _ = bench.bench_plan(large, 16, False)
    assert plan.schedule.groups is not None and plan.execution.kernel_threads == 1


def _timed(calls, log):
    def timed(s, call):
        start = time.perf_counter()
        call()
        log.append((s, threading.get_ident(), start, time.perf_counter()))
    return [functools.partial(timed, s, call) for s, call in enumerate(calls)]


def test_the_two_devices_steps_overlap_in_time(monkeypatch, two_chains):
    """Each chain's GEMMs (about 10 ms each at batch 256 on one thread) on its own device: some
    step of one device starts before a step of the other ends, and after it starts. Wall-time
    intervals intersect even where both threads take turns on one busy core."""
    placed = load_net(two_chains, parse_overrides([f"layers.{name}.device=cpu:1" for name in B_CHAIN]))
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=2, concurrent=False))
    plan, inputs = bench.bench_plan(placed, 256, False)
    groups = plan.schedule.groups
    log: list = []
    plan.runner.run_calls = [GroupRun(groups, _timed(plan.calls, log))]
    for _ in range(3):
        log.clear()
        plan.run(inputs)
        spans = {g: [(a, b) for s, _t, a, b in log if groups.group_of[s] == g] for g in (0, 1)}
        assert len({t for *_, t in [(s, t) for s, t, _a, _b in log]}) == 2       # two threads ran them
        if any(a0 < b1 and a1 < b0 for a0, b0 in spans[0] for a1, b1 in spans[1]):
            return
    pytest.fail(f"no step of cpu overlapped a step of cpu:1 in 3 runs: {spans}")


def test_an_error_in_either_device_is_raised_and_stops_the_other(monkeypatch, two_chains):
    placed = load_net(two_chains, parse_overrides([f"layers.{name}.device=cpu:1" for name in B_CHAIN]))
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, threads=2, concurrent=False))
    plan, inputs = bench.bench_plan(placed, 8, False)
    groups = plan.schedule.groups
    on_cpu1 = groups.order[1]
    waiting = next(s for s in groups.order[0] if groups.waits[s])     # the join waits for cpu:1

    def failing(step, error):
        def call():
            raise error(f"step {step} failed")
        return call

    calls = list(plan.calls)
    calls[on_cpu1[-1]] = failing(on_cpu1[-1], ValueError)
    plan.runner.run_calls = [GroupRun(groups, calls)]
    with pytest.raises(ValueError, match=f"step {on_cpu1[-1]} failed"):
        plan.run(inputs)
    # both devices fail: the earliest step in the plan's order is raised, as the serial plan would
    first, later = sorted([on_cpu1[0], groups.order[0][0]])
    calls = list(plan.calls)
    calls[first], calls[later] = failing(first, KeyError), failing(later, ValueError)
    plan.runner.run_calls = [GroupRun(groups, calls)]
    with pytest.raises(KeyError, match=f"step {first} failed"):
        plan.run(inputs)
    assert waiting > on_cpu1[-1]
    # and the plan runs again afterwards
    plan.runner.run_calls = [GroupRun(groups, plan.calls)]
    assert np.isfinite(plan.run(inputs)["prob"]).all()

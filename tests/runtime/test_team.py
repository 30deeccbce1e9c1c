"""The thread team of a shared machine (runtime/team.py) and what it starts from (hostcpu.py):
the team shrinks only on sustained contention and grows back when cores are free; a smaller
team gives the same numbers, native and numpy; the usable cores honour the cgroup CPU quota."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from toolkit import hostcpu, settings
from toolkit.benchmarking import bench_plan
from toolkit.codegen import toolchain
from toolkit.frontend import Net
from toolkit.runtime import parallel, team
from toolkit.runtime.plan import Plan
from toolkit.runtime.team import Team, team_for

ROOT = Path(__file__).resolve().parents[2]


class Machine:
    """A clock, this process's run delay and the machine's runnable count, all set by the test."""

    def __init__(self):
        self.now, self.delay_ns, self.runnable = 0.0, 0, 1

    def tick(self, seconds: float, waited_share: float = 0.0, runnable: int | None = None) -> None:
        self.now += seconds
        self.delay_ns += int(seconds * waited_share * 1e9)
        if runnable is not None:
            self.runnable = runnable

    def team(self, allowed: int) -> Team:
        return Team(allowed, clock=lambda: self.now, run_delay_ns=lambda: self.delay_ns,
                    runnable=lambda: self.runnable)


def _sample(machine: Machine, t: Team, waited_share: float = 0.0, runnable: int | None = None) -> int:
    machine.tick(team.SAMPLE_INTERVAL_S, waited_share, runnable)
    return t.current()


def test_a_quiet_machine_keeps_the_whole_team():
    machine = Machine()
    t = machine.team(4)
    sizes = [_sample(machine, t, waited_share=0.01, runnable=4) for _ in range(50)]
    assert sizes == [4] * 50 and t.changes == 0


def test_one_contended_sample_is_a_blip_two_in_a_row_shrink_the_team():
    machine = Machine()
    t = machine.team(2)
    _sample(machine, t)                                            # the first sample only sets the baseline
    assert _sample(machine, t, waited_share=0.6, runnable=3) == 2  # a blip
    assert _sample(machine, t, waited_share=0.0, runnable=3) == 2  # the run resets
    assert _sample(machine, t, waited_share=0.6, runnable=3) == 2
    assert _sample(machine, t, waited_share=0.6, runnable=3) == 1  # sustained: one other job takes a core
    assert t.changes == 1


def test_the_team_shrinks_to_what_the_others_leave():
    machine = Machine()
    t = machine.team(8)
    _sample(machine, t)
    for _ in range(team.CONTENDED_SAMPLES):
        size = _sample(machine, t, waited_share=2.0, runnable=4)   # this thread and 3 others
    assert size == 5


def test_the_team_grows_back_on_the_median_of_the_recent_samples():
    machine = Machine()
    t = machine.team(2)
    _sample(machine, t)
    for _ in range(team.CONTENDED_SAMPLES):
        _sample(machine, t, waited_share=0.6, runnable=2)
    assert t.size == 1
    # the other job ends; one sample still sees it: the median waits for the majority
    runnable = [2, 1, 1, 1, 1]
    sizes = [_sample(machine, t, runnable=r) for r in runnable]
    assert sizes == [1, 1, 1, 1, 2]
    # while the other job is still there the team stays at one, however many samples
    t2 = machine.team(2)
    _sample(machine, t2)
    for _ in range(team.CONTENDED_SAMPLES):
        _sample(machine, t2, waited_share=0.6, runnable=2)
    assert [_sample(machine, t2, runnable=2) for _ in range(20)] == [1] * 20


def test_samples_are_rate_limited():
    machine = Machine()
    calls = []
    t = Team(2, clock=lambda: machine.now, run_delay_ns=lambda: calls.append(1) or 0, runnable=lambda: 1)
    for _ in range(100):
        machine.now += team.SAMPLE_INTERVAL_S / 10
        t.current()
    assert 9 <= len(calls) <= 11


def test_without_the_signals_the_team_stays_whole():
    machine = Machine()
    t = Team(2, clock=lambda: machine.now, run_delay_ns=lambda: None, runnable=lambda: None)
    for _ in range(20):
        machine.now += team.SAMPLE_INTERVAL_S
        assert t.current() == 2


def test_one_thread_or_the_switch_off_means_no_team():
    assert team_for(1) is None
    with settings.use(adaptive_threads=False):
        assert team_for(2) is None
    with settings.use(adaptive_threads=True):
        assert team_for(2) is team_for(2)           # one per process and thread count


# -- the workers and the plans: a smaller team, the same numbers --------------------------------

@pytest.mark.parametrize("size", [1, 2, 3])
def test_workers_run_every_share_whatever_the_team(size):
    workers = parallel.Workers.shared(3)
    ran, threads = [], set()
    lock = threading.Lock()

    def share(k):
        def run():
            with lock:
                ran.append(k)
                threads.add(threading.get_ident())
        return run
    workers.team = size
    try:
        workers.run([share(k) for k in range(7)])
    finally:
        workers.team = workers.n
    assert sorted(ran) == list(range(7))
    assert len(threads) <= size
    if size == 1:
        assert threads == {threading.get_ident()}     # no helper woke


class Fixed:
    def __init__(self, size):
        self.size = size

    def current(self):
        return self.size


def _train_step(native: bool, team_size: int, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setattr(parallel, "MIN_SPLIT_BYTES", 0)
    net = Net.load(str(ROOT / "zoo" / "lenet" / "net.yaml"))
    with settings.use(native=native):
        built, inputs = bench_plan(net, 8, True)
        weights = {k: np.array(built.memory.storage_of[v.value.id].external) for k, v in built.graph.weights.items()}
        plan = Plan(built.graph, built.bindings, weights, threads=2, native=native)
    plan.runner.team = Fixed(team_size)
    outs = {k: np.array(v) for k, v in plan.run(inputs).items()}
    return outs, {k: np.array(plan.memory.storage_of[v.value.id].external) for k, v in plan.graph.weights.items()}, plan


@pytest.mark.parametrize("native", [True, False])
def test_a_smaller_team_gives_the_same_train_step(native, monkeypatch):
    if native and toolchain.compiler() is None:
        pytest.skip("no C compiler on this machine (cc, gcc or clang, or $CC)")
    whole, whole_w, plan = _train_step(native, 2, monkeypatch)
    alone, alone_w, _ = _train_step(native, 1, monkeypatch)
    if native:
        assert "native" in plan.impls
    else:
        assert plan.made.split_steps > 0
    for k in whole:
        np.testing.assert_allclose(alone[k], whole[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for k in whole_w:
        np.testing.assert_allclose(alone_w[k], whole_w[k], rtol=1e-5, atol=1e-6, err_msg=k)


# -- the usable cores: affinity capped by the cgroup quota ---------------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cgroup_v2_quota_of_the_group_and_its_ancestors(tmp_path):
    root = _tree(tmp_path, {"cgroup.controllers": "cpu memory\n",
                            "pods/cpu.max": "150000 100000\n",
                            "pods/job/cpu.max": "max 100000\n"})
    assert hostcpu.cgroup_cpu_limit("0::/pods/job\n", root) == 1.5       # the parent's limit binds
    root2 = _tree(tmp_path / "b", {"cgroup.controllers": "cpu\n", "job/cpu.max": "50000 100000\n"})
    assert hostcpu.cgroup_cpu_limit("0::/job\n", root2) == 0.5
    root3 = _tree(tmp_path / "c", {"cgroup.controllers": "cpu\n", "job/cpu.max": "max 100000\n"})
    assert hostcpu.cgroup_cpu_limit("0::/job\n", root3) is None


def test_cgroup_v1_quota_and_the_hybrid_layout(tmp_path):
    root = _tree(tmp_path, {"cpu,cpuacct/batch/cpu.cfs_quota_us": "200000\n",
                            "cpu,cpuacct/batch/cpu.cfs_period_us": "100000\n",
                            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                            "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    proc = "12:memory:/batch\n4:cpu,cpuacct:/batch\n0::/batch\n"
    assert hostcpu.cgroup_cpu_limit(proc, root) == 2.0
    hybrid = _tree(tmp_path / "h", {"unified/cgroup.controllers": "\n", "unified/batch/cpu.max": "100000 100000\n"})
    assert hostcpu.cgroup_cpu_limit("0::/batch\n", hybrid) == 1.0


def test_a_container_that_mounts_its_own_group_as_the_root(tmp_path):
    # /proc/self/cgroup names the host's path, the container sees its own group at the mount
    root = _tree(tmp_path, {"cgroup.controllers": "cpu\n", "cpu.max": "100000 100000\n"})
    assert hostcpu.cgroup_cpu_limit("0::/kubepods/burstable/pod1/abc\n", root) == 1.0


def test_no_cgroups_or_garbage_means_no_limit(tmp_path):
    assert hostcpu.cgroup_cpu_limit("", tmp_path) is None
    root = _tree(tmp_path / "g", {"cgroup.controllers": "cpu\n", "job/cpu.max": "lots 0\n"})
    assert hostcpu.cgroup_cpu_limit("0::/job\n", root) is None


@pytest.mark.parametrize("limit,cores,expected", [(None, 4, 4), (1.0, 4, 1), (2.5, 4, 2), (0.5, 4, 1), (8.0, 2, 2)])
def test_usable_cores_round_the_quota_down(monkeypatch, limit, cores, expected):
    monkeypatch.setattr(hostcpu, "cgroup_cpu_limit", lambda: limit)
    monkeypatch.setattr(hostcpu, "affinity_cores", lambda: cores)
    assert hostcpu.usable_cores() == expected


def test_default_threads_follow_the_quota(monkeypatch):
    monkeypatch.setattr(parallel, "usable_cores", lambda: 1)
    with settings.use(threads=None):
        assert parallel.default_threads() == 1
    with settings.use(threads=3):
        assert parallel.default_threads() == 3


def test_the_live_signals_read_this_machine():
    runnable = hostcpu.runnable_tasks()
    assert runnable is None or runnable >= 1
    delay = hostcpu.own_run_delay_ns()
    assert delay is None or delay >= 0
    assert 1 <= hostcpu.usable_cores() <= hostcpu.affinity_cores()

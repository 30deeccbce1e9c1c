"""Host devices as core groups: a plan whose steps run on several host devices (``cpu``,
``cpu:1``, ...) gives each device a thread of its own and its share of the cores, so that two
branches placed on two devices run at the same time (``--devices cpu:0,cpu:1``: two core groups).

With N cores and D devices each device's kernels are built for N // D threads (at least one;
the generated kernels' parallel loops, one thread team per device), and each device's thread is
pinned to its own N // D cores where the system lets it. Each device runs its own steps in the
plan's order; a step waits only for the steps of other devices it must follow
(``concurrency.conflicts``: a write before a read or a write of the same bytes, a read before a
write, impure steps in order: random draws, and loops and ifs, whose bodies' plans share the
runtime's scratch), one wait per other device, the latest, as CUDA streams wait on
events (streams.py). Each device keeps its arena and the memory plan its buffer reuse: a buffer
reused within one device is reused in that device's own order, and one read by a transfer to
another device is not overwritten before the transfer has run (the transfer's read orders it).

A plan on one device never comes here: its steps run as before (``schedule``), and neither
does a plan whose devices only hand one chain of work back and forth (LeNet with ``ip1`` on
``cpu:1``: ``devices_overlap``), which loses more by its kernels' fewer threads than it could
gain, or whose second busiest device has less than ``MIN_GROUP_FLOPS`` of work, which loses
more to the handoffs. Numpy kernels
are not split by rows in a group (they run on the group's one thread; the generated kernels are
what use a group's cores), and each group borrows its own scratch (``group_share``).

The caller's thread runs the first device's steps (not pinned: its affinity is the process's
view of its cores) and helper threads the others'. An error in any device stops the others at
their next wait and is raised on the caller, the one of the earliest step in the plan's order,
as the serial plan would have raised it.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

from ..backend.devices import Device
from ..hostcpu import usable_cores
from ..ir.dims import evaluate
from ..ir.graph import Graph
from ..ops.base import get_op
from ..settings import current
from .concurrency import conflicts

CONSTANT_OPS = ("constant", "scalar")      # no step: copied to each device that reads them

# Below this much work (FLOPs a run) on the second busiest device, handing steps between two
# threads costs more than running them beside each other saves: a grouped run's start and each
# wait that sleeps cost tens of microseconds on a quiet 2-core EPYC and up to a time slice on a
# busy one. Measured there (load 4-5): LeNet's train step at batch 16 with ip1 on cpu:1 (0.8
# MFLOP on cpu:1) took 2.2 ms as two groups against 0.95 ms on one device; branchnet's infer
# step at batch 16 with a branch on cpu:1 (0.3 MFLOP there) 0.09 against 0.03 ms; the Inception
# block's towers at batch 16 (20-600 MFLOP a device) came within the rounds' spread of it.
MIN_GROUP_FLOPS = 20_000_000


def running_devices(graph: Graph, placement) -> list[Device]:
    """The devices the graph's steps run on, the default first where it runs any (constants run
    nowhere: they are copied to each device that reads them)."""
    seen: dict[Device, None] = {}
    for node in graph.nodes:
        if node.op not in CONSTANT_OPS:
            seen.setdefault(placement.node(node), None)
    return sorted(seen, key=lambda d: d != placement.default)


def devices_overlap(graph: Graph, placement, devices: list[Device]) -> bool:
    """Whether some step of one device is ordered by nothing the graph says (a value it reads,
    random draws in order, its own device's order) against some step of another: else the
    devices only hand a chain of work back and forth, and running them as groups would only
    take cores from each kernel. Vector clocks: each step's count of each device's steps it
    follows."""
    index = {d: g for g, d in enumerate(devices)}
    made: dict[int, list[int]] = {}             # value id -> its producer's clock, itself counted
    last = [[0] * len(devices) for _ in devices]    # per device, its latest step's clock
    impure = [0] * len(devices)
    clocks: list[list[list[int]]] = [[] for _ in devices]   # per device, each step's clock before it
    for node in graph.nodes:
        if node.op in CONSTANT_OPS:
            continue
        g = index[placement.node(node)]
        clock = list(last[g])
        sources = [made[v.id] for v in node.inputs if v.id in made]
        if not get_op(node.op).pure:
            sources.append(impure)
        for other in sources:
            clock = [max(a, b) for a, b in zip(clock, other)]
        clocks[g].append(clock)
        after = list(clock)
        after[g] = len(clocks[g])
        last[g] = after
        for v in node.outputs:
            made[v.id] = after
        if not get_op(node.op).pure:
            impure = after
    for g, steps in enumerate(clocks):
        for p, clock in enumerate(steps):
            for h, others in enumerate(clocks):
                # the first step of h not before this one; unordered unless it follows this one
                q = clock[h]
                if h != g and q < len(others) and others[q][g] <= p:
                    return True
    return False


def device_flops(graph: Graph, placement, bindings: Mapping[str, int]) -> dict[Device, float]:
    """The FLOPs of each device's steps in a run under ``bindings``."""
    work: dict[Device, float] = {}
    for node in graph.nodes:
        if node.op in CONSTANT_OPS:
            continue
        opdef = get_op(node.op)
        flops = 0.0
        if opdef.flops is not None:
            flops = float(evaluate(opdef.flops([v.type for v in node.inputs], [v.type for v in node.outputs],
                                               node.attrs), bindings))
        where = placement.node(node)
        work[where] = work.get(where, 0.0) + flops
    return work


def overlapping_devices(graph: Graph, placement, bindings: Mapping[str, int]) -> list[Device]:
    """The devices the graph's steps run on where two or more may run at once
    (``devices_overlap``) and the second busiest has ``MIN_GROUP_FLOPS`` of work, else the one
    they run on first (a plan on one device, a chain, or work too small to share)."""
    running = running_devices(graph, placement)
    if len(running) < 2:
        return running
    work = sorted(device_flops(graph, placement, bindings).values(), reverse=True)
    if len(work) < 2 or work[1] < MIN_GROUP_FLOPS or not devices_overlap(graph, placement, running):
        return running[:1]
    return running


def grouped_devices(running: list[Device], threads: int) -> tuple[Device, ...]:
    """The devices a plan runs as core groups: its running devices where there are two or more,
    all of the host (``host_threads``), with more than one thread to share and the
    ``device_groups`` setting on; else () and the plan runs one step after another."""
    if (len(running) < 2 or threads < 2 or not all(d.host_threads for d in running)
            or not current().device_groups):
        return ()
    return tuple(running)


def group_threads(threads: int, groups: int) -> int:
    """Each group's threads: its share of the plan's, at least one."""
    return max(1, threads // max(1, groups))


def group_share(group: int) -> int:
    """The scratch set a group's kernels borrow (``KernelContext.share``): one of its own, apart
    from the split shares (0 up) and the concurrent steps' (1 up)."""
    return -1 - group


def group_cores(groups: int, per_group: int) -> list[list[int]]:
    """Each group's cores, consecutive slices of the cores this process may run on (wrapping
    round where there are more groups than cores)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [[] for _ in range(groups)]
    cores = cores[:max(1, usable_cores())]
    out = []
    for g in range(groups):
        first = (g * per_group) % len(cores)
        out.append([cores[(first + k) % len(cores)] for k in range(min(per_group, len(cores)))])
    return out


@dataclass(frozen=True)
class GroupSchedule:
    """``devices``: one per group, the plan's default first; ``group_of``: per step, its group;
    ``order``: per group, its steps in the plan's order; ``waits``: per step, (group, count) for
    each other group whose first ``count`` steps it must follow (the latest one only);
    ``signals``: the steps some other group waits for; ``threads``: each group's threads."""

    devices: tuple[Device, ...]
    group_of: list[int]
    order: list[list[int]]
    waits: list[list[tuple[int, int]]]
    signals: frozenset[int]
    threads: int

    def cross_edges(self) -> int:
        return sum(len(w) for w in self.waits)


def group_schedule(devices: tuple[Device, ...], step_devices: list[Device], reads, writes, ordered,
                   threads: int) -> GroupSchedule:
    """The schedule of steps on ``step_devices`` (one per step) touching ``reads``/``writes``
    (scheduling.touches), ``ordered`` steps (random draws, nested plans) kept in order."""
    index = {d: g for g, d in enumerate(devices)}
    group_of = [index[d] for d in step_devices]
    order: list[list[int]] = [[] for _ in devices]
    position = []
    for s, g in enumerate(group_of):
        position.append(len(order[g]))
        order[g].append(s)
    waits: list[list[tuple[int, int]]] = []
    signals: set[int] = set()
    # per group, the count of each other group's steps it already waits for (a later wait for
    # fewer is implied: a group runs its steps in order)
    covered = [[0] * len(devices) for _ in devices]
    for s, before in enumerate(conflicts(reads, writes, ordered)):
        g = group_of[s]
        latest: dict[int, int] = {}
        for t in before:
            h = group_of[t]
            if h != g and position[t] + 1 > latest.get(h, 0):
                latest[h] = position[t] + 1
        mine = []
        for h, count in sorted(latest.items()):
            if count > covered[g][h]:
                covered[g][h] = count
                mine.append((h, count))
                signals.add(order[h][count - 1])
        waits.append(mine)
    return GroupSchedule(devices, group_of, order, waits, frozenset(signals), threads)


def group_makespan(schedule: GroupSchedule, seconds: list[float]) -> float:
    """How long the groups take to run steps of ``seconds`` each: each group's steps one after
    another, each after the other groups' steps it waits for (what the cost model predicts a
    grouped plan's run by, and scales its profiled steps to)."""
    finish = [0.0] * len(seconds)
    free = [0.0] * len(schedule.order)
    for s in range(len(seconds)):             # the plan's order puts every wait's step first
        g = schedule.group_of[s]
        start = max([free[g]] + [finish[schedule.order[h][count - 1]] for h, count in schedule.waits[s]])
        finish[s] = free[g] = start + seconds[s]
    return max(free, default=0.0)


class _Stopped(Exception):
    """Another group failed: this one stops at its next wait."""


class _Progress:
    """Steps done per group, and the first error, under one condition variable."""

    def __init__(self, groups: int):
        self.done = [0] * groups
        self.failed: list[tuple[int, BaseException]] = []
        self.cond = threading.Condition()

    def wait_for(self, group: int, count: int) -> None:
        if self.done[group] >= count:          # already there: no lock needed to know it
            return
        with self.cond:
            while self.done[group] < count and not self.failed:
                self.cond.wait()
            if self.done[group] < count:
                raise _Stopped

    def signal(self, group: int, count: int) -> None:
        with self.cond:
            self.done[group] = count
            self.cond.notify_all()

    def fail(self, step: int, error: BaseException) -> None:
        with self.cond:
            self.failed.append((step, error))
            self.cond.notify_all()


class _Helper:
    """One persistent thread running a group's steps, pinned to the group's cores."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.pinned: tuple[int, ...] | None = None
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            cores, job = self.jobs.get()
            if cores and tuple(cores) != self.pinned:
                try:
                    os.sched_setaffinity(0, cores)     # this thread only (Linux: 0 is the caller)
                except (AttributeError, OSError, ValueError):
                    pass                               # not allowed here: the scheduler places it
                self.pinned = tuple(cores)
            try:
                job()
            finally:
                self.done.put(None)


_helpers: list[_Helper] = []
_helpers_lock = threading.Lock()
# one grouped run at a time in the process: the helpers are shared, and two runs dealing jobs to
# them from two threads could each find its other group queued behind the other run's
_run_lock = threading.Lock()


def _helper_threads(n: int) -> list[_Helper]:
    """``n`` helper threads, shared by every plan of the process (plans do not run at once)."""
    with _helpers_lock:
        while len(_helpers) < n:
            _helpers.append(_Helper())
        return _helpers[:n]


class GroupRun:
    """The plan's run as one callable: each group's steps on its thread (module docstring)."""

    def __init__(self, schedule: GroupSchedule, calls: list[Callable[[], None]]):
        self.schedule = schedule
        self.cores = group_cores(len(schedule.devices), schedule.threads)
        # per group, its steps as (step, call, waits, signal count or 0)
        self.programs = []
        for steps in schedule.order:
            program = []
            for k, s in enumerate(steps):
                program.append((s, calls[s], schedule.waits[s], k + 1 if s in schedule.signals else 0))
            self.programs.append(program)
        self.helpers = _helper_threads(len(schedule.devices) - 1)

    def _run_group(self, group: int, progress: _Progress) -> None:
        step = -1
        try:
            for step, call, waits, signal in self.programs[group]:
                for other, count in waits:
                    progress.wait_for(other, count)
                call()
                if signal:
                    progress.signal(group, signal)
        except _Stopped:
            pass
        except BaseException as e:              # handed to the caller, which raises the earliest
            progress.fail(step, e)

    def __call__(self) -> None:
        progress = _Progress(len(self.programs))
        with _run_lock:
            for g, helper in enumerate(self.helpers, start=1):
                helper.jobs.put((self.cores[g], lambda g=g: self._run_group(g, progress)))
            self._run_group(0, progress)
            for helper in self.helpers:
                helper.done.get()
        if progress.failed:
            raise min(progress.failed, key=lambda item: item[0])[1]

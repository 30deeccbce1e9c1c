"""A placed graph's step time predicted from a cost model, by simulating how its nodes run.

``list_schedule(nodes, device_of, model, lanes)``: the nodes in the order given (a plan's), each
starting when its inputs are ready (their producers finished, plus a transfer's time where a
value is read on another device than it was made on and no ``transfer`` node carries it) and its
lane is free. ``lanes="device"``: one lane per device, each running one node at a time, so two
devices overlap (what a runtime that runs each device's work apart would do); ``lanes="one"``:
a single lane, every node one after another whatever its device (what a plan does today without
``TOOLKIT_CONCURRENT``: placing layers on ``cpu:1`` gives them their own arena, not their own core).

``wave_schedule(nodes, device_of, model, workers, waves)``: what a plan with
``TOOLKIT_CONCURRENT=1`` does (runtime/concurrency.py): the steps in waves, each wave's steps dealt
in turn to ``workers`` threads, each thread running its share one after another, and the waves in
order; a wave lasts as long as its longest share. ``waves``: the plan's own (``plan.schedule.waves``)
or, when not given, each node one wave past its latest producer, nodes that draw random numbers
kept in order.

``Timeline.seconds`` is the predicted step time; ``start``/``finish`` are per node, in the order
given, and ``busy`` the seconds each lane works.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..backend.devices import Device, parse_device
from ..ir.graph import Node
from ..ops.base import get_op
from .model import CostModel


@dataclass(frozen=True)
class Timeline:
    seconds: float
    start: list[float]
    finish: list[float]
    busy: dict[str, float]


def node_seconds(node: Node, device: Device, model: CostModel) -> float:
    """A node's time on its device: a ``transfer`` node's is its value's copy."""
    if node.op == "transfer":
        return model.transfer_seconds(node.inputs[0], node.attrs["src"], node.attrs["dst"])
    return model.op_seconds(node, device)


def list_schedule(nodes: Sequence[Node], device_of: Callable[[Node], Device], model: CostModel,
                  lanes: str = "device") -> Timeline:
    """The list schedule of ``nodes`` in their order (see the module's docstring)."""
    if lanes not in ("device", "one"):
        raise ValueError(f"lanes must be 'device' or 'one', not {lanes!r}")
    made_at: dict[int, tuple[float, Device]] = {}       # value id -> (ready, where it lives)
    lane_free: dict[str, float] = {}
    busy: dict[str, float] = {}
    start, finish = [], []
    for node in nodes:
        device = parse_device(device_of(node))
        lane = str(device) if lanes == "device" else "all"
        ready = 0.0
        for v in node.inputs:
            if v.id not in made_at:
                continue                                  # a graph input, a weight or a constant
            at, home = made_at[v.id]
            if home != device and node.op != "transfer":
                at += model.transfer_seconds(v, home, device)
            ready = max(ready, at)
        seconds = node_seconds(node, device, model)
        begin = max(ready, lane_free.get(lane, 0.0))
        end = begin + seconds
        lane_free[lane] = end
        busy[lane] = busy.get(lane, 0.0) + seconds
        start.append(begin)
        finish.append(end)
        for v in node.outputs:
            made_at[v.id] = (end, device)
    return Timeline(max(finish, default=0.0), start, finish, busy)


def dependency_waves(nodes: Sequence[Node]) -> list[list[int]]:
    """Each node one wave past its latest producer among ``nodes``; impure nodes (random draws)
    also one past the previous impure node, as the plan keeps them in order."""
    wave_of_value: dict[int, int] = {}
    waves: list[int] = []
    last_impure = -1
    for node in nodes:
        w = max((wave_of_value[v.id] + 1 for v in node.inputs if v.id in wave_of_value), default=0)
        if not get_op(node.op).pure:
            w = max(w, last_impure + 1)
            last_impure = w
        waves.append(w)
        for v in node.outputs:
            wave_of_value[v.id] = w
    grouped: list[list[int]] = [[] for _ in range(max(waves, default=-1) + 1)]
    for i, w in enumerate(waves):
        grouped[w].append(i)
    return grouped


def waves_seconds(grouped: list[list[int]], seconds: Sequence[float], workers: int) -> float:
    """The time of waves of steps taking ``seconds`` each on ``workers`` threads."""
    total = 0.0
    for wave in grouped:
        n = max(1, min(workers, len(wave)))
        total += max(sum(seconds[i] for i in wave[k::n]) for k in range(n))
    return total


def wave_schedule(nodes: Sequence[Node], device_of: Callable[[Node], Device], model: CostModel, workers: int,
                  waves: list[list[int]] | None = None) -> Timeline:
    """The waves of ``nodes`` on ``workers`` threads (see the module's docstring)."""
    grouped = dependency_waves(nodes) if waves is None else waves
    seconds = [node_seconds(n, parse_device(device_of(n)), model) for n in nodes]
    start, finish = [0.0] * len(nodes), [0.0] * len(nodes)
    busy: dict[str, float] = {}
    clock = 0.0
    for wave in grouped:
        n = max(1, min(workers, len(wave)))
        longest = 0.0
        for k in range(n):
            t = clock
            for i in wave[k::n]:
                start[i], t = t, t + seconds[i]
                finish[i] = t
            busy[f"thread {k}"] = busy.get(f"thread {k}", 0.0) + (t - clock)
            longest = max(longest, t - clock)
        clock += longest
    return Timeline(clock, start, finish, busy)

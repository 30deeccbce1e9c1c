"""The order a plan's calls run in: one after another, in waves of host threads (concurrency.py),
on CUDA streams (streams.py), or each host device's steps on a thread of its own
(device_groups.py). All read which bytes each step reads and writes (``touches``), so that two
steps run together only when neither touches what the other writes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops.base import get_op
from .build import PlanBuild
from .calls import Calls
from .concurrency import conflicts, wave_calls, waves
from .device_groups import GroupRun, GroupSchedule, group_schedule
from .execution import Execution
from .memory import MemoryPlan
from .streams import StreamSchedule, assign_streams, stream_calls


@dataclass(frozen=True)
class Scheduled:
    """What a run calls, in order; ``stream_schedule`` (a GPU plan's branches on streams), ``waves``
    (the host's, on threads) or ``groups`` (host devices as core groups) say how, when the plan
    runs branches side by side."""

    run_calls: list
    stream_schedule: StreamSchedule | None = None
    waves: list[list[int]] | None = None
    groups: GroupSchedule | None = None


def touches(built: PlanBuild, memory: MemoryPlan, steps) -> tuple[list, list, list]:
    """Per step, the byte regions it reads and writes, and whether it draws random numbers
    (the input of concurrency.py and streams.py)."""
    shapes, dtypes = built.shapes, built.dtypes

    def region(v):
        st = memory.storage_of[v.id]
        start = memory.offset_of.get(v.id, 0)
        n = int(np.prod(shapes[v.id], dtype=np.int64)) * np.dtype(dtypes[v.id]).itemsize
        if st.arena is not None:
            return (id(st.arena), st.offset + start, st.offset + start + n)
        return (id(st), start, start + n)
    reads = [[region(v) for v in node.inputs] for node in steps]
    writes = [[region(v) for v in node.outputs] for node in steps]
    ordered = [not get_op(node.op).pure for node in steps]
    return reads, writes, ordered


def schedule(built: PlanBuild, memory: MemoryPlan, calls: Calls, execution: Execution) -> Scheduled:
    """Streams for a GPU plan's independent branches, waves of host threads, or a thread per host
    device (core groups); else the calls as they are."""
    if execution.on_streams:
        streams = assign_streams(conflicts(*touches(built, memory, calls.steps)))
        return Scheduled(stream_calls(streams, calls.calls, built.device), stream_schedule=streams)
    if execution.concurrent:
        grouped = waves(*touches(built, memory, calls.steps))
        return Scheduled(wave_calls(grouped, calls.calls, calls.workers), waves=grouped)
    if execution.groups:
        on = [built.placement.node(node) for node in calls.steps]
        groups = group_schedule(execution.groups, on, *touches(built, memory, calls.steps),
                                threads=execution.kernel_threads)
        return Scheduled([GroupRun(groups, calls.calls)], groups=groups)
    return Scheduled(calls.run_calls)

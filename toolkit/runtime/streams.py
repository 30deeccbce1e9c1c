"""Independent branches of a GPU plan on separate CUDA streams, ordered by events.

The steps keep the plan's serial order on the host (launches are cheap; the device runs them);
what changes is which stream each launch goes to. Step s must follow step t when they touch the
same bytes in a way that matters (``concurrency.conflicts``: a write before a read or a write,
a read before a write) or both draw random numbers. ``assign_streams`` puts a step on the stream
of the step it follows when that step is still its stream's last (a chain stays on one stream),
else on a fresh stream while fewer than ``max_streams`` are in use, else on the stream idle
longest. A step waits on an event recorded after each step it follows on another stream, unless
that step is already ordered before it (vector clocks over the streams drop redundant waits).

A run starts every stream after the caller's stream (where the inputs were uploaded) with one
event, and ends with the caller's stream waiting on each stream's last event, so the caller sees
one ordered stream: the next run's uploads, the trainer's loss read, weight copies.

The stream calls go through a small backend that the device gives (``Device.stream_backend``:
CUDA's through CuPy), so that tests can put a simulator in its place, one that runs the queued
work in a random order allowed by the streams and events.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from ..backend.devices import CALL, RECORD, WAIT, Device

# Four streams cover an Inception block's towers; more only add events.
MAX_STREAMS = 4


@dataclass
class StreamSchedule:
    stream_of: list[int]                 # per step, its stream
    waits: list[list[int]]               # per step, the steps (on other streams) whose events it waits on
    streams: int                         # how many streams are used

    @property
    def recorded(self) -> set[int]:
        """Steps followed by an event (some other stream waits on them)."""
        return {t for ts in self.waits for t in ts}


def assign_streams(must_follow: list[list[int]], max_streams: int = MAX_STREAMS) -> StreamSchedule:
    """Streams and event waits for steps with the given predecessors (``conflicts``)."""
    stream_of: list[int] = []
    waits: list[list[int]] = []
    tail: list[int] = []                  # per stream, its last step
    clock_of: list[list[int]] = []        # per step, the last step of each stream ordered before it (or -1)
    for s, before in enumerate(must_follow):
        stream = None
        for t in sorted(before, reverse=True):      # continue the latest chain that ends here
            if tail[stream_of[t]] == t:
                stream = stream_of[t]
                break
        if stream is None:
            if len(tail) < max_streams:
                stream = len(tail)
                tail.append(-1)
                for clock in clock_of:
                    clock.append(-1)
            else:
                stream = min(range(len(tail)), key=lambda k: tail[k])
        clock = list(clock_of[tail[stream]]) if tail[stream] >= 0 else [-1] * len(tail)
        step_waits = []
        for t in sorted(before, reverse=True):
            k = stream_of[t]
            if k == stream or clock[k] >= t:
                continue                          # stream order, or an earlier wait, covers it
            step_waits.append(t)
            clock = [max(a, b) for a, b in zip(clock, clock_of[t])]
        clock[stream] = s
        stream_of.append(stream)
        waits.append(sorted(step_waits))
        clock_of.append(clock)
        tail[stream] = s
    return StreamSchedule(stream_of, waits, len(tail))


def _device_streams(device: Device):
    return device.stream_backend()


# Tests replace this with a simulator; a plan asks it for its device's streams when it is built.
backend_factory: Callable[[Device], object] = _device_streams


def stream_calls(schedule: StreamSchedule, calls: list[Callable[[], None]], device: Device) -> list[Callable[[], None]]:
    """The plan's run as callables: start the streams, launch each run of consecutive steps on
    one stream with its waits and events, end by joining every stream into the caller's."""
    backend = backend_factory(device)
    streams = [backend.stream() for _ in range(schedule.streams)]
    events = {t: backend.event() for t in schedule.recorded}
    start = backend.event()
    ends = [backend.event() for _ in streams]

    def begin():
        caller = backend.current()
        backend.record(start, caller)
        for stream in streams:
            backend.wait(stream, start)

    out = [begin]
    s = 0
    while s < len(calls):
        k = schedule.stream_of[s]
        actions: list[tuple[str, object]] = []
        while s < len(calls) and schedule.stream_of[s] == k:
            actions += [(WAIT, events[t]) for t in schedule.waits[s]]
            actions.append((CALL, calls[s]))
            if s in events:
                actions.append((RECORD, events[s]))
            s += 1
        out.append(functools.partial(backend.run_on, streams[k], actions))

    def join():
        caller = backend.current()
        for stream, end in zip(streams, ends):
            backend.record(end, stream)
            backend.wait(caller, end)
        backend.finish(caller)

    out.append(join)
    return out

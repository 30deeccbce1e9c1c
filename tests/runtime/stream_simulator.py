"""A stand-in for CUDA streams (runtime/streams.py's backend): work given to a stream is queued,
not run, and the queues are drained when the caller's stream is finished, in a random order that
keeps only what CUDA promises: each stream's own order, and a wait that holds its stream until the
event's latest record (at the time of the wait) has run. A schedule missing an ordering then runs
a step before the one it depends on in some orders, and gives wrong values."""
from __future__ import annotations

from collections import deque

import numpy as np

from toolkit.backend.devices import CALL, RECORD, WAIT


class Event:
    def __init__(self):
        self.recorded = 0                  # records queued so far
        self.reached = 0                   # records that have run


class SimulatedStreams:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.caller = deque()
        self.queues = [self.caller]
        self.ran = 0

    def stream(self):
        queue = deque()
        self.queues.append(queue)
        return queue

    def event(self):
        return Event()

    def current(self):
        return self.caller

    def record(self, event, stream) -> None:
        event.recorded += 1
        stream.append((RECORD, (event, event.recorded)))

    def wait(self, stream, event) -> None:
        stream.append((WAIT, (event, event.recorded)))

    def run_on(self, stream, actions) -> None:
        for kind, item in actions:
            if kind == CALL:
                stream.append((CALL, item))
            elif kind == WAIT:
                self.wait(stream, item)
            else:
                self.record(item, stream)

    def finish(self, stream) -> None:
        """Run every queue to its end, choosing at random among the queues that may go on."""
        while any(self.queues):
            ready = [q for q in self.queues if q and not (q[0][0] == WAIT and q[0][1][0].reached < q[0][1][1])]
            assert ready, "deadlock: every queue waits on an event that is never recorded"
            queue = ready[self.rng.integers(len(ready))]
            kind, item = queue.popleft()
            if kind == CALL:
                item()
                self.ran += 1
            elif kind == RECORD:
                event, number = item
                event.reached = max(event.reached, number)

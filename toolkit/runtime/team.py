"""How many of its threads a plan uses for the next run: every thread the process may use while
the machine is quiet, fewer while other work wants the same cores.

Why: a plan's threads meet at a barrier after every parallel loop, so one thread the scheduler
parks (beside a busy process, or a second job) stalls the others for a whole time slice. On a
2-core machine beside one busy process, LeNet's batch-64 forward took 1.8x as long with two
threads as with one; a second training doubled each one's step time. No OpenMP setting changed
that (README, "Threads on a shared machine"): the only cure is fewer threads while the cores are
taken, and all of them again once they are free.

Two signals, sampled at most every ``SAMPLE_INTERVAL_S`` of wall time (a few tens of
microseconds each, so a plan that runs every 50 microseconds does not pay them every run):
- while the team is whole: the time this process's threads spent ready to run but waiting for a
  core (schedstat's run delay). Above ``CONTENDED_SHARE`` of the wall time in
  ``CONTENDED_SAMPLES`` samples in a row, others are taking the cores and the team shrinks to
  what the others leave.
- while the team is smaller: the machine's runnable tasks (/proc/loadavg), less this thread.
  Once the median of the last ``RECOVER_SAMPLES`` says cores are free, the team grows again.
  Its own helpers are not counted: a shrunken team's helpers sleep.

``TOOLKIT_ADAPTIVE_THREADS=0`` pins the team at the plan's thread count (for measurements that
want it fixed).
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from typing import Callable

from ..hostcpu import own_run_delay_ns, runnable_tasks
from ..settings import current

SAMPLE_INTERVAL_S = 0.01
# Our threads together waited for a core this share of the wall time: on a quiet 2-core machine
# the figure stays under 0.02; beside one busy process two threads wait about 0.6.
CONTENDED_SHARE = 0.15
# ... in this many samples in a row: a blip (another process's few milliseconds) costs the whole
# team less than running on one thread until the next samples say the cores are free again
CONTENDED_SAMPLES = 2
RECOVER_SAMPLES = 5


def adaptive() -> bool:
    """The ``adaptive_threads`` setting (``TOOLKIT_ADAPTIVE_THREADS``)."""
    return current().adaptive_threads


class Team:
    """The team size for a process whose plans may use ``allowed`` threads."""

    def __init__(self, allowed: int, clock: Callable[[], float] = time.perf_counter,
                 run_delay_ns: Callable[[], int | None] = own_run_delay_ns,
                 runnable: Callable[[], int | None] = runnable_tasks):
        self.allowed = max(1, allowed)
        self.size = self.allowed
        self._clock, self._run_delay_ns, self._runnable = clock, run_delay_ns, runnable
        self._next = 0.0
        self._last: tuple[float, int] | None = None
        self._others: deque[int] = deque(maxlen=RECOVER_SAMPLES)
        self._contended = 0
        self._lock = threading.Lock()
        self.changes = 0                     # how often the size moved (read by tests and `bench`)

    def current(self) -> int:
        """The team size for a run starting now."""
        if self.allowed > 1:
            now = self._clock()
            if now >= self._next and self._lock.acquire(blocking=False):
                try:
                    self._next = now + SAMPLE_INTERVAL_S
                    self._sample(now)
                finally:
                    self._lock.release()
        return self.size

    def _sample(self, now: float) -> None:
        delay = self._run_delay_ns()
        last, self._last = self._last, (now, delay) if delay is not None else None
        if self.size == self.allowed:
            if last is None or delay is None or now <= last[0]:
                return
            share = (delay - last[1]) * 1e-9 / (now - last[0])
            self._contended = self._contended + 1 if share > CONTENDED_SHARE else 0
            if self._contended >= CONTENDED_SAMPLES:
                others = self._others_now()
                self._resize(self.allowed - max(1, others if others is not None else 1))
            return
        others = self._others_now()
        if others is None:
            return
        self._others.append(others)
        if len(self._others) == self._others.maxlen:
            self._resize(self.allowed - int(statistics.median(self._others)))

    def _others_now(self) -> int | None:
        running = self._runnable()
        return None if running is None else max(0, running - 1)

    def _resize(self, size: int) -> None:
        size = min(self.allowed, max(1, size))
        if size != self.size:
            self.size = size
            self.changes += 1
            self._others.clear()            # a fresh look at the others from this size on
            self._last = None
            self._contended = 0


_shared: dict[int, Team] = {}
_shared_lock = threading.Lock()


def team_for(allowed: int) -> Team | None:
    """The process's team for plans of ``allowed`` threads; None when there is nothing to adapt
    (one thread, or adaptation switched off)."""
    if allowed <= 1 or not adaptive():
        return None
    with _shared_lock:
        if allowed not in _shared:
            _shared[allowed] = Team(allowed)
        return _shared[allowed]

"""Inter-op concurrency on the CPU: independent branches of a plan (an Inception block's four
towers) run at the same time, one per core, each kernel on one thread.

A plan's steps are in a serial order its memory plan relies on: a buffer freed by one value is
reused by a later one. So steps may run together only when neither reads or writes memory the
other writes, counting every byte range a step touches (its inputs and outputs, where they live
in their arenas), not only the values it consumes. Each step gets the earliest wave after every
step it conflicts with; a wave's steps run on the worker threads, the waves in order. Steps that
draw random numbers keep their serial order, so a seed gives the same masks either way.

This is the other way to use the cores than splitting one op's batch (parallel.py); a plan does
one or the other. Which is faster depends on the net and the batch: see the ``concurrent``
setting (toolkit/settings.py).
"""
from __future__ import annotations

from typing import Callable

from ..settings import current


def concurrent_default() -> bool:
    """The ``concurrent`` setting (``TOOLKIT_CONCURRENT``): off by default, by measurement (its
    entry in toolkit/settings.py says which)."""
    return current().concurrent


Region = tuple[int, int, int]          # (memory block id, first byte, end byte)


def _overlap(a: list[Region], b: list[Region]) -> bool:
    for block, start, end in a:
        for block2, start2, end2 in b:
            if block == block2 and start < end2 and start2 < end:
                return True
    return False


def conflicts(reads: list[list[Region]], writes: list[list[Region]], ordered: list[bool]) -> list[list[int]]:
    """For each step, the earlier steps it must follow: those that write what it reads or writes,
    or read what it writes; each ``ordered`` step also follows the previous one."""
    before: list[list[int]] = []
    last_ordered = -1
    for s in range(len(reads)):
        must = [t for t in range(s)
                if (_overlap(writes[t], reads[s]) or _overlap(writes[t], writes[s])
                    or _overlap(reads[t], writes[s]))]
        if ordered[s]:
            if last_ordered >= 0 and last_ordered not in must:
                must.append(last_ordered)
            last_ordered = s
        before.append(sorted(must))
    return before


def waves(reads: list[list[Region]], writes: list[list[Region]], ordered: list[bool]) -> list[list[int]]:
    """Step indices grouped into waves: a step's wave is one past the latest wave of the steps
    it must follow (``conflicts``)."""
    wave_of: list[int] = []
    for must in conflicts(reads, writes, ordered):
        wave_of.append(max((wave_of[t] + 1 for t in must), default=0))
    grouped: list[list[int]] = [[] for _ in range(max(wave_of, default=-1) + 1)]
    for s, w in enumerate(wave_of):
        grouped[w].append(s)
    return grouped


def wave_calls(grouped: list[list[int]], calls: list[Callable[[], None]], workers) -> list[Callable[[], None]]:
    """One callable per wave: a lone step runs as it is; several are dealt to the workers (in
    turn, one share per thread), and the wave returns when all are done."""
    out = []
    for wave in grouped:
        if len(wave) == 1:
            out.append(calls[wave[0]])
            continue
        n = min(workers.n, len(wave))
        shares = [[calls[s] for s in wave[k::n]] for k in range(n)]
        out.append(_Wave(workers, [_Sequence(share) for share in shares]))
    return out


class _Sequence:
    def __init__(self, calls):
        self.calls = calls

    def __call__(self):
        for call in self.calls:
            call()


class _Wave:
    def __init__(self, workers, shares):
        self.workers, self.shares = workers, shares

    def __call__(self):
        self.workers.run(self.shares)

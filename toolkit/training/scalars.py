"""The per-step scalars a trainer logs (the objective and each loss top), read without a
device synchronisation every step.

On the CPU they are plain floats at once. On a GPU, reading a value back to the host waits for
everything queued before it, which would serialise the host's step launches with the device's
work; so each step's scalars are copied, on the device, into a ring of rows, and the host reads
all pending rows in one copy when it needs them: at a log line, a checkpoint, a stop or when the
ring is full. That is one synchronisation per display interval. A non-finite loss is then found
up to that many steps late; no checkpoint is written before it is looked at.
"""
from __future__ import annotations

import numpy as np

from ..backend.devices import Device, to_host


class StepScalars:
    def __init__(self, names: list[str], device: Device, capacity: int):
        self.names = list(names)
        self.deferred = not device.host_memory        # reading a value back waits for the device
        self.pending: list[int] = []              # iterations whose rows are not read yet
        self.ready: list[tuple[int, dict[str, float]]] = []
        if self.deferred:
            with device.use():
                self.ring = device.xp.empty((max(1, capacity), len(self.names)), np.float64)

    def add(self, iteration: int, outs) -> None:
        if not self.deferred:
            self.ready.append((iteration, {n: float(outs[n]) for n in self.names}))
            return
        row = self.ring[len(self.pending)]
        for col, name in enumerate(self.names):
            row[col] = outs[name]                 # a device-to-device copy, queued
        self.pending.append(iteration)

    def full(self) -> bool:
        return self.deferred and len(self.pending) == len(self.ring)

    def drain(self) -> list[tuple[int, dict[str, float]]]:
        """Every step's scalars not yet returned, oldest first (one device read for all)."""
        if self.pending:
            rows = to_host(self.ring[:len(self.pending)])
            self.ready += [(i, dict(zip(self.names, map(float, row)))) for i, row in zip(self.pending, rows)]
            self.pending = []
        out, self.ready = self.ready, []
        return out

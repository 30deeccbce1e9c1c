"""The dynamic batcher: requests that arrive within ``max_delay`` of the oldest waiting one are
run together as one batch.

The policy, so that it can be predicted: requests wait in arrival order. A batch is the oldest
request and those after it with the same shape (but the batch dimension) and dtypes, up to
``max_rows`` rows (the largest bucket). It closes when it holds ``max_rows`` rows or when its
oldest request has waited ``max_delay``, whichever comes first, and then runs on the smallest
bucket that holds it (the session pads and slices back). One batch runs at a time, in a worker
thread, so the event loop keeps accepting; what arrives meanwhile forms the next batch. A
request of more rows than ``max_rows`` runs alone (the session cuts it into chunks). More than
``max_queue`` waiting requests: the next one is refused at once (QueueFull, HTTP 503).

With buckets over a sequence length (``prepare``), a request is first padded up to its bucket,
with its lengths: requests of different lengths in one bucket then share a batch, and each one's
outputs are cut back to its own length.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np


class QueueFull(Exception):
    pass


@dataclass(eq=False)          # compared by identity: a request is itself, whatever it holds
class _Waiting:
    arrays: dict[str, np.ndarray]
    rows: int
    signature: tuple
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)
    cut: Callable[[dict], dict] | None = None     # its outputs back to its own lengths


def signature(arrays: dict[str, np.ndarray]) -> tuple:
    """What must agree for requests to share a batch: names, dtypes, shapes but the first axis."""
    return tuple(sorted((k, a.dtype.str, a.shape[1:]) for k, a in arrays.items()))


class DynamicBatcher:
    def __init__(self, run_batch: Callable[[dict], dict], max_rows: int, max_delay_s: float, max_queue: int,
                 metrics=None, prepare: Callable[[dict], tuple[dict, Callable]] | None = None):
        self.run_batch = run_batch
        self.prepare = prepare
        self.max_rows = max_rows
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self.metrics = metrics
        self.waiting: deque[_Waiting] = deque()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="toolkit-batch")
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """After the server has answered what it accepted: nothing waits any more."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for item in self.waiting:
            if not item.future.done():
                item.future.set_exception(RuntimeError("the server is shutting down"))
        self.waiting.clear()
        self.executor.shutdown(wait=True)

    async def submit(self, arrays: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        if len(self.waiting) >= self.max_queue:
            raise QueueFull(f"the queue is full ({self.max_queue} requests waiting); retry later")
        cut = None
        if self.prepare is not None:
            arrays, cut = self.prepare(arrays)
        item = _Waiting(arrays, rows, signature(arrays), asyncio.get_running_loop().create_future(), cut=cut)
        self.waiting.append(item)
        self._depth()
        self._wake.set()
        return await item.future

    def _depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self.waiting))

    def _ready(self) -> list[_Waiting] | None:
        """The batch to run now, or None if the oldest request may still wait for company."""
        first = self.waiting[0]
        batch, rows, crowded = [], 0, False
        for item in self.waiting:
            if item.signature != first.signature:
                continue
            if batch and rows + item.rows > self.max_rows:
                crowded = True                # a request waits that this batch has no room for
                continue
            batch.append(item)
            rows += item.rows
            if rows >= self.max_rows:
                break
        if crowded or rows >= self.max_rows or time.monotonic() - first.arrived >= self.max_delay_s:
            return batch
        return None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._ready()
            if batch is None:
                self._wake.clear()
                left = self.max_delay_s - (time.monotonic() - self.waiting[0].arrived)
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(left, 0.0))
                except asyncio.TimeoutError:
                    pass
                continue
            for item in batch:
                self.waiting.remove(item)
            self._depth()
            batch = [item for item in batch if not item.future.cancelled()]   # the client went away
            if not batch:
                continue
            await self._run(loop, batch)

    async def _run(self, loop, batch: list[_Waiting]) -> None:
        if len(batch) == 1:
            arrays = batch[0].arrays
        else:
            arrays = {k: np.concatenate([item.arrays[k] for item in batch]) for k in batch[0].arrays}
        if self.metrics is not None:
            self.metrics.batch_rows.observe(sum(item.rows for item in batch))
            self.metrics.batch_requests.observe(len(batch))
        started = time.monotonic()
        try:
            outputs = await loop.run_in_executor(self.executor, self.run_batch, arrays)
            if self.metrics is not None:
                self.metrics.triton.batch(sum(item.rows for item in batch), [started - item.arrived for item in batch],
                                          time.monotonic() - started)
        except Exception as e:                    # the same error for every request of the batch
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(e)
            return
        start = 0
        for item in batch:
            if not item.future.done():
                mine = {k: v[start: start + item.rows] for k, v in outputs.items()} if len(batch) > 1 else outputs
                item.future.set_result(item.cut(mine) if item.cut is not None else mine)
            start += item.rows

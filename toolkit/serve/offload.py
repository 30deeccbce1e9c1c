"""Large JSON bodies decoded and encoded in worker processes, so that the event loop keeps serving:
json's C parser holds the GIL for a whole parse (1.3 s for 54 MB), so a thread would stall it too."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..hostcpu import usable_cores

# A JSON part up to this size is decoded on the event loop (about 1.5 ms), and a response of up to
# this many JSON values encoded there (about 3.5 ms): below that a trip to a worker costs more.
INLINE_JSON_BYTES = 64 * 1024
INLINE_JSON_VALUES = 4096


class WorkerDied(Exception):
    pass


def _start_worker(server_pid: int) -> None:
    # Ctrl-C reaches the whole process group; the server stops its workers itself when it stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # and if it is killed, nothing tells them (each holds its task queue's both ends): look
    threading.Thread(target=_exit_with, args=(server_pid,), daemon=True).start()


def _exit_with(server_pid: int) -> None:
    while os.getppid() == server_pid:
        time.sleep(1)
    os._exit(0)


def worker_count() -> int:
    """Half the cores this process may use (at least 1, at most 4): the batcher's inference and
    the event loop keep the rest."""
    return max(1, min(4, usable_cores() // 2))


class Offload:
    """A process pool started on first use (a server that never sees a large JSON body never
    starts one) and started afresh if a worker dies."""

    def __init__(self, workers: int):
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None

    async def run(self, fn, *args):
        if self.pool is None:
            # spawn, not fork: the server process runs threads (the batcher's, uvloop's)
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_start_worker, initargs=(os.getpid(),))
        pool = self.pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool:
            if self.pool is pool:
                self.pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise WorkerDied("a worker process decoding or encoding JSON died (out of memory?)") from None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

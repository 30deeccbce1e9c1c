"""The communicator the collective ops run on: MPI through mpi4py for a job of several ranks,
or the one-rank identity (``Solo``) everywhere else, so that a data-parallel graph also runs in a
single process (and in the reference interpreter) with the same results.

Every rank runs the same plan, so every rank issues the same collectives in the same order, as
MPI requires; the non-blocking all-reduce of a gradient bucket is started by one op and waited
for by another (``bucket`` keys the pending request between the two).
"""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np


class Solo:
    """One rank: every collective is the identity."""

    rank, size = 0, 1
    # a rank process of a job that a launcher started and signals, rank by rank (a Ctrl-C to
    # mpiexec reaches every rank, each at its own moment)
    launched = False

    def __init__(self):
        self.pending: dict[int, np.ndarray] = {}
        self.waited_s = 0.0                 # time blocked on collectives, all of them (statistics)
        self.gradient_wait_s = 0.0          # of which: waiting for gradient buckets' sums
        self.mailbox: dict[int, np.ndarray] = {}   # sent and not yet received, by tag (one process)

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        """The sum over ranks of ``array`` (same shape on every rank), as a new array."""
        return np.array(array, copy=True)

    def start_allreduce(self, bucket: int, flat: np.ndarray, out: np.ndarray | None = None) -> None:
        """Starts the sum of ``flat`` into ``out`` (a new array when None); neither may be
        touched until ``wait_allreduce(bucket)`` has returned ``out``."""
        if out is None:
            out = np.empty_like(flat)
        np.copyto(out, flat)
        self.pending[bucket] = out

    def wait_allreduce(self, bucket: int) -> np.ndarray:
        return self.pending.pop(bucket)

    def sum_floats(self, values: list[float]) -> list[float]:
        return list(values)

    # point-to-point, between the stages of a pipeline (ops/p2p.py). One process holds every
    # stage: a send leaves its array in a mailbox under its tag, the receive takes it out
    def send(self, peer: int, tag: int, array: np.ndarray) -> None:
        """Sends ``array`` to rank ``peer`` without waiting for it to arrive; the array must not
        change until ``finish_sends`` (or the next send under ``tag``) has returned."""
        self.mailbox[tag] = array

    def finish_send(self, tag: int) -> None:
        """Waits until the last send under ``tag`` has left its array (before it is reused)."""

    def finish_sends(self) -> None:
        """Waits until every send has left its array."""

    def recv(self, peer: int, tag: int, out: np.ndarray | None = None) -> np.ndarray:
        """The array rank ``peer`` sent under ``tag`` (into ``out`` when given), blocking."""
        array = self.mailbox.pop(tag)
        if out is None:
            return array
        np.copyto(out, array)
        return out

    def largest(self, value: int) -> int:
        """The largest of the ranks' ``value`` (every rank gets the same answer)."""
        return value

    def broadcast(self, array: np.ndarray) -> None:
        pass

    def share(self, value):
        """Rank 0's ``value`` (any picklable object), on every rank: what rank 0 alone decides."""
        return value

    def pids(self) -> list[int]:
        """Each rank's process id, by rank."""
        return [os.getpid()]

    def gather_all(self, value) -> list:
        """Every rank's ``value`` (any picklable object), by rank, on every rank."""
        return [value]

    def local_rank(self) -> int:
        """This rank's number among the ranks on its machine (which GPU it takes)."""
        return 0

    # the GPU sums of this rank (distributed/nccl.py's DeviceSums) when NCCL runs, else None:
    # the GPU's collective kernels then stage through host memory
    device_sums = None

    def abort(self, code: int) -> None:
        raise SystemExit(code)


class MpiCommunicator(Solo):
    """MPI_COMM_WORLD through mpi4py (or ``comm``, a part of it: ``split``). ``yielding``: its
    sums wait giving the core away between polls (``_wait_yielding``), as a receive always does."""

    launched = True

    def __init__(self, comm=None, yielding: bool = False):
        super().__init__()
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.yielding = yielding
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._requests: dict[int, tuple] = {}
        self._sends: dict[int, tuple] = {}       # tag -> (request, the array it sends)

    def _blocked(self, call):
        start = time.perf_counter()
        result = call()
        self.waited_s += time.perf_counter() - start
        return result

    def allreduce(self, array: np.ndarray) -> np.ndarray:
        send = np.ascontiguousarray(array)
        out = np.empty_like(send)
        if self.yielding:
            request = self.comm.Iallreduce(send, out, op=self.MPI.SUM)
            self._blocked(lambda: _wait_yielding(request))
        else:
            self._blocked(lambda: self.comm.Allreduce(send, out, op=self.MPI.SUM))
        return out

    def start_allreduce(self, bucket: int, flat: np.ndarray, out: np.ndarray | None = None) -> None:
        if out is None:
            out = np.empty_like(flat)
        self._requests[bucket] = (self.comm.Iallreduce(flat, out, op=self.MPI.SUM), flat, out)

    def wait_allreduce(self, bucket: int) -> np.ndarray:
        request, _, out = self._requests.pop(bucket)    # the send buffer lives until here
        start = time.perf_counter()
        if self.yielding:
            _wait_yielding(request)
        else:
            request.Wait()
        waited = time.perf_counter() - start
        self.waited_s += waited
        self.gradient_wait_s += waited
        return out

    def send(self, peer: int, tag: int, array: np.ndarray) -> None:
        self.finish_send(tag)
        self._sends[tag] = (self.comm.Isend(array, dest=peer, tag=tag), array)

    def finish_send(self, tag: int) -> None:
        pending = self._sends.pop(tag, None)
        if pending is not None:
            self._blocked(pending[0].Wait)

    def finish_sends(self) -> None:
        for tag in list(self._sends):
            self.finish_send(tag)

    def recv(self, peer: int, tag: int, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            raise RuntimeError("the reference interpreter runs send and recv in one process only")
        request = self.comm.Irecv(out, source=peer, tag=tag)
        try:
            self._blocked(lambda: _wait_yielding(request))
        except self.MPI.Exception:
            # the sender died mid-message: its supervisor names it and the launcher then stops
            # the job; failing at once would stop it first, naming this rank instead
            time.sleep(_PEER_DEATH_GRACE_S)
            raise
        return out

    def sum_floats(self, values: list[float]) -> list[float]:
        return [float(v) for v in self.allreduce(np.asarray(values, dtype=np.float64))]

    def largest(self, value: int) -> int:
        return int(self._blocked(lambda: self.comm.allreduce(int(value), op=self.MPI.MAX)))

    def broadcast(self, array: np.ndarray) -> None:
        self._blocked(lambda: self.comm.Bcast(array, root=0))

    def share(self, value):
        return self._blocked(lambda: self.comm.bcast(value, root=0))

    def pids(self) -> list[int]:
        return self.comm.allgather(os.getpid())

    def gather_all(self, value) -> list:
        return self._blocked(lambda: self.comm.allgather(value))

    def local_rank(self) -> int:
        # the ranks that share this machine's memory are the ranks on this machine
        local = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED)
        try:
            return local.Get_rank()
        finally:
            local.Free()

    def abort(self, code: int) -> None:
        self.comm.Abort(code)

    def split(self, color: int, key: int, yielding: bool = False) -> "MpiCommunicator":
        """The ranks of the same ``color``, numbered by ``key``, as a communicator of their own
        (every rank must call it at the same point)."""
        return MpiCommunicator(self.comm.Split(color, key), yielding)


# how long a rank whose receive failed waits for the job to be stopped for the dead sender
_PEER_DEATH_GRACE_S = 10.0


def _wait_yielding(request, pause_s: float = 50e-6) -> None:
    """Waits for ``request`` while giving the core away between polls: MPI's own wait spins,
    and a pipeline stage waiting for its neighbour would take the core the neighbour (on a
    machine of few cores) needs to send what it waits for."""
    while not request.Test():
        time.sleep(pause_s)


_current: Solo = Solo()


def current() -> Solo:
    """The communicator collective kernels use now."""
    return _current


@contextlib.contextmanager
def use(comm: Solo):
    global _current
    previous, _current = _current, comm
    try:
        yield comm
    finally:
        _current = previous

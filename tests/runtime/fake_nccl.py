"""A host stand-in for CuPy's NCCL binding (``cupy.cuda.nccl``) and for the CUDA streams and events
around it, for the numpy stand-in for CuPy (gpu_stand_in.py), so that data-parallel training's
GPU path runs under ``mpiexec`` on machines with no GPU.

``NcclCommunicator.allReduce`` sums host arrays over the ranks through MPI (mpi4py, a duplicate
of the world communicator), and refuses, on every rank at once (``NcclStandInError``), what a
real communicator would hang on or get wrong:

- a communicator not made from rank 0's unique id, broadcast, with the MPI rank and size;
- ranks whose calls differ in order, element count, element type or operation (every call's
  description is gathered from every rank and compared);
- a call on stream 0, on the compute stream (the current one), or on a stream that has not
  waited for an event recorded on the compute stream (it could run before the values exist).

And the sum is not there before its wait: the call fills the result with NaN (or -1 for
integers) and writes the sum only once an event recorded on the NCCL stream after the call is
waited on or synchronized, as a real device's result may not be there before. A kernel that
reads the bucket before its wait reads NaN.

``install(fake_cupy, devices)`` adds the binding, streams, events and ``devices`` GPUs (each its
own PCI address, so NCCL's one rank per GPU holds) to the numpy stand-in.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import time

import numpy as np

_TYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64, 6: np.float16,
          7: np.float32, 8: np.float64}


class NcclStandInError(AssertionError):
    """What a real NCCL communicator would not allow (every rank raises it together)."""


# -- streams and events ------------------------------------------------------------------------
class Stream:
    _ptrs = itertools.count(0x7000)
    by_ptr: dict[int, "Stream"] = {}
    _current: list["Stream"] = []

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int | None = None):
        self.ptr = 0 if null else next(Stream._ptrs)
        self.queued: list = []               # sums run on this stream whose results are not written yet
        self.last_wait: Event | None = None
        Stream.by_ptr[self.ptr] = self

    def __enter__(self):
        Stream._current.append(self)
        return self

    def __exit__(self, *exc):
        Stream._current.pop()
        return False

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event) -> None:
        event.complete()
        self.last_wait = event

    def synchronize(self) -> None:
        for deliver in self.queued:
            deliver()


NULL_STREAM = Stream(null=True)


def get_current_stream() -> Stream:
    return Stream._current[-1] if Stream._current else NULL_STREAM


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.stream: Stream | None = None
        self.deliveries: list = []

    def record(self, stream=None) -> None:
        self.time = time.perf_counter()                # the stand-in runs its work as it is queued
        self.stream = stream or get_current_stream()
        self.deliveries = list(self.stream.queued)     # the work queued on it so far

    def complete(self) -> None:
        for deliver in self.deliveries:
            deliver()

    def synchronize(self) -> None:
        self.complete()


# -- the NCCL binding ------------------------------------------------------------------------------
class NcclBinding:
    """What toolkit/distributed/nccl.py uses of ``cupy.cuda.nccl``."""

    available = True
    NCCL_SUM = 0
    NCCL_FLOAT32 = 7
    NcclStandInError = NcclStandInError

    def __init__(self):
        self.issued: list[tuple] = []              # the unique ids this process made

    def get_version(self) -> int:
        return 22703

    def get_unique_id(self) -> tuple:
        uid = tuple(os.urandom(128))
        self.issued.append(uid)
        return uid

    def NcclCommunicator(self, ndev: int, commId, rank: int):       # noqa: N802 (CuPy's name)
        return Communicator(self, ndev, commId, rank)


class Communicator:
    def __init__(self, binding: NcclBinding, ndev: int, uid, rank: int):
        from mpi4py import MPI
        self.MPI = MPI
        self.mpi = MPI.COMM_WORLD.Dup()
        self.calls = 0
        mine = (int(ndev), int(rank), tuple(uid), tuple(uid) in binding.issued)
        every = self.mpi.allgather(mine)
        problems = []
        if every[0][3] is False:
            problems.append("the unique id is not one rank 0 made (nccl.get_unique_id on rank 0)")
        if len({e[2] for e in every}) != 1:
            problems.append("the ranks passed different unique ids (rank 0's must be broadcast)")
        for r, (n, claimed, _, _) in enumerate(every):
            if n != self.mpi.Get_size() or claimed != r:
                problems.append(f"MPI rank {r} made its communicator as rank {claimed} of {n}, "
                                f"not rank {r} of {self.mpi.Get_size()}")
        if problems:
            raise NcclStandInError("NCCL stand-in: " + "; ".join(problems))
        self.rank, self.size = int(rank), int(ndev)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int) -> None:  # noqa: N802
        compute = get_current_stream()
        problem = None
        if stream == 0:
            problem = "on stream 0 (the plan gives the sums a stream of their own)"
        elif stream == compute.ptr:
            problem = "on the compute stream (the plan gives the sums a stream of their own)"
        elif stream not in Stream.by_ptr:
            problem = f"on stream {stream:#x}, which no one made"
        else:
            waited = Stream.by_ptr[stream].last_wait
            if waited is None or waited.stream is not compute:
                problem = "on a stream that did not first wait for an event of the compute stream"
        call = (self.calls, "allReduce", int(count), int(datatype), int(op))
        self.calls += 1
        every = self.mpi.allgather((call, problem))
        for r, (theirs, trouble) in enumerate(every):
            if trouble:
                raise NcclStandInError(f"NCCL stand-in: rank {r}'s call {theirs[0]} is {trouble}")
        if len({theirs for theirs, _ in every}) != 1:
            described = "; ".join(f"rank {r}: {theirs[1]}(count {theirs[2]}, type {theirs[3]}, op {theirs[4]})"
                                  for r, (theirs, _) in enumerate(every))
            raise NcclStandInError(f"NCCL stand-in: call {call[0]} differs between the ranks: {described}")
        dtype = np.dtype(_TYPES[datatype])
        send = _view(sendbuf, count, dtype)
        recv = _view(recvbuf, count, dtype)
        total = np.empty_like(send)
        self.mpi.Allreduce(np.ascontiguousarray(send), total, op=self.MPI.SUM)
        recv[...] = np.nan if dtype.kind == "f" else -1          # not there until the wait
        done = []

        def deliver():
            if not done:
                np.copyto(recv, total)
                done.append(True)
        Stream.by_ptr[stream].queued.append(deliver)


def _view(address: int, count: int, dtype: np.dtype) -> np.ndarray:
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype, count=count)


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events, as CuPy gives them."""
    return (end.time - start.time) * 1e3


class _Device:
    def __init__(self, index: int = 0):
        self.id = index
        self.pci_bus_id = f"0000:{index + 1:02x}:00.0"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self) -> None:
        pass

    def use(self) -> None:
        _Device.current = self.id


def install(fake_cupy, devices: int, nccl: bool = True) -> None:
    """Streams, events and ``devices`` GPUs for the numpy stand-in; the NCCL binding too unless
    ``nccl`` is False (a CuPy built without it)."""
    cuda = fake_cupy.cuda
    cuda.Stream, cuda.Event, cuda.get_current_stream, cuda.Device = Stream, Event, get_current_stream, _Device
    cuda.get_elapsed_time = get_elapsed_time
    cuda.runtime.getDeviceCount = lambda: devices
    if nccl:
        cuda.nccl = NcclBinding()

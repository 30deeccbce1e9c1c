"""Sums over the ranks of a data-parallel job on GPUs, in device memory, by NCCL through CuPy
(``cupy.cuda.nccl``): one GPU per rank, one NCCL communicator per job, bootstrapped over the MPI
communicator that already exists (rank 0 makes the unique id and broadcasts it).

Every sum runs on a stream of its own (``DeviceSums.stream``), ordered with the stream the plan
runs its kernels on (the compute stream) by events: a sum starts after an event recorded on the
compute stream, runs ncclAllReduce in place on its buffer, and records an event that the compute
stream waits on before anything reads the buffer. No copy goes through the host, and the calls
are all stream operations, which CUDA stream capture follows (the NCCL stream joins a capture by
waiting on the capturing stream's event), so a captured plan records the sums too where NCCL
allows it (2.9 and later).

Where NCCL cannot run (CuPy without NCCL, two ranks on one GPU, a communicator that fails to
start) ``start_device_sums`` says why in one line, and the collective kernels stage through host
memory over MPI instead (kernels/gpu/collective.py). Every rank takes the same decision.
"""
from __future__ import annotations

import importlib
import socket

# NCCL 2.9 is the first whose collectives may be captured in a CUDA graph
CAPTURE_VERSION = 2900

# NCCL's element types (ncclDataType_t), by numpy's name: the numbers are NCCL's own
_NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
               "float32": 7, "float64": 8}
_NCCL_SUM = 0


def nccl_module(cp):
    """CuPy's NCCL binding, or None where this CuPy has none (or its library is missing)."""
    try:
        nccl = importlib.import_module("cupy.cuda.nccl")
    except ImportError:
        nccl = getattr(cp.cuda, "nccl", None)
    if nccl is None or not getattr(nccl, "available", True) or not hasattr(nccl, "NcclCommunicator"):
        return None
    return nccl


def version_text(version: int) -> str:
    """NCCL's version number (21903) as people write it (2.19.3)."""
    major, rest = divmod(int(version), 10000) if version >= 10000 else divmod(int(version), 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


class DeviceSums:
    """This rank's NCCL communicator, its stream, and the gradient buckets in flight."""

    def __init__(self, cp, nccl, communicator, stream, version: int):
        self.cp, self.nccl, self.communicator, self.stream = cp, nccl, communicator, stream
        self.version = version
        self.pending: dict[int, tuple] = {}      # bucket -> (its buffer, the event its sum records)

    @property
    def capturable(self) -> str | None:
        """Why a plan with these sums cannot be captured in a CUDA graph, or None."""
        if self.version < CAPTURE_VERSION:
            return (f"runs NCCL {version_text(self.version)}, whose collectives cannot be captured "
                    f"(2.9 and later can)")
        return None

    def _after_compute(self):
        """The compute stream (the current one) now; the NCCL stream waits for its work so far."""
        compute = self.cp.cuda.get_current_stream()
        self.stream.wait_event(compute.record())
        return compute

    def _all_reduce(self, send, recv) -> None:
        dtype = str(send.dtype)
        if dtype not in _NCCL_TYPES:
            raise TypeError(f"NCCL sums no {dtype} arrays")
        self.communicator.allReduce(_address(send), _address(recv), int(send.size), _NCCL_TYPES[dtype], _NCCL_SUM,
                                    self.stream.ptr)

    def start(self, bucket: int, buffer) -> None:
        """Starts the in-place sum over the ranks of ``buffer`` (a contiguous device array); it
        must not be read or written until ``wait(bucket)``."""
        self._after_compute()
        self._all_reduce(buffer, buffer)
        self.pending[bucket] = (buffer, self.stream.record())

    def wait(self, bucket: int):
        """The compute stream waits for the bucket's sum; returns the bucket's buffer."""
        buffer, done = self.pending.pop(bucket)
        self.cp.cuda.get_current_stream().wait_event(done)
        return buffer

    def allreduce(self, source, out) -> None:
        """``out`` = the sum over ranks of ``source`` (contiguous device arrays of one shape), in
        the compute stream's order (BatchNorm's global statistics, the logged loss)."""
        compute = self._after_compute()
        self._all_reduce(source, out)
        compute.wait_event(self.stream.record())


def _address(array) -> int:
    data = array.data
    ptr = getattr(data, "ptr", None)
    return ptr if ptr is not None else array.ctypes.data     # a stand-in's host array


def _device_key(cp, index: int) -> tuple[str, str]:
    """What tells this rank's GPU from every other's: the machine, and the GPU's PCI address."""
    try:
        bus = str(cp.cuda.Device(index).pci_bus_id)
    except Exception:                    # no PCI address to read: the index on this machine
        bus = f"index {index}"
    return socket.gethostname(), bus


def start_device_sums(comm, cp, device_index: int) -> tuple[DeviceSums | None, str]:
    """This rank's ``DeviceSums`` on GPU ``device_index``, or None with the reason the sums stage
    through host memory; and the one line that says which (the same on every rank). Collective:
    every rank of ``comm`` calls it."""
    nccl = nccl_module(cp)
    why = None
    keys = comm.gather_all(_device_key(cp, device_index))
    if len(set(keys)) < len(keys):           # first: no NCCL would take this job
        shared = next(k for k in keys if keys.count(k) > 1)
        ranks = [r for r, k in enumerate(keys) if k == shared]
        why = (f"ranks {', '.join(map(str, ranks))} share one GPU ({shared[1]} on {shared[0]}), "
               f"and NCCL takes one rank per GPU")
    elif nccl is None:
        why = "this CuPy has no NCCL (install the gpu extra's nvidia-nccl wheel)"
    reasons = comm.gather_all(why or "")               # every rank decides alike, by the first reason
    if any(reasons):
        return None, _staged_line(next(text for text in reasons if text))
    sums, uid, failed = None, None, ""
    if comm.rank == 0:
        try:
            uid = nccl.get_unique_id()
        except Exception as e:
            failed = _words(e)
    uid = comm.share(uid)                  # every rank reaches this, whatever rank 0 met
    if uid is None:
        failed = failed or "rank 0 made no unique id"
    else:
        try:
            with cp.cuda.Device(device_index):
                communicator = nccl.NcclCommunicator(comm.size, uid, comm.rank)
                stream = cp.cuda.Stream(non_blocking=True)
                version = int(nccl.get_version()) if hasattr(nccl, "get_version") else 0
                sums = DeviceSums(cp, nccl, communicator, stream, version)
        except Exception as e:
            failed = _words(e)
    reasons = comm.gather_all(failed)
    if any(reasons):
        rank = next(r for r, text in enumerate(reasons) if text)
        return None, _staged_line(f"NCCL failed to start on rank {rank} ({reasons[rank]})")
    return sums, (f"gradients summed by NCCL {version_text(sums.version)} on the GPUs, one per rank, "
                  f"on a stream of their own")


def _words(e: Exception) -> str:
    """The library's own words for a failure, on one line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _staged_line(why: str) -> str:
    return f"gradients summed through host memory over MPI, not NCCL: {why}"

"""Devices: what runs the kernels and holds the values, named ``cpu``, ``gpu``, ``cpu:N``, ``gpu:N``.

A name is a kind (which kernels run: the registry is keyed by kind) and an index (which memory
the values live in). Each kind is one subclass of ``Device`` in ``DEVICE_KINDS``, and answers
what the rest of the code needs to know about it: where its arrays live, whether generated C
kernels and the host's thread pool serve it, whether it has streams, which half-precision types
it stores natively, which modules hold its kernels, how to wait for it and how to upload to it.
Nothing outside this module asks which kind a device is.

Every ``cpu:N`` is the host's memory with the numpy kernels: two of them are enough to exercise
the partitioner and its transfers without a GPU. ``gpu:N`` is CUDA device N through CuPy,
imported only here and only when a GPU is asked for. numpy too is imported where it is used: the
command line reads the kinds' names before any work starts.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import ClassVar

from ..errors import UserError
from ..ir.graph import LOW_PRECISION


@dataclass(frozen=True)
class Device:
    """One device of a kind. Compared and hashed by kind and index."""

    index: int = 0

    kind: ClassVar[str]
    # the modules whose import registers this kind's kernels (backend/registry.py loads them)
    kernel_modules: ClassVar[tuple[str, ...]]
    # values are numpy arrays in the host's memory (readable without a copy or a wait)
    host_memory: ClassVar[bool]
    # the generated native kernels (toolkit/codegen, compiled by the C compiler) run here, and
    # a plan may split an op's rows over the host's threads or run branches side by side
    host_threads: ClassVar[bool]
    # independent branches of a plan can run on streams of their own (runtime/streams.py)
    streams: ClassVar[bool]
    # the half-precision types whose arrays this kind holds as such; the others of
    # LOW_PRECISION are stored as float32 and rounded at every cast (passes/precision.py)
    native_half_types: ClassVar[tuple[str, ...]]

    @property
    def name(self) -> str:
        return self.kind if self.index == 0 else f"{self.kind}:{self.index}"

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Device({self.name!r})"

    @property
    def emulated_half_types(self) -> tuple[str, ...]:
        return tuple(t for t in LOW_PRECISION if t not in self.native_half_types)

    def why_emulated(self, dtype: str) -> str:
        """Why ``dtype`` (one of ``emulated_half_types``) runs through float32 here."""
        raise NotImplementedError

    @property
    def xp(self):
        """The array module holding this device's values."""
        raise NotImplementedError

    def check_exists(self) -> None:
        """A UserError naming what is missing when this device cannot run here."""

    def use(self):
        """A context manager making this device current (where new arrays are allocated)."""
        return _NoContext()

    def synchronize(self) -> None:
        """Wait until this device has finished the work queued on it (a timer's end)."""

    def empty(self, nbytes: int):
        with self.use():
            return self.xp.empty(max(int(nbytes), 1), dtype="uint8")

    def to_device(self, array):
        """``array`` (host or any device) as an array of this device (no copy when it is one)."""
        return to_host(array)

    def uploader(self, target):
        """A callable copying a host array into ``target`` (an array of this device)."""
        import numpy as np
        return functools.partial(np.copyto, target, casting="same_kind")

    def stream_backend(self):
        """The calls that make and order this device's streams (``streams`` devices only)."""
        raise NotImplementedError(f"device '{self}' has no streams")


class HostDevice(Device):
    """The host: numpy arrays, the numpy and generated C kernels, the host's threads."""

    kind = "cpu"
    kernel_modules = ("toolkit.kernels.cpu", "toolkit.kernels.native")
    host_memory = True
    host_threads = True
    streams = False
    native_half_types = ()

    def why_emulated(self, dtype: str) -> str:
        return "numpy has no fast half-precision arithmetic"

    @property
    def xp(self):
        import numpy
        return numpy


class CudaDevice(Device):
    """An NVIDIA GPU through CuPy: cuBLAS GEMMs, CuPy's elementwise kernels, generated CUDA."""

    kind = "gpu"
    kernel_modules = ("toolkit.kernels.gpu",)
    host_memory = False
    host_threads = False
    streams = True
    native_half_types = ("float16",)

    def why_emulated(self, dtype: str) -> str:
        return "CuPy has no bfloat16 arrays"

    @property
    def xp(self):
        return gpu_module()

    def check_exists(self) -> None:
        count = gpu_module().cuda.runtime.getDeviceCount()
        if self.index >= count:
            raise UserError(f"device '{self}' does not exist: this machine has {count} GPU(s), gpu:0 to gpu:{count - 1}")

    def use(self):
        return gpu_module().cuda.Device(self.index)

    def synchronize(self) -> None:
        gpu_module().cuda.Device(self.index).synchronize()

    def to_device(self, array):
        with self.use():
            return gpu_module().asarray(array)

    def uploader(self, target):
        return HostUpload(target)

    def stream_backend(self):
        return CupyStreams()


# Every kind of device, by the name the command line and net files use.
DEVICE_KINDS: dict[str, type[Device]] = {kind.kind: kind for kind in (HostDevice, CudaDevice)}
CPU = HostDevice()


def device_help() -> str:
    """What ``--device`` takes, in words, from the kinds there are."""
    kinds = list(DEVICE_KINDS)
    return f"{kinds[0]} (default) or {', '.join(kinds[1:])}; {' / '.join(k + ':N' for k in kinds)} name one of several"

_NAME = re.compile(r"^(%s)(?::([0-9]+))?$" % "|".join(DEVICE_KINDS))


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def parse_device(text: str | Device) -> Device:
    """``cpu``, ``gpu``, ``cpu:N``, ``gpu:N`` as a Device; anything else is a UserError."""
    if isinstance(text, Device):
        return text
    return _parse_name(str(text))


@functools.lru_cache(maxsize=64)
def _parse_name(text: str) -> Device:
    m = _NAME.match(text.strip())
    if not m:
        kinds = " or ".join(DEVICE_KINDS)
        raise UserError(f"unknown device '{text}' (use {kinds}, or {' / '.join(k + ':N' for k in DEVICE_KINDS)} "
                        "for one of several)")
    return DEVICE_KINDS[m.group(1)](int(m.group(2) or 0))


# What a plan's stream schedule queues on a stream (runtime/streams.py): a kernel call, a wait
# for an event, an event recorded.
CALL, WAIT, RECORD = "call", "wait", "record"


class CupyStreams:
    """The CUDA side of a schedule, through CuPy."""

    def __init__(self):
        self.cuda = gpu_module().cuda

    def stream(self):
        return self.cuda.Stream(non_blocking=True)

    def event(self):
        return self.cuda.Event(block=False, disable_timing=True)

    def current(self):
        return self.cuda.get_current_stream()

    def record(self, event, stream) -> None:
        event.record(stream)

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def run_on(self, stream, actions: list[tuple[str, object]]) -> None:
        with stream:                            # CuPy launches (kernels, cuBLAS) go to the current stream
            for kind, item in actions:
                if kind == CALL:
                    item()
                elif kind == WAIT:
                    stream.wait_event(item)
                else:
                    item.record(stream)

    def finish(self, stream) -> None:
        """Nothing: the caller's stream already waits on every stream's last event."""


class HostUpload:
    """Host-to-GPU copies into one device array without a device synchronisation.

    A copy from pageable host memory makes CUDA wait for the stream first; one from pinned
    (page-locked) memory is queued like a kernel. So each upload goes through one of two pinned
    staging buffers, used in turn: before refilling a buffer, the host waits only for the copy
    that last read it (two uploads ago, long finished), not for the device's other work. Without
    ``cupyx`` (a stand-in for CuPy) it is a plain copy."""

    def __init__(self, target):
        self.target = target
        self.slots: list | None = None
        self.turn = 0
        try:
            from cupyx import empty_pinned
        except ImportError:                # a stand-in for CuPy: plain, synchronous copies
            empty_pinned = None
        self.empty_pinned = empty_pinned

    def __call__(self, value) -> None:
        import numpy as np
        if self.empty_pinned is None:
            self.target.set(np.ascontiguousarray(value, dtype=self.target.dtype))
            return
        cp = gpu_module()
        if self.slots is None:
            self.slots = [(self.empty_pinned(self.target.shape, self.target.dtype), cp.cuda.Event())
                          for _ in range(2)]
        host, done = self.slots[self.turn]
        self.turn ^= 1
        done.synchronize()                 # only the copy out of this buffer, two uploads ago
        np.copyto(host, value, casting="same_kind")
        self.target.set(host, stream=cp.cuda.get_current_stream())
        done.record()


def to_host(array):
    """A numpy array of ``array``'s values (a copy only when it lives on a GPU)."""
    import numpy as np
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    return get() if callable(get) else np.asarray(array)


_cupy = None


def gpu_module():
    """CuPy, imported on first use; a UserError naming what is missing when it cannot run."""
    global _cupy
    if _cupy is None:
        try:
            import cupy
        except ImportError:
            raise UserError("--device gpu needs CuPy and an NVIDIA GPU: install the gpu extra "
                            "(pip install -e '.[gpu]') on a machine with a CUDA driver") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:                      # the driver's own error: no device, no driver
            raise UserError(f"--device gpu: CuPy finds no usable CUDA device ({e})") from None
        if count == 0:
            raise UserError("--device gpu: CuPy finds no CUDA device")
        _cupy = cupy
    return _cupy


def gpu_available() -> bool:
    """Whether ``--device gpu`` can run here (for tests that skip without one)."""
    try:
        gpu_module()
    except UserError:
        return False
    return True

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

import contextlib
import functools
import re
import threading
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
    # a plan's run can be recorded once and replayed with one launch (runtime/capture.py)
    graphs: ClassVar[bool] = False

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
        """A callable copying an array (a host array, or one already on this device) into
        ``target`` (an array of this device)."""
        import numpy as np
        return functools.partial(np.copyto, target, casting="same_kind")

    def stream_backend(self):
        """The calls that make and order this device's streams (``streams`` devices only)."""
        raise NotImplementedError(f"device '{self}' has no streams")

    def graph_backend(self):
        """The calls that warm, capture and launch a plan's graph (``graphs`` devices only)."""
        raise NotImplementedError(f"device '{self}' has no graphs")


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
    graphs = True

    def why_emulated(self, dtype: str) -> str:
        return "CuPy has no bfloat16 arrays"

    @property
    def xp(self):
        return gpu_module()

    def check_exists(self) -> None:
        count = gpu_module().cuda.runtime.getDeviceCount()
        if self.index >= count:
            raise UserError(f"device '{self}' does not exist: this machine has {count} GPU(s), "
                            f"gpu:0 to gpu:{count - 1}")

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

    def graph_backend(self):
        with self.use():
            return CupyGraphs()


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


class CupyGraphs:
    """CUDA graphs through CuPy, for one captured plan: a stream and a memory pool of its own.

    The warm-up run and the capture both run on the private stream with the private pool as
    CuPy's allocator, so the capture finds every temporary block the warm-up freed (the pool is
    stream-ordered) and never asks the device for memory; the pool then serves no one else, so
    nothing the graph touches is handed out while it lives. The private stream waits for the
    caller's stream before each of the two, and the caller's for it after the warm-up; replays go
    on the caller's stream, ordered with its uploads and reads like any kernel."""

    def __init__(self):
        self.cp = cp = gpu_module()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()

    def _follow_caller(self):
        caller = self.cp.cuda.get_current_stream()
        self.stream.wait_event(caller.record())
        return caller

    def warm(self, run) -> None:
        caller = self._follow_caller()
        with self.stream, self.cp.cuda.using_allocator(self.pool.malloc):
            run()
        caller.wait_event(self.stream.record())

    def capture(self, run):
        runtime = self.cp.cuda.runtime
        self._follow_caller()
        with self.stream, self.cp.cuda.using_allocator(self.pool.malloc):
            # relaxed: another thread's unrelated CUDA calls must not invalidate this capture
            self.stream.begin_capture(mode=runtime.streamCaptureModeRelaxed)
            try:
                run()
            except BaseException:
                try:
                    self.stream.end_capture()
                except Exception:         # the capture was already invalidated: nothing to end
                    pass
                raise
            return self.stream.end_capture()

    def launch(self, graph) -> None:
        graph.launch(self.cp.cuda.get_current_stream())


class CaptureUnsafe(RuntimeError):
    """Something a captured run may not do (read a device value on the host) was asked for
    while the run was being recorded."""


_capturing = threading.local()


@contextlib.contextmanager
def capture_guard(on: bool):
    """While on, ``to_host`` of a device array raises CaptureUnsafe: a host read would wait for
    work that a capture records but does not run, and a replay would never repeat it."""
    before = getattr(_capturing, "on", False)
    _capturing.on = on
    try:
        yield
    finally:
        _capturing.on = before


class HostUpload:
    """Host-to-GPU copies into one device array without a device synchronisation.

    A copy from pageable host memory makes CUDA wait for the stream first; one from pinned
    (page-locked) memory is queued like a kernel. So each upload goes through one of two pinned
    staging buffers, used in turn: before refilling a buffer, the host waits only for the copy
    that last read it (two uploads ago, long finished), not for the device's other work. Without
    ``cupyx`` (a stand-in for CuPy) it is a plain copy. A value already on the GPU is one queued
    device-to-device copy."""

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
        if hasattr(value, "__cuda_array_interface__"):
            self._from_device(value)
            return
        value = np.asarray(value)
        if self.empty_pinned is None:
            if isinstance(self.target, np.ndarray):
                np.copyto(self.target, value, casting="same_kind")
            else:
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

    def _from_device(self, value) -> None:
        """A value already on this GPU: one device-to-device copy, queued (an array of another
        shape, dtype, layout or device goes through CuPy's own assignment)."""
        target = self.target
        same = (value.shape == target.shape and value.dtype == target.dtype and value.flags.c_contiguous
                and getattr(value, "device", None) == getattr(target, "device", None)
                and hasattr(getattr(value, "data", None), "ptr"))
        if same and target.nbytes:
            target.data.copy_from_device_async(value.data, target.nbytes)    # on the current stream
        else:
            target[...] = value


def to_host(array):
    """A numpy array of ``array``'s values (a copy only when it lives on a GPU)."""
    import numpy as np
    if getattr(_capturing, "on", False):
        raise CaptureUnsafe("reads a device value on the host during the run")
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

"""Devices: names (``cpu``, ``gpu``, ``cpu:1``, ``gpu:0``), their array modules, and where each
node of a graph runs.

A device name is a kind (which kernels run: the registry is keyed by kind) and an index (which
memory the values live in). Every ``cpu:N`` is the host's memory with the numpy kernels: two of
them are enough to exercise the partitioner and its transfers without a GPU. ``gpu:N`` is CUDA
device N through CuPy, imported only here and only when a GPU is asked for.

Placement is by layer: a node runs on the device its layer names (``device:`` in the net file),
else on the graph's device (``--device``). Nodes made by passes keep the scope of the layer they
came from (``conv1``, ``conv1.grad``, ``conv1.sgd``, ``conv1+relu1``), which is how they are placed.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from ..ir.graph import LOW_PRECISION  # noqa: F401  (re-exported for the commands)

KINDS = ("cpu", "gpu")
_NAME = re.compile(r"^(cpu|gpu)(?::([0-9]+))?$")


@dataclass(frozen=True)
class Device:
    kind: str
    index: int = 0

    @property
    def name(self) -> str:
        return self.kind if self.index == 0 else f"{self.kind}:{self.index}"

    def __str__(self) -> str:
        return self.name

    @property
    def xp(self):
        """The array module holding this device's values."""
        return gpu_module() if self.kind == "gpu" else np

    def use(self):
        """A context manager making this device current (CuPy allocates on the current one)."""
        if self.kind == "gpu":
            return gpu_module().cuda.Device(self.index)
        return _NoContext()

    def synchronize(self) -> None:
        """Wait until this device has finished the work queued on it (a timer's end)."""
        if self.kind == "gpu":
            gpu_module().cuda.Device(self.index).synchronize()

    def empty(self, nbytes: int):
        with self.use():
            return self.xp.empty(max(int(nbytes), 1), dtype=np.uint8)

    def to_device(self, array):
        """``array`` (host or any device) as an array of this device (no copy when it is one)."""
        if self.kind == "gpu":
            with self.use():
                return gpu_module().asarray(array)
        return to_host(array)


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
        raise UserError(f"unknown device '{text}' (use cpu or gpu, or cpu:N / gpu:N for one of several)")
    return Device(m.group(1), int(m.group(2) or 0))


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


def to_host(array) -> np.ndarray:
    """A numpy array of ``array``'s values (a copy only when it lives on a GPU)."""
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


def check_device_exists(device: Device) -> None:
    if device.kind == "gpu":
        count = gpu_module().cuda.runtime.getDeviceCount()
        if device.index >= count:
            raise UserError(f"device '{device}' does not exist: this machine has {count} GPU(s), gpu:0 to gpu:{count - 1}")


def layer_of_scope(scope: str) -> str:
    """The layer a node came from: ``conv1.grad`` and ``conv1+relu1`` are conv1's."""
    return scope.split("+", 1)[0].split(".", 1)[0]


def node_device(graph, node) -> Device:
    """Where ``node`` runs: a transfer's destination, its layer's device, or the graph's."""
    if node.op == "transfer":
        return parse_device(node.attrs["dst"])
    name = graph.layer_devices.get(layer_of_scope(node.scope))
    return parse_device(name if name is not None else graph.device)


def weight_device(graph, weight) -> Device:
    """Where a weight lives: with the layer that owns it."""
    name = graph.layer_devices.get(weight.layer)
    return parse_device(name if name is not None else graph.device)


def graph_devices(graph) -> list[Device]:
    """Every device the graph's nodes run on, the graph's own first."""
    seen = {parse_device(graph.device): None}
    for node in graph.nodes:
        seen.setdefault(node_device(graph, node), None)
    return list(seen)

"""What a placement costs, as a placer asks it.

``CostModel`` is the interface: an op's time on a device, a value's transfer time between two
devices, and each device's memory limit, for a graph whose symbolic sizes are bound (a batch).
``FlopsModel`` answers it with no measurement: an op's FLOPs (its OpDef's count) at the
device's rate plus a per-kernel overhead, and a transfer's bytes over a ``Link`` (latency plus
bytes at a bandwidth). The measured model (cost.py) answers the same questions from kernel
timings on this machine; tests and the placer's own checks use this one, whose numbers are
known exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from ..backend.devices import Device, parse_device
from ..ir.dims import evaluate
from ..ir.graph import Node, Value
from ..ops.base import get_op

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "int8": 1, "uint8": 1,
            "bool": 1}


def value_bytes(v: Value, bindings: Mapping[str, int]) -> int:
    """The bytes ``v`` holds once its symbolic sizes are bound."""
    count = 1
    for d in v.shape:
        count *= evaluate(d, bindings)
    return count * ITEMSIZE.get(v.dtype, 4)


@dataclass(frozen=True)
class Link:
    """How long moving bytes between two devices takes: a fixed latency plus bytes at a rate."""
    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


class CostModel(Protocol):
    """The questions a placer asks of a graph bound to sizes."""

    def op_seconds(self, node: Node, device: Device) -> float:
        """How long ``node`` takes on ``device``."""

    def transfer_seconds(self, value: Value, src: Device, dst: Device) -> float:
        """How long moving ``value`` from ``src`` to ``dst`` takes (0 on one device)."""

    def memory_limit(self, device: Device) -> int | None:
        """The bytes ``device`` may hold for this graph, None when unbounded."""


@dataclass
class FlopsModel:
    """Time as FLOPs at a rate: ``flops_per_s`` and ``memory`` keyed by a device's name (``cpu:1``)
    or kind (``cpu``); ``links`` by (source, destination) names or kinds, a link between two
    devices of one process's memory defaulting to ``default_link``."""
    bindings: Mapping[str, int]
    flops_per_s: Mapping[str, float]
    kernel_overhead_s: float = 5e-6
    links: Mapping[tuple[str, str], Link] = field(default_factory=dict)
    default_link: Link = Link(2e-6, 10e9)
    memory: Mapping[str, int] = field(default_factory=dict)

    def _by_device(self, table: Mapping, device: Device):
        device = parse_device(device)
        return table.get(str(device), table.get(device.kind))

    def op_seconds(self, node: Node, device: Device) -> float:
        opdef = get_op(node.op)
        flops = 0
        if opdef.flops is not None:
            flops = evaluate(opdef.flops([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs),
                             self.bindings)
        rate = self._by_device(self.flops_per_s, device)
        if rate is None:
            raise KeyError(f"no FLOP rate for {device}")
        return self.kernel_overhead_s + flops / rate

    def transfer_seconds(self, value: Value, src: Device, dst: Device) -> float:
        src, dst = parse_device(src), parse_device(dst)
        if src == dst:
            return 0.0
        link = (self.links.get((str(src), str(dst))) or self.links.get((src.kind, dst.kind)) or self.default_link)
        return link.seconds(value_bytes(value, self.bindings))

    def memory_limit(self, device: Device) -> int | None:
        return self._by_device(self.memory, device)

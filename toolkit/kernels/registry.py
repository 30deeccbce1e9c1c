"""Kernel registry keyed by (op, device, dtype), with ``*`` as an explicit any-dtype fallback.

A kernel is a factory: given a KernelContext (the node with concrete shapes), it returns a
callable ``run(inputs, outputs)`` that writes into preallocated output arrays. Factories do
their per-shape work (index maps, scratch buffers) once, when a plan is built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..ir.graph import Node

KernelFn = Callable[[list, list], None]
KernelFactory = Callable[["KernelContext"], KernelFn]


@dataclass
class KernelContext:
    node: Node
    attrs: dict[str, Any]                 # symbolic dimensions already replaced by numbers
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    dtype: str                            # the dtype the kernel was chosen for
    device: str
    runtime: Any = None                   # per-executor state: the random generator for impure ops
    xp: Any = None                        # the array module: numpy or cupy
    share: int = 0                        # which share of a split op (its rows): keys its scratch
    threads: int = 1                      # threads the plan runs on (native kernels' parallel loops)


@dataclass(frozen=True)
class KernelEntry:
    factory: KernelFactory
    # True: output 0 may share storage with any input of its shape and dtype; a callable
    # node -> {output position: input positions} says it per node (fused kernels)
    inplace: bool | Callable[[Node], dict[int, tuple[int, ...]]] = False

    def inplace_pairs(self, node: Node) -> dict[int, tuple[int, ...]]:
        if callable(self.inplace):
            return self.inplace(node)
        return {0: tuple(range(len(node.inputs)))} if self.inplace else {}


@dataclass
class KernelRegistry:
    entries: dict[tuple[str, str, str], KernelEntry] = field(default_factory=dict)
    # generated-code builders, tried before the entry's factory: (op, device) -> builder(ctx)
    # returning a codegen.native.NativeCall, or None where it declines (that dtype, those attrs)
    natives: dict[tuple[str, str], Callable] = field(default_factory=dict)

    def register_native(self, op: str, device: str):
        def wrap(builder):
            if (op, device) in self.natives:
                raise RuntimeError(f"native kernel {(op, device)} registered twice")
            self.natives[(op, device)] = builder
            return builder
        return wrap

    def native(self, op: str, device: str) -> Callable | None:
        return self.natives.get((op, device))

    def register(self, op: str, device: str, dtype: str = "*", inplace=False):
        def wrap(factory: KernelFactory) -> KernelFactory:
            key = (op, device, dtype)
            if key in self.entries:
                raise RuntimeError(f"kernel {key} registered twice")
            self.entries[key] = KernelEntry(factory, inplace)
            return factory
        return wrap

    def has(self, op: str, device: str, dtype: str) -> bool:
        """Whether ``lookup`` would find a kernel (fusions ask this before they fire)."""
        return (op, device, dtype) in self.entries or (op, device, "*") in self.entries

    def lookup(self, op: str, device: str, dtype: str) -> KernelEntry:
        for key in ((op, device, dtype), (op, device, "*")):
            if key in self.entries:
                return self.entries[key]
        have = sorted(f"{d}/{t}" for (o, d, t) in self.entries if o == op)
        raise KernelMissing(f"no kernel for op '{op}' on device '{device}' with dtype {dtype}; "
                            f"registered for this op: {', '.join(have) or 'nothing'}")



class KernelMissing(LookupError):
    """No kernel is registered for an (op, device, dtype)."""


KERNELS = KernelRegistry()
register_kernel = KERNELS.register
register_native = KERNELS.register_native


def load_device(device: str) -> None:
    """Import the kernel modules of a device's kind (cupy only when a GPU is asked for)."""
    from ..runtime.devices import parse_device
    kind = parse_device(device).kind
    if kind == "cpu":
        from . import cpu, native  # noqa: F401
    else:
        from . import gpu  # noqa: F401  (imports cupy: a UserError where it cannot run)


def load_graph_devices(graph) -> None:
    """Import the kernels of every device a graph's nodes run on (fusions ask what exists)."""
    from ..runtime.devices import graph_devices
    for device in graph_devices(graph):
        load_device(device.name)

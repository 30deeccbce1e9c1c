"""Kernel registry keyed by (op, device kind, dtype), with ``*`` as an explicit any-dtype fallback.

A kernel is a factory: given a KernelContext (the node with concrete shapes), it returns a
callable ``run(inputs, outputs)`` that writes into preallocated output arrays. Factories do
their per-shape work (index maps, scratch buffers) once, when a plan is built.

The kernels are plug-ins above the runtime: a kind's modules (``Device.kernel_modules``) are
imported by name the first time anything asks for that kind, and register themselves here, so
nothing on this floor or below imports them.

Which kernel a key gets is stated, not left to the order the modules are imported in: every
registration carries a priority (``PORTABLE`` for a device's plain kernels, ``SPECIALISED`` for
those that take their place, keeping them as a fallback: cuDNN's convolutions, one-kernel row
ops), and each key's kernel is the chain of its registrations in priority order. Two
registrations of one key at one priority are a maintainer's mistake, refused when the second is
made.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..ir.graph import Node
from .devices import DEVICE_KINDS, Device, parse_device

KernelFn = Callable[[list, list], None]
KernelFactory = Callable[["KernelContext"], KernelFn]


@dataclass
class KernelContext:
    node: Node
    attrs: dict[str, Any]                 # symbolic dimensions already replaced by numbers
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    dtype: str                            # the dtype the kernel was chosen for
    device: Device                        # where it runs (registry entries are keyed by its kind)
    runtime: Any = None                   # per-executor state: the random generator for impure ops
    xp: Any = None                        # the array module: numpy or cupy
    share: int = 0                        # which share of a split op (its rows): keys its scratch
    threads: int = 1                      # threads the plan runs on (native kernels' parallel loops)
    reuse_memory: bool = True             # whether the plan reuses buffers (a body's plan follows)
    precision: str | None = None          # the graph's float32 math policy (Graph.precision)


@dataclass(frozen=True)
class KernelEntry:
    factory: KernelFactory
    # True: output 0 may share storage with any input of its shape and dtype; a callable
    # node -> {output position: input positions} says it per node (fused kernels)
    inplace: bool | Callable[[Node], dict[int, tuple[int, ...]]] = False
    # why a run with this kernel cannot be captured as a device graph (it reads the device from
    # the host, or queues host work): a sentence finishing "its OP kernel ...", or a callable
    # node -> that sentence or None; None: capturable (runtime/capture.py)
    host_sync: str | Callable[[Node], str | None] | None = None
    # False for a fused op's plain kernel that exists to run the op anywhere (tests, a graph
    # fused for another device) but is no faster than the ops it stands for: the fusion passes
    # ask ``fusion_pays`` and do not make the op for this device. A callable (node) -> bool says
    # it when asked, for the node the pass would replace (None: for none in particular): the
    # host's compiler and vector width, and the kernel the node has now, decide for the blocked
    # layout's convolution
    fusion_pays: bool | Callable[[Node | None], bool] = True
    # a fused kernel that loads inputs and stores outputs in these dtypes besides the one it
    # computes in (ops/fused.py's compute, in_dtypes, out_dtypes): the fuse_casts pass takes
    # casts between them into it
    stores: tuple[str, ...] = ()

    def host_sync_of(self, node: Node) -> str | None:
        return self.host_sync(node) if callable(self.host_sync) else self.host_sync

    def inplace_pairs(self, node: Node) -> dict[int, tuple[int, ...]]:
        if callable(self.inplace):
            return self.inplace(node)
        return {0: tuple(range(len(node.inputs)))} if self.inplace else {}


# Priorities: a higher one takes the place of a lower one for the same key, whatever the order
# the registrations are made in. PORTABLE: a device's plain kernels (its own, or another device's
# shared with it). SPECIALISED: kernels for one library or one piece of hardware that replace the
# plain kernel of every dtype of an op, which each keeps as its fallback.
PORTABLE = 0
SPECIALISED = 10

Key = tuple[str, str, str]                  # (op, device kind, dtype or "*")
Specialiser = Callable[[KernelFactory], KernelFactory]     # the kernel below -> the kernel in its place


@dataclass
class KernelRegistry:
    # the table lookups read: each key's kernel with every registration for it applied in
    # priority order (tests may patch an entry here for one run)
    entries: dict[Key, KernelEntry] = field(default_factory=dict)
    # what was registered: each key's kernels by priority, and each (op, device kind)'s
    # specialisers by priority (one applies to every dtype of the op on that device)
    plain: dict[Key, dict[int, KernelEntry]] = field(default_factory=dict)
    specialisers: dict[tuple[str, str], dict[int, Specialiser]] = field(default_factory=dict)
    # each key's chain as module.qualname of what was registered, lowest priority first
    chains: dict[Key, tuple[str, ...]] = field(default_factory=dict)
    # generated-code builders, tried before the entry's factory: (op, device) -> builder(ctx)
    # returning a codegen.native.NativeCall, or None where it declines (that dtype, those attrs)
    natives: dict[tuple[str, str], Callable] = field(default_factory=dict)
    sized_natives: set[tuple[str, str]] = field(default_factory=set)     # register_native(run_time_sizes=)

    def register_native(self, op: str, device: str, run_time_sizes: bool = False):
        """``run_time_sizes``: the builder is given shapes whose symbolic dimensions are
        ``codegen.loops.SizeInt`` numbers, so its kernels take them when they run (one compiled
        library for every sequence length); for builders measured to lose no speed by it."""
        def wrap(builder):
            if (op, device) in self.natives:
                raise RuntimeError(f"native kernel {(op, device)} registered twice")
            self.natives[(op, device)] = builder
            if run_time_sizes:
                self.sized_natives.add((op, device))
            return builder
        return wrap

    def native_takes_sizes(self, op: str, device: Device | str) -> bool:
        return (op, _kind(device)) in self.sized_natives

    def native(self, op: str, device: Device | str) -> Callable | None:
        kind = _kind(device)
        return self.natives.get((op, kind))

    def register(self, op: str, device: str, dtype: str = "*", inplace=False, host_sync=None, fusion_pays=True,
                 priority: int = PORTABLE, stores: tuple[str, ...] = ()):
        """A kernel factory for (op, device kind, dtype) at ``priority``: it is the key's kernel
        unless a registration of a higher priority replaces or specialises it."""
        def wrap(factory: KernelFactory) -> KernelFactory:
            key = (op, device, dtype)
            self._refuse_twice(key, priority, (op, device))
            self.plain.setdefault(key, {})[priority] = KernelEntry(factory, inplace, host_sync, fusion_pays, stores)
            self._resolve(key)
            return factory
        return wrap

    def specialise(self, op: str, device: str, priority: int = SPECIALISED):
        """A specialiser ``make(kernel below) -> kernel`` for every dtype of ``op`` on a device
        kind: each key's kernel of a lower priority becomes the fallback of ``make``'s, which
        keeps its in-place, host-sync and fusion facts. Where the op has no kernel below it for a
        dtype, the specialiser makes none."""
        def wrap(make: Specialiser) -> Specialiser:
            self._refuse_twice(None, priority, (op, device))
            self.specialisers.setdefault((op, device), {})[priority] = make
            for key in [k for k in self.plain if k[:2] == (op, device)]:
                self._resolve(key)
            return make
        return wrap

    def portable(self, op: str, device: str) -> dict[str, KernelEntry]:
        """dtype -> the plain kernel a device registered for ``op`` (for another device that
        shares it), whatever has specialised it since."""
        return {key[2]: by_priority[PORTABLE] for key, by_priority in self.plain.items()
                if key[:2] == (op, device) and PORTABLE in by_priority}

    def _refuse_twice(self, key: Key | None, priority: int, op_device: tuple[str, str]) -> None:
        keys = [key] if key is not None else [k for k in self.plain if k[:2] == op_device]
        taken = any(priority in self.plain.get(k, {}) for k in keys) or \
            priority in self.specialisers.get(op_device, {})
        if taken:
            what = key or (*op_device, "every dtype")
            raise RuntimeError(f"kernel {what} registered twice at priority {priority}: a kernel that "
                               "replaces another declares a higher priority")

    def _resolve(self, key: Key) -> None:
        """The key's kernel: its registrations and its op's specialisers applied in priority order."""
        steps = sorted([(p, "plain", e) for p, e in self.plain[key].items()] +
                       [(p, "special", m) for p, m in self.specialisers.get(key[:2], {}).items()],
                       key=lambda step: step[0])
        entry, chain = None, []
        for _priority, kind, what in steps:
            if kind == "plain":
                entry = what
                chain = [_name(what.factory)]
            elif entry is not None:
                entry = replace(entry, factory=what(entry.factory))
                chain.append(_name(what))
        self.entries[key] = entry
        self.chains[key] = tuple(chain)

    def has(self, op: str, device: Device | str, dtype: str) -> bool:
        """Whether ``lookup`` would find a kernel, the kind's kernels loaded if they were not
        (fusions ask this before they fire)."""
        kind = _kind(device)
        load_kind(kind)
        return (op, kind, dtype) in self.entries or (op, kind, "*") in self.entries

    def fusion_pays(self, op: str, device: Device | str, dtype: str, node: Node | None = None) -> bool:
        """Whether a pass should make ``op`` for this device and dtype: a kernel is registered
        and it is faster than the ops it stands for (a fusion), or than ``node``, the form it
        would replace."""
        if not self.has(op, device, dtype):
            return False
        pays = self.lookup(op, device, dtype).fusion_pays
        return bool(pays(node)) if callable(pays) else pays

    def stores(self, op: str, device: Device | str, dtype: str) -> tuple[str, ...]:
        """The dtypes ``op``'s kernel for this device and compute dtype loads and stores besides
        its own (none where no kernel is registered)."""
        return self.lookup(op, device, dtype).stores if self.has(op, device, dtype) else ()

    def lookup(self, op: str, device: Device | str, dtype: str) -> KernelEntry:
        """The kernel of ``op`` for a device's kind and a dtype (the kind's kernels loaded first:
        a plan loads every device it runs on)."""
        kind = _kind(device)
        for key in ((op, kind, dtype), (op, kind, "*")):
            if key in self.entries:
                return self.entries[key]
        have = sorted(f"{d}/{t}" for (o, d, t) in self.entries if o == op)
        raise KernelMissing(f"no kernel for op '{op}' on device '{kind}' with dtype {dtype}; "
                            f"registered for this op: {', '.join(have) or 'nothing'}")


class KernelMissing(LookupError):
    """No kernel is registered for an (op, device, dtype)."""


KERNELS = KernelRegistry()
register_kernel = KERNELS.register
register_native = KERNELS.register_native


def _name(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _kind(device: Device | str) -> str:
    return device.kind if isinstance(device, Device) else device


_loaded: set[str] = set()


def load_kind(kind: str) -> None:
    """Import the kernel modules of a kind of device (each registers its kernels); the GPU's
    import CuPy, which is a UserError where it cannot run."""
    if kind in _loaded or kind not in DEVICE_KINDS:
        return
    for module in DEVICE_KINDS[kind].kernel_modules:
        importlib.import_module(module)
    _loaded.add(kind)


def load_device(device: Device | str) -> None:
    """Import the kernels of a device's kind (a device name is parsed: a bad one is a UserError)."""
    load_kind(parse_device(device).kind)

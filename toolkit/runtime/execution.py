"""How a plan uses the machine, decided once before it is built: how many threads, whether
independent branches run side by side (threads on the host, CUDA streams on a GPU) or each op is
split across the cores, whether kernels take symbolic sizes at run time, and the state its
kernels share with other plans (``RuntimeState``). Every later unit of a plan (build.py,
calls.py, scheduling.py) reads the one ``Execution`` made here, and each kernel is handed a
``KernelContext`` made from it (``kernel_context``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backend.devices import Device
from ..backend.registry import KernelContext
from ..ir.binding import bind_attrs
from ..ir.graph import FLOAT_DTYPES, Node
from ..settings import current as current_settings
from .concurrency import concurrent_default
from .device_groups import group_threads, grouped_devices
from .parallel import default_threads


@dataclass
class RuntimeState:
    """Per-executor mutable state that kernels may use: the random generator of impure ops, and
    scratch memory that kernels borrow for the length of one call (fused programs' temporaries).

    Scratch is shared by every kernel of the plans that share this state, one set per share of a
    split op (``KernelContext.share``): kernels of one share run one after another, so they may
    all use the same few buffers, which then stay in cache. (Plans sharing a state must not run
    at the same time; they do not: a session or a trainer runs one plan at a time.)"""

    rng: np.random.Generator
    scratch: dict = field(default_factory=dict)
    # control-flow bodies' plans, by (body, its shapes, device): a loop body's shapes do not
    # depend on the trip count, so plans of one graph for several sequence lengths share them
    body_plans: dict = field(default_factory=dict)

    def scratch_array(self, key: tuple, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A scratch array for ``key`` (share, slot), grown when a kernel needs more."""
        dtype = np.dtype(dtype)
        need = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        buf = self.scratch.get(key)
        if buf is None or buf.nbytes < need:
            buf = np.empty(need, np.uint8)
            self.scratch[key] = buf
        return buf[:int(np.prod(shape, dtype=np.int64)) * dtype.itemsize].view(dtype).reshape(shape)


@dataclass(frozen=True)
class Execution:
    """``concurrent``: branches side by side (concurrency.py; on CUDA streams when
    ``on_streams``, streams.py) rather than each op split across the cores (parallel.py).
    ``run_time_sizes``: builders registered for it take symbolic sizes when they run, so plans
    of other lengths reuse the compiled library. ``reuse_memory``: the memory planner's buffer
    reuse (``--disable plan_memory`` turns it off). ``groups``: the host devices run as core
    groups, each on its own thread (device_groups.py; () when the plan runs on one, or not so)."""

    threads: int
    concurrent: bool
    on_streams: bool
    run_time_sizes: bool
    reuse_memory: bool
    runtime: RuntimeState
    groups: tuple[Device, ...] = ()

    @property
    def kernel_threads(self) -> int:
        """The threads each kernel is built for: one where branches run side by side, a group's
        share of the cores where devices run as core groups, else every thread of the plan."""
        if self.concurrent:
            return 1
        if self.groups:
            return group_threads(self.threads, len(self.groups))
        return self.threads


def choose_execution(devices: list[Device], bindings, threads: int | None, concurrent: bool | None,
                     run_time_sizes: bool | None, reuse_memory: bool,
                     runtime: RuntimeState | None, running: list[Device] | None = None) -> Execution:
    """The plan's ``Execution`` on ``devices``; None for an argument: its default (every free
    core, the ``TOOLKIT_CONCURRENT`` and ``TOOLKIT_RUN_TIME_SIZES`` switches, a fresh state).
    ``running``: the devices its steps run on where they may run at once
    (device_groups.overlapping_devices): several host devices run as core groups (default:
    ``devices``)."""
    threads = default_threads() if threads is None else threads
    groups = grouped_devices(list(devices) if running is None else running, threads)
    wanted = concurrent_default() if concurrent is None else concurrent
    on_host = all(d.host_threads for d in devices)
    on_streams = bool(wanted and all(d.streams for d in devices))
    if run_time_sizes is None:
        # off (TOOLKIT_RUN_TIME_SIZES=0) compiles every size into the kernels, as before run-time
        # sizes (a plan per length then compiles its own library): for measuring what they cost,
        # and a way back should one misbehave
        run_time_sizes = current_settings().run_time_sizes
    return Execution(threads=threads,
                     # core groups run a multi-device plan's branches side by side already
                     concurrent=bool(wanted and on_host and threads > 1 and not groups) or on_streams,
                     on_streams=on_streams,
                     run_time_sizes=bool(run_time_sizes and bindings),
                     reuse_memory=reuse_memory,
                     runtime=runtime or RuntimeState(np.random.default_rng(0)),
                     groups=groups)


def kernel_dtype(node: Node) -> str:
    """The dtype a node's kernel is chosen by: the one a fused op computes in where it stores
    values in another (ops/fused.py), else its first float value's, else its output's."""
    if isinstance(node.attrs.get("compute"), str):
        return node.attrs["compute"]
    for v in list(node.inputs) + node.outputs:
        if v.dtype in FLOAT_DTYPES:
            return v.dtype
    return node.outputs[0].dtype


def kernel_context(node: Node, shapes, bindings, device: Device, execution: Execution,
                   share: int = 0, precision: str | None = None) -> KernelContext:
    """What a kernel factory is handed for ``node`` under ``shapes`` and ``bindings`` (numbers,
    or ``SizeInt`` ones for a builder whose kernels take sizes at run time). ``share``: which
    scratch set it borrows (steps that may run at once each have their own). ``precision``: the
    graph's float32 math policy (``Graph.precision``)."""
    return KernelContext(node, bind_attrs(node.attrs, bindings),
                         [shapes[v.id] for v in node.inputs], [shapes[v.id] for v in node.outputs],
                         kernel_dtype(node), device, execution.runtime, device.xp, share=share,
                         threads=execution.kernel_threads,
                         reuse_memory=execution.reuse_memory, precision=precision)

"""A plan's calls: one callable per step that is not a view, on the arrays of its memory plan.

A step gets a generated native kernel where a builder takes its node (the native calls linked
into as few compiled units as fit, consecutive ones called from Python as one segment), else
the registry's numpy kernel, split across the cores by batch rows where that pays
(parallel.py). What comes out is ``Calls``, which scheduling.py, capture.py and running.py use.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backend.placement import layer_of_scope
from ..backend.registry import KERNELS, KernelContext
from ..codegen import toolchain
from ..codegen.native import Linked, NativeCall, with_sizes
from ..codegen.native import units as native_units
from ..errors import UserError, notice
from ..ir.binding import bind_attrs
from ..ir.graph import Node
from ..ops.base import get_op
from .build import PlanBuild
from .device_groups import group_share
from .execution import Execution, kernel_context, kernel_dtype
from .layout import ValueViews
from .memory import MemoryPlan
from .parallel import Blas, Workers, split_kind, worth_splitting


@dataclass
class Calls:
    """``steps[p]`` runs as ``calls[p]`` (``impls[p]``: "native" or "numpy"); ``run_calls`` is
    what a run calls, in order (native segments in place of their steps). ``before_run``: host
    work some kernels do before each run (a random key's upload), outside a captured graph;
    ``blockers``: per numpy step, why its kernel cannot be captured (or None)."""

    steps: list[Node] = field(default_factory=list)
    calls: list = field(default_factory=list)
    impls: list[str] = field(default_factory=list)
    run_calls: list = field(default_factory=list)
    before_run: list[Callable[[], None]] = field(default_factory=list)
    blockers: list[tuple[Node, str | None]] = field(default_factory=list)
    split_steps: int = 0
    native_source: str | None = None
    linked: list[Linked] = field(default_factory=list)     # one per compiled unit
    workers: Workers | None = None
    blas: Blas | None = None


def _into_strided(fn, ins, outs, temps, strided):
    """Run ``fn`` on ``temps`` (``outs`` with contiguous stand-ins, made once, for the strided
    outputs at positions ``strided``), then copy the stand-ins into their views."""
    fn(ins, temps)
    for k in strided:
        np.copyto(outs[k], temps[k])


class CallMaker:
    """Makes the ``Calls`` of one build, memory plan and execution (``make``)."""

    def __init__(self, built: PlanBuild, memory: MemoryPlan, views: ValueViews, execution: Execution):
        self.built, self.memory, self.views, self.execution = built, memory, views, execution
        self.share_of: dict[int, int] = {}    # concurrent steps' own scratch sets, by id(node)
        self.out = Calls()

    def make(self, native: bool | None) -> Calls:
        built, execution, out, view = self.built, self.execution, self.out, self.views
        out.workers = Workers.shared(execution.threads) if execution.threads > 1 else None
        # core groups (device_groups.py): a group's numpy kernels run on its one thread, each
        # group's kernels on scratch of their own
        split_workers = None if execution.concurrent or execution.groups else out.workers
        group_of = {d: g for g, d in enumerate(execution.groups)}
        native_on = native if native is not None else toolchain.available()
        natives: list[tuple[int, NativeCall, list, list]] = []
        python: list[tuple[int, Node, list, list]] = []
        step_arrays: list[tuple[list, list]] = []
        for node in built.steps:
            if id(node) in self.memory.views:
                continue                          # a view: nothing to run
            ins, outs = [view(v, node) for v in node.inputs], [view(v) for v in node.outputs]
            where = built.placement.node(node)
            builder = KERNELS.native(node.op, where) if native_on else None
            with self.building(node):
                native_call = None
                if builder is not None:
                    sized = execution.run_time_sizes and KERNELS.native_takes_sizes(node.op, where)
                    native_call = builder(self.context(node, sized=sized), ins, outs)
                    if native_call is not None and sized:
                        native_call = with_sizes(native_call, built.bindings)
            if execution.concurrent:              # its own scratch: steps of a wave run at once
                self.share_of[id(node)] = len(out.calls) + 1
            elif group_of:
                self.share_of[id(node)] = group_share(group_of[where])
            if native_call is not None:
                natives.append((len(out.calls), native_call, ins, outs))
                out.impls.append("native")
            else:
                python.append((len(out.calls), node, ins, outs))
                out.impls.append("numpy")
            out.calls.append(None)
            out.steps.append(node)
            step_arrays.append((ins, outs))
        # native kernels run their own threads (OpenMP); numpy steps beside them run on one,
        # or the two pools would fight over the cores (measured: 4x slower steps)
        for p, node, ins, outs in python:
            on_host = built.placement.node(node).host_threads
            out.calls[p] = self.python_call(node, ins, outs, None if natives or not on_host else split_workers)
        out.run_calls = out.calls
        if natives:
            self.link(natives, split_workers, step_arrays)
        # the BLAS library is held to one thread while the plan runs: the plan's threads split the
        # work, and with one thread asked for, OpenBLAS's own threads (its default: every core)
        # made a one-thread numpy plan 10x slower beside a busy process
        on_host = natives or any(built.placement.node(node).host_threads for _, node, _, _ in python)
        out.blas = Blas.shared() if on_host else None
        return out

    def context(self, node: Node, sized: bool = False) -> KernelContext:
        """``sized``: symbolic dimensions as ``SizeInt`` numbers, for a builder whose kernels take
        them at run time (codegen/loops.py)."""
        built = self.built
        bindings, shapes = built.sized if sized else (built.bindings, built.shapes)
        return kernel_context(node, shapes, bindings, built.placement.node(node), self.execution,
                              share=self.share_of.get(id(node), 0), precision=built.graph.precision)

    @contextlib.contextmanager
    def building(self, node: Node):
        """A kernel that cannot allocate its scratch while it is built (an im2col buffer, index
        maps) is a UserError naming the layer and what numpy could not allocate."""
        try:
            yield
        except MemoryError as e:
            raise UserError(f"layer '{layer_of_scope(node.scope)}': its {node.op} kernel cannot allocate its "
                            f"scratch memory at {self.built.sizes_text()} ({str(e).splitlines()[0]})") from None

    def python_call(self, node, ins, outs, workers):
        out = self.out
        strided = [k for k, o in enumerate(outs) if isinstance(o, np.ndarray) and not o.flags.c_contiguous]
        with self.building(node):
            split = self.split(node, ins, outs) if workers and not strided else None
            if split:
                out.split_steps += 1
                return functools.partial(workers.run, *split)
            fn = self.built.entries[id(node)].factory(self.context(node))
        # host work a kernel does before each run, outside a captured graph (a random key's
        # upload); a kernel that must talk to the host inside the run says why it cannot be
        # captured (a loop whose body draws random numbers every step)
        hook = getattr(fn, "before_run", None)
        if hook is not None:
            out.before_run.append(hook)
        out.blockers.append((node, getattr(fn, "host_sync", None)))
        if strided:
            # a gathered concatenation's part whose native kernel was not built: the numpy
            # kernel writes contiguous arrays, copied into the strided view after each call
            temps = [np.empty(o.shape, o.dtype) if k in strided else o for k, o in enumerate(outs)]
            return functools.partial(_into_strided, fn, ins, outs, temps, strided)
        return functools.partial(fn, ins, outs)

    def link(self, natives, workers, step_arrays) -> None:
        """Compile the plan's native calls in units of at most ``codegen.native.MAX_UNIT_BYTES`` of C
        (usually one); consecutive native steps of one unit become one segment, called from
        Python once. Where the compiler fails or times out on a unit, or one kernel alone is over
        the limit, those steps run the numpy kernels after a one-line notice; where every unit
        fails, the whole plan runs them, split across the cores again."""
        out = self.out
        units = native_units([call.kernel for _, call, *_ in natives])
        failed: list[int] = []                    # positions (in natives) left to numpy
        segment_at: dict[int, tuple] = {}         # first step of a segment -> (its call, its steps)
        sources = []
        for unit in units:
            if unit.too_big is not None:
                notice(f"{unit.too_big}; running its steps with the numpy kernels", once=unit.too_big)
                failed += unit.members
                continue
            members = [natives[k] for k in unit.members]
            positions = [p for p, *_ in members]
            segments: list[list[int]] = []
            for k, p in enumerate(positions):
                if segments and positions[segments[-1][-1]] == p - 1:
                    segments[-1].append(k)
                else:
                    segments.append([k])
            try:
                linked = Linked([c for _, c, *_ in members], segments)
            except toolchain.NativeUnavailable as e:
                notice(f"{e}; running the numpy kernels", once=str(e))
                failed += unit.members
                continue
            out.linked.append(linked)
            sources.append(linked.source)
            for k, (p, call, _ins, _outs) in enumerate(members):
                out.calls[p] = linked.step(k, call)
            for j, seg in enumerate(segments):
                segment_at[positions[seg[0]]] = (linked.segment(j), len(seg))
        if not out.linked:
            out.split_steps = 0                   # every step numpy, split across cores again
            for p, (node, (ins, outs)) in enumerate(zip(out.steps, step_arrays)):
                out.calls[p] = self.python_call(node, ins, outs, workers)
                out.impls[p] = "numpy"
            return
        for k in failed:
            p = natives[k][0]
            ins, outs = step_arrays[p]
            out.calls[p] = self.python_call(out.steps[p], ins, outs, None)
            out.impls[p] = "numpy"
        out.native_source = "\n".join(sources)
        run_calls, at = [], 0
        while at < len(out.calls):
            if at in segment_at:
                segment, length = segment_at[at]
                run_calls.append(segment)
                at += length
            else:
                run_calls.append(out.calls[at])
                at += 1
        out.run_calls = run_calls

    def split(self, node: Node, ins, outs) -> tuple[list, object] | None:
        """One kernel call per thread on its own batch rows, for a large batch-parallel op;
        returns (shares, then) where ``then`` adds the shares of a batch-sum op."""
        kind = split_kind(node)
        if kind is None:
            return None
        mode, batched = kind
        shapes, bindings, threads = self.built.shapes, self.built.bindings, self.execution.threads
        rows = shapes[node.inputs[batched.index(True)].id][0]
        out_shape = shapes[node.outputs[0].id]
        if rows < threads:
            return None
        opdef = get_op(node.op)
        flops = bind_attrs(opdef.flops([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs),
                           bindings) if opdef.flops else 0
        if not worth_splitting(node, int(flops), int(np.prod(out_shape)) * np.dtype(node.outputs[0].dtype).itemsize):
            return None
        bounds = np.linspace(0, rows, threads + 1).astype(int)
        partials = [outs[0]] + [np.empty_like(outs[0]) for _ in range(threads - 1)] if mode == "sum" else None
        shares = []
        for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            def cut(shape, is_batched):
                return (hi - lo,) + tuple(shape[1:]) if is_batched else tuple(shape)
            in_shapes = [cut(shapes[v.id], b) for v, b in zip(node.inputs, batched)]
            out_shapes = [tuple(out_shape)] if mode == "sum" else [cut(out_shape, True)]
            ctx = KernelContext(node, bind_attrs(node.attrs, bindings), in_shapes, out_shapes,
                                kernel_dtype(node), self.built.placement.node(node), self.execution.runtime, np,
                                share=k, reuse_memory=self.execution.reuse_memory)
            fn = self.built.entries[id(node)].factory(ctx)
            share_ins = [a[lo:hi] if b else a for a, b in zip(ins, batched)]
            share_out = partials[k] if mode == "sum" else outs[0][lo:hi]
            shares.append(functools.partial(fn, share_ins, [share_out]))
        if mode != "sum":
            return shares, None

        def add_shares(total=outs[0], rest=partials[1:]):
            for part in rest:
                np.add(total, part, out=total)
        return shares, add_shares

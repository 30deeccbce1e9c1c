"""Where a plan's values live: memory.py's planner fed with a build's facts (which outputs are
views of their input, which concatenations can be gathered in place, which kernels write strided
images), each device's arena allocated after checking the host can hold it, and each value's
array in that memory (``ValueViews``).

``plan_build_memory`` is the one memory plan of a build: ``Plan`` allocates it,
``memory_figures`` only counts it, so the two cannot disagree.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..backend.devices import Device
from ..backend.placement import Placement
from ..ir.binding import bind_attrs
from ..ir.graph import Graph, Node
from ..ops.base import get_op
from .build import PlanBuild
from .memory import MemoryPlan, plan_memory

# ops whose native kernels write an output whose images are strided (blocked.output_image_stride)
STRIDED_WRITERS = ("conv2d_blocked", "to_blocked")


def view_offset(node: Node, shapes, dtypes, bindings) -> int | None:
    """Where output 0 starts in input 0's memory, in bytes, when it is a view of it: a reshape
    (row-major relabelling), or a slice that is one contiguous run (every axis before the sliced
    one has length 1, as the rows of a matrix or the columns of a one-row one); else None."""
    if get_op(node.op).alias:
        return 0
    if node.op == "slice":
        shape = shapes[node.inputs[0].id]
        axis = node.attrs["axis"] % len(shape)
        if all(d == 1 for d in shape[:axis]):
            inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
            start = bind_attrs(node.attrs["start"], bindings)
            return int(start) * inner * np.dtype(dtypes[node.inputs[0].id]).itemsize
    return None


def gather_offsets(node: Node, shapes, dtypes) -> tuple[list[int], int | None] | None:
    """For a concatenation that memory.py may gather in place: where each input's first image
    starts in the output, in bytes, and None where every axis before the joined one has length 1
    (each input one contiguous run: batch 1 along channels), else the bytes from one image of
    the output to the next (only the batch axis before the joined one: each input's images lie
    that far apart). None for anything else."""
    if node.op != "concat":
        return None
    out = node.outputs[0]
    shape = shapes[out.id]
    axis = node.attrs["axis"] % len(shape)
    if any(dtypes[v.id] != dtypes[out.id] for v in node.inputs):
        return None
    item = np.dtype(dtypes[out.id]).itemsize
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64)) * item
    offsets, at = [], 0
    for v in node.inputs:
        offsets.append(at * inner)
        at += shapes[v.id][axis]
    if all(d == 1 for d in shape[:axis]):
        return offsets, None
    if all(d == 1 for d in shape[1:axis]):
        return offsets, int(np.prod(shape[1:], dtype=np.int64)) * item
    return None


def writes_strided(node: Node, placement: Placement) -> bool:
    """Whether ``node``'s kernel writes a strided view of images (a gathered concatenation's part
    at a batch over 1): the blocked convolutions on the host, alone or with their store's
    epilogue, and the reorder into the blocked layout. Should the native kernel not be built,
    the plan's numpy call writes a contiguous copy and copies it into the view (calls.py)."""
    head = node.attrs.get("head") if node.op == "fused_epilogue" else node.op
    return head in STRIDED_WRITERS and placement.node(node).host_memory


def kept_values(graph: Graph, out_names: list[str]) -> set[int]:
    """The values alive to the end of a run: the outputs asked for and the weights' updates."""
    return {graph.outputs[n].id for n in out_names} | {v.id for v in graph.updates.values()}


def new_arena(device: Device, nbytes: int):
    return device.empty(nbytes)


def plan_build_memory(built: PlanBuild, out_names: list[str], reuse: bool,
                      allocate: Callable | None | bool = False) -> MemoryPlan:
    """The memory plan of ``built`` keeping ``out_names``. ``allocate``: False counts only (no
    arena); None allocates each device's arena anew; a callable ``allocate(device, nbytes)``
    gives it (plans that never run at the same time may share one: InferSession's buckets).
    ``reuse``: buffers of dead values reused (off for concurrent waves, whose branches must not
    hand buffers to each other, and with ``--disable plan_memory``)."""
    shapes, dtypes, steps = built.shapes, built.dtypes, built.steps
    if allocate is False:
        arena = False
    else:
        give = allocate or new_arena

        def arena(where: Device | None, nbytes: int):
            where = where or built.device
            if where.host_memory:             # a GPU's own allocator says when it cannot
                built.check_fits(steps, nbytes, "buffers")
            return give(where, nbytes)
    return plan_memory(
        steps, shapes, dtypes, built.fixed, kept_values(built.graph, out_names),
        inplace_pairs=lambda n: built.entries[id(n)].inplace_pairs(n),
        view_offset=lambda n: view_offset(n, shapes, dtypes, built.bindings),
        reuse=reuse, allocate=arena, device_of=built.placement.node,
        gather_offsets=lambda n: gather_offsets(n, shapes, dtypes),
        writes_strided=lambda n: writes_strided(n, built.placement))


class ValueViews:
    """Each value's array in a plan's memory; a host constant read on another device is copied
    there once, and that copy kept for every later reader."""

    def __init__(self, built: PlanBuild, memory: MemoryPlan):
        self.built, self.memory = built, memory
        self.on_device: dict[tuple, object] = {}

    def __call__(self, v, reader: Node | None = None):
        memory, built = self.memory, self.built
        st = memory.storage_of[v.id]
        arr = st.view(built.shapes[v.id], built.dtypes[v.id], memory.offset_of.get(v.id, 0),
                      memory.image_stride_of.get(v.id))
        where = built.placement.node(reader) if reader is not None else None
        if where is not None and not where.host_memory and isinstance(arr, np.ndarray):
            key = (v.id, where)
            if key not in self.on_device:
                self.on_device[key] = where.to_device(arr)
            arr = self.on_device[key]
        return arr

"""Memory planning over the final schedule: every value gets a storage, reusing memory whose
values are dead, and all storages are placed at offsets of one arena.

Step one decides which values share a storage: a view (a reshape, or a slice that is one
contiguous run of its input) shares its input's, at an offset; a kernel that may run in place
takes the storage (and offset) of an input of its own size that dies at this step (a weight's
storage only when the output is that weight's update, after the weight's last read). A
concatenation along channels is gathered where it can be: its producers write their outputs
straight into its storage, at their offsets, and the concatenation has nothing left to do (it
becomes a view, as a reshape does). At batch 1 each part is one contiguous run of the output
(SqueezeNet's fire modules, GoogLeNet's inception blocks); at a larger batch a part's images lie
an output image apart, so only producers whose kernels write such a strided view may take part
(the blocked convolutions and the reorder into the blocked layout), and only for parts nothing
else reads.
Step two places the storages: each lives from the step that first writes it to the step that
last reads it, and two storages whose lifetimes meet may not overlap in the arena. Placement is
greedy by size (largest first, each at the lowest offset that fits between the storages already
placed and alive at the same time), which stays close to the lower bound: the most bytes live at
any one step. With planning off (``--disable plan_memory``) every value gets memory of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

FOREVER = 1 << 60
ALIGN = 64                     # bytes: every storage starts on a cache line


@dataclass(eq=False)
class Storage:
    nbytes: int
    last: int = -1                 # index of the last step that reads it; FOREVER if kept
    external: np.ndarray | None = None   # weights and constants own their arrays
    update_of: int | None = None   # for a weight: the id of the value that replaces it
    first: int = -1                # index of the step that first writes it (-1: graph inputs)
    offset: int = 0                # position in the arena
    arena: np.ndarray | None = None
    device: object = None          # whose memory (a backend Device); None: the plan's one device

    def view(self, shape, dtype, offset: int = 0, image_stride: int | None = None) -> np.ndarray:
        """The array of a value living in this storage ``offset`` bytes from its start; with
        ``image_stride``, its images (axis 0) that many bytes apart, each contiguous (a part of
        a gathered concatenation at a batch over 1)."""
        if image_stride is not None:
            item = np.dtype(dtype).itemsize
            image = int(np.prod(shape[1:], dtype=np.int64)) * item
            span = (shape[0] - 1) * image_stride + image
            start = self.offset + offset
            flat = self.arena[start: start + span].view(dtype)
            inner = tuple(int(np.prod(shape[k + 1:], dtype=np.int64)) * item for k in range(1, len(shape)))
            return np.lib.stride_tricks.as_strided(flat, shape=tuple(shape), strides=(image_stride, *inner))
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if self.external is not None:
            if offset == 0 and self.external.size * self.external.itemsize == n:
                return self.external.reshape(shape)
            flat = self.external.reshape(-1).view(np.uint8)
            return flat[offset: offset + n].view(dtype).reshape(shape)
        start = self.offset + offset
        return self.arena[start: start + n].view(dtype).reshape(shape)


@dataclass
class MemoryPlan:
    storage_of: dict[int, Storage] = field(default_factory=dict)
    offset_of: dict[int, int] = field(default_factory=dict)   # bytes into its storage (views)
    views: set[int] = field(default_factory=set)               # id(node) of steps that are views
    image_stride_of: dict[int, int] = field(default_factory=dict)  # bytes between images of a strided part
    storages: list[Storage] = field(default_factory=list)     # the planned (non-external) ones
    peak_bytes: int = 0            # the arenas' size (all devices together)
    peak_by_device: dict = field(default_factory=dict)
    naive_bytes: int = 0           # one buffer per value (views excluded: they never own memory)
    lower_bound_bytes: int = 0     # the most bytes of values live at any one step
    gathered_concats: int = 0      # concatenations whose parts are written into their output

    def summary(self) -> dict[str, int]:
        return {"peak_bytes": self.peak_bytes, "naive_bytes": self.naive_bytes,
                "lower_bound_bytes": self.lower_bound_bytes, "gathered_concats": self.gathered_concats}


# a value's size is counted as at most this (64 PiB, more than any machine holds): the plan then
# refuses it against the memory there is, and its int64 sums of many such sizes cannot wrap
MAX_COUNTED_BYTES = 1 << 56


def exact_nbytes(shape, dtype) -> int:
    """The bytes of a value, in Python's integers: numpy's int64 product wraps (2^40 x 2^40
    values were 0 bytes) or cannot hold a dimension of 2^62 at all."""
    return max(math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize, 1)


def nbytes_of(shape, dtype) -> int:
    """The bytes a plan counts for a value: its size, or ``MAX_COUNTED_BYTES`` above that."""
    return min(exact_nbytes(shape, dtype), MAX_COUNTED_BYTES)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_memory(steps, shapes, dtypes, fixed: dict[int, Storage], kept: set[int],
                inplace_pairs: Callable, view_offset: Callable, reuse: bool = True,
                allocate: bool | Callable = True, device_of: Callable | None = None,
                gather_offsets: Callable | None = None, writes_strided: Callable | None = None) -> MemoryPlan:
    """steps: nodes in run order; shapes/dtypes: concrete per value id; fixed: storages of graph
    inputs, weights and constants; kept: value ids that must survive the whole run;
    inplace_pairs(node) -> {output position: input positions it may overwrite};
    view_offset(node) -> bytes into input 0 where output 0 starts as a view of it, or None.
    ``reuse=False`` gives every value its own memory; ``allocate=False`` only computes the
    figures, a callable ``allocate(device, nbytes)`` makes each device's arena (default: numpy).
    ``device_of(node)`` says where a node runs: its outputs live there, and storages of
    different devices are placed in different arenas (inputs' storages say their own).
    ``gather_offsets(node)`` -> (bytes into output 0 where each input's first image starts, the
    bytes from one image of the output to the next where the inputs' images are strided in it,
    else None) for a concatenation that may be gathered, or None; ``writes_strided(node)``: the
    node's kernel writes an output whose images are strided (default: none does)."""
    alias_at = {id(n): view_offset(n) for n in steps}

    def alias_ok(node) -> bool:
        return alias_at[id(node)] is not None

    last_use: dict[int, int] = {}
    for idx, node in enumerate(steps):
        for v in node.inputs:
            last_use[v.id] = idx
    for vid in kept:
        last_use[vid] = FOREVER
    # views share their source's storage: a weight may be overwritten in place only after the
    # last read of the weight or of any view of it
    root: dict[int, int] = {}
    for node in steps:
        if alias_ok(node):
            src = node.inputs[0].id
            root[node.outputs[0].id] = root.get(src, src)
    last_read: dict[int, int] = {}
    for vid, idx in last_use.items():
        r = root.get(vid, vid)
        last_read[r] = max(last_read.get(r, -1), idx)

    plan = MemoryPlan(dict(fixed))
    gathered, placed_in = (_gathered_concats(steps, shapes, dtypes, fixed, kept, gather_offsets, alias_ok, device_of,
                                             last_use, writes_strided or (lambda node: False))
                           if reuse and gather_offsets is not None else ({}, {}))
    plan.storages += list(gathered.values())
    plan.gathered_concats = len(gathered)
    live_values: list[tuple[int, int, int]] = []     # (first, last, nbytes) of every owning value
    for vid, st in fixed.items():
        if st.external is None:
            st.first = -1
            st.last = max(st.last, last_use.get(vid, -1))
            plan.storages.append(st)
            live_values.append((-1, st.last, st.nbytes))

    for idx, node in enumerate(steps):
        pairs = inplace_pairs(node) if reuse else {}
        taken: set[int] = set()
        for pos, v in enumerate(node.outputs):
            need = nbytes_of(shapes[v.id], dtypes[v.id])
            last = last_use.get(v.id, idx)
            st = None
            offset = 0
            if v.id in placed_in:               # written into a gathered concatenation's storage
                st, offset, image_stride = placed_in[v.id]
                if image_stride is not None:
                    plan.image_stride_of[v.id] = image_stride
            elif id(node) in gathered:          # the concatenation itself: its inputs are in place
                st = gathered[id(node)]
                plan.views.add(id(node))
                live_values.append((st.first, last, need))
            elif pos == 0 and alias_ok(node):
                st = plan.storage_of[node.inputs[0].id]
                offset = plan.offset_of.get(node.inputs[0].id, 0) + alias_at[id(node)]
                plan.views.add(id(node))
            else:
                live_values.append((idx, last, need))
                # a weight's own storage first (its update in place saves the copy back), then
                # any input that dies here
                order = sorted(pairs.get(pos, ()), key=lambda i: plan.storage_of[node.inputs[i].id].update_of != v.id)
                for i in order:
                    inp = node.inputs[i]
                    cand = plan.storage_of[inp.id]
                    if id(cand) in taken:
                        continue
                    same = shapes[inp.id] == shapes[v.id] and dtypes[inp.id] == dtypes[v.id]
                    if cand.external is not None:
                        writable = cand.update_of == v.id and last_read.get(root.get(inp.id, inp.id)) == idx
                    else:
                        writable = cand.last == idx
                    if same and writable:
                        st = cand
                        offset = plan.offset_of.get(inp.id, 0)
                        break
            if st is None:
                st = Storage(need, first=idx, device=device_of(node) if device_of else None)
                plan.storages.append(st)
            taken.add(id(st))
            plan.storage_of[v.id] = st
            plan.offset_of[v.id] = offset
            if st.external is None:
                st.last = max(st.last, last)

    plan.naive_bytes = sum(n for _first, _last, n in live_values)
    plan.lower_bound_bytes = _most_live(live_values, len(steps))
    by_device: dict = {}
    for st in plan.storages:
        by_device.setdefault(st.device, []).append(st)
    for device, group in by_device.items():
        if reuse:
            peak = _place(group)
        else:
            peak = 0
            for st in group:
                st.offset = peak
                peak += _aligned(st.nbytes)
        plan.peak_by_device[device] = peak
        if allocate:
            arena = allocate(device, peak) if callable(allocate) else np.empty(max(peak, 1), dtype=np.uint8)
            for st in group:
                st.arena = arena
    plan.peak_bytes = sum(plan.peak_by_device.values())
    return plan


def _gathered_concats(steps, shapes, dtypes, fixed, kept, gather_offsets, alias_ok, device_of, last_use,
                      writes_strided):
    """The concatenations whose producers can write into their output: ({id(node): its storage},
    {input value id: (that storage, byte offset, image stride in bytes or None)}). Every input
    must be the output of an earlier step that owns its memory (not a view, a graph input, a
    constant, or a value kept after the run), appear once, feed no other gathered concatenation,
    and live on the same device; where the parts' images are strided in the output, each must
    also be read by the concatenation alone and made by a kernel that writes strided images.
    Else the concatenation copies as before."""
    producer = {v.id: node for node in steps for v in node.outputs}
    step_of = {id(node): idx for idx, node in enumerate(steps)}
    readers: dict[int, int] = {}
    for node in steps:
        for v in node.inputs:
            readers[v.id] = readers.get(v.id, 0) + 1
    gathered: dict[int, Storage] = {}
    placed_in: dict[int, tuple[Storage, int, int | None]] = {}
    for idx, node in enumerate(steps):
        layout = gather_offsets(node)
        if layout is None or len(node.outputs) != 1 or node.outputs[0].id in placed_in:
            continue
        offsets, image_stride = layout
        ids = [v.id for v in node.inputs]
        where = device_of(node) if device_of else None

        def movable(vid) -> bool:
            src = producer.get(vid)
            if image_stride is not None and (readers.get(vid) != 1 or src is None or not writes_strided(src)):
                return False
            return (src is not None and vid not in fixed and vid not in kept and vid not in placed_in
                    and id(src) not in gathered and not alias_ok(src)
                    and (device_of is None or device_of(src) == where))
        if len(set(ids)) != len(ids) or not all(movable(vid) for vid in ids):
            continue
        out = node.outputs[0]
        first = min(step_of[id(producer[vid])] for vid in ids)
        st = Storage(nbytes_of(shapes[out.id], dtypes[out.id]), first=first, device=where)
        st.last = max([last_use.get(out.id, idx)] + [last_use.get(vid, idx) for vid in ids])
        gathered[id(node)] = st
        for vid, offset in zip(ids, offsets):
            placed_in[vid] = (st, offset, image_stride)
    return gathered, placed_in


def _most_live(values: list[tuple[int, int, int]], n_steps: int) -> int:
    """The most bytes of values alive at one step (a value is alive from its writing step to its
    last read, both included; graph inputs from before the first step)."""
    delta = np.zeros(n_steps + 2, dtype=np.int64)
    for first, last, n in values:
        start = first + 1                       # shift by one: graph inputs start at -1
        stop = min(last, n_steps) + 1 + 1
        delta[start] += n
        delta[min(stop, n_steps + 1)] -= n
    return int(np.cumsum(delta).max(initial=0))


def _place(storages: list[Storage]) -> int:
    """Offsets for storages, greedy by size: the largest first, each at the lowest offset where it
    overlaps no storage already placed whose lifetime meets its own. Returns the arena size."""
    order = sorted(storages, key=lambda s: (-s.nbytes, s.first))
    placed: list[Storage] = []
    peak = 0
    for st in order:
        size = _aligned(st.nbytes)
        busy = sorted((p.offset, p.offset + _aligned(p.nbytes)) for p in placed
                      if p.first <= st.last and st.first <= p.last)
        offset = 0
        for lo, hi in busy:
            if lo - offset >= size:
                break
            offset = max(offset, hi)
        st.offset = offset
        placed.append(st)
        peak = max(peak, offset + size)
    return peak

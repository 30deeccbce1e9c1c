"""Memory planning: assigns every value a storage, reusing storages whose values are dead.

Rules, in order: a view op (reshape) shares its input's storage; an in-place-capable kernel
takes the storage of an input of its own size that dies at this node (a weight's storage only
when the output is that weight's update); otherwise the smallest free storage that fits, or a
new one. Storage liveness is the last use of any value living in it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FOREVER = 1 << 60


@dataclass(eq=False)
class Storage:
    nbytes: int
    last: int = -1                 # index of the last step that reads it; FOREVER if kept
    external: np.ndarray | None = None   # weights and folded constants own their arrays
    buffer: np.ndarray | None = None
    update_of: int | None = None   # for a weight: the id of the value that replaces it

    def view(self, shape, dtype) -> np.ndarray:
        if self.external is not None:
            return self.external.reshape(shape)
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.buffer[:n].view(dtype).reshape(shape)


@dataclass
class MemoryPlan:
    storage_of: dict[int, Storage] = field(default_factory=dict)
    arena: list[Storage] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return sum(s.nbytes for s in self.arena)


def nbytes_of(shape, dtype) -> int:
    return max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)


def plan_memory(steps, shapes, dtypes, fixed: dict[int, Storage], kept: set[int],
                inplace_ok, alias_ok) -> MemoryPlan:
    """steps: nodes in run order; shapes/dtypes: concrete per value id; fixed: storages of
    graph inputs, weights and constants; kept: value ids that must survive the whole run;
    inplace_ok(node) / alias_ok(node): what the node's kernel allows."""
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
    for vid, st in fixed.items():
        if st.external is None:
            st.last = max(st.last, last_use.get(vid, -1))
            plan.arena.append(st)
    free: list[Storage] = []

    def take(nbytes: int) -> Storage:
        fits = [s for s in free if s.nbytes >= nbytes]
        if fits:
            best = min(fits, key=lambda s: s.nbytes)
            free.remove(best)
            return best
        st = Storage(nbytes)
        plan.arena.append(st)
        return st

    for idx, node in enumerate(steps):
        for pos, v in enumerate(node.outputs):
            need = nbytes_of(shapes[v.id], dtypes[v.id])
            st = None
            if pos == 0 and alias_ok(node):
                st = plan.storage_of[node.inputs[0].id]
            elif pos == 0 and inplace_ok(node):
                for inp in node.inputs:
                    cand = plan.storage_of[inp.id]
                    same = shapes[inp.id] == shapes[v.id] and dtypes[inp.id] == dtypes[v.id]
                    dies_here = cand.last == idx
                    if cand.external is not None:
                        writable = cand.update_of == v.id and last_read.get(root.get(inp.id, inp.id)) == idx
                    else:
                        writable = dies_here
                    if same and writable:
                        st = cand
                        break
            if st is None:
                st = take(need)
            plan.storage_of[v.id] = st
            if st.external is None:
                st.last = max(st.last, last_use.get(v.id, idx))
        for st in {id(plan.storage_of[v.id]): plan.storage_of[v.id] for v in list(node.inputs) + node.outputs}.values():
            if st.external is None and st.last <= idx and st not in free:
                free.append(st)

    for st in plan.arena:
        st.buffer = np.empty(st.nbytes, dtype=np.uint8)
    return plan

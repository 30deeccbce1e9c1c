"""Scheduling the gradient all-reduce of data-parallel training (optim/data_parallel.py).

The graph's node order is the order a plan runs its steps. Each bucket's allreduce_start moves
up to right after the last node its gradients need, so that the sum runs while the rest of the
backward pass computes; each allreduce_wait moves down to right before the first node that
reads its result (an update of that bucket's weights), so that only that update waits. With
``overlap`` off (a measuring aid) the wait follows its start at once.

Every rank runs this pass on the same graph and gets the same order, so the ranks issue their
collectives alike, as MPI requires.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .context import PassContext


def schedule_collectives(graph: Graph, ctx: PassContext) -> bool:
    """Data-parallel training: each gradient bucket's ``allreduce_start`` moves up to right after
    the last gradient it sums, and its ``allreduce_wait`` down to right before the first update
    that reads the sum, so the all-reduce overlaps the rest of the backward pass."""
    starts = [n for n in graph.nodes if n.op == "allreduce_start"]
    if not starts:
        return False
    moving = {id(n) for n in graph.nodes if n.op in ("allreduce_start", "allreduce_wait")}
    rest = [n for n in graph.nodes if id(n) not in moving]
    position = {o.id: i for i, node in enumerate(rest) for o in node.outputs}
    wait_of = {n.inputs[0].producer: n for n in graph.nodes if n.op == "allreduce_wait"}
    after: dict[int, list] = {}               # index in rest -> collectives right after it
    before: dict[int, list] = {}              # index in rest -> collectives right before it
    for start in starts:
        ready = max((position.get(v.id, -1) for v in start.inputs), default=-1)
        after.setdefault(ready, []).append(start)
        wait = wait_of[start]
        if not wait.attrs.get("overlap", True):
            after[ready].append(wait)
            continue
        results = {o.id for o in wait.outputs}
        first = next((i for i, node in enumerate(rest) if i > ready and any(v.id in results for v in node.inputs)),
                     len(rest))
        before.setdefault(first, []).append(wait)
    order = list(after.get(-1, []))
    for i, node in enumerate(rest):
        order.extend(before.get(i, []))
        order.append(node)
        order.extend(after.get(i, []))
    order.extend(before.get(len(rest), []))
    moved = [id(n) for n in order] != [id(n) for n in graph.nodes]
    if moved:
        ctx.note(f"{len(starts)} gradient bucket(s): each all-reduce starts after its last gradient "
                 f"and is waited for before its first update")
    graph.nodes = order
    return moved

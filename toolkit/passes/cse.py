"""Common-subexpression elimination over pure ops, forward and backward alike (gradient rules
often recompute what the forward pass already has: sigmoid(x), reshapes of the same weight, ...)."""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ops.base import get_op
from .context import PassContext
from .rewrite import CONSTANT_OPS, Substitution

# a + b == b + a and a * b == b * a exactly in IEEE arithmetic (and with numpy broadcasting)
COMMUTATIVE = frozenset({"add", "mul"})


def _key(node: Node, where) -> tuple | None:
    ids = [v.id for v in node.inputs]
    if node.op in COMMUTATIVE:
        ids.sort()
    key = (node.op, tuple(ids), tuple(sorted(node.attrs.items())), where)
    try:
        hash(key)
    except TypeError:           # an attribute that cannot be compared cheaply: leave the node alone
        return None
    return key


def eliminate_common(graph: Graph, ctx: PassContext) -> bool:
    """Pure nodes with the same op, inputs and attributes compute the same values: the first stays
    and the later ones' readers use it, where both run on one device (constants are
    dedup_constants' job; random ops never merge)."""
    seen: dict[tuple, Node] = {}
    subst = Substitution()
    kept: list[Node] = []
    merged = 0
    placement = ctx.placement(graph)
    for node in graph.nodes:
        subst.apply_to_node(node)
        if node.op in CONSTANT_OPS or not get_op(node.op).pure:
            kept.append(node)
            continue
        key = _key(node, placement.node(node) if placement.by_layer else None)
        first = seen.get(key) if key is not None else None
        if first is not None:
            for out, same in zip(node.outputs, first.outputs):
                subst.replace(out, same)
            merged += 1
            continue
        if key is not None:
            seen[key] = node
        kept.append(node)
    graph.nodes = kept
    subst.apply(graph)
    if merged:
        ctx.note(f"eliminate_common: {merged} repeated computation(s) reuse an earlier result")
    return bool(merged)

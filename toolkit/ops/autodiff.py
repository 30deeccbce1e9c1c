"""Reverse-mode autodiff as a graph transformation: appends backward ops built from each op's
gradient rule (first putting in a forward node's replacement where its op saves residuals).
Fan-out gradients are summed; only nodes between the requested values and the objective get
gradient work (so frozen weights and data inputs cost nothing).
"""
from __future__ import annotations

from ..ir.graph import FLOAT_DTYPES, Graph, Node, Value
from .base import Builder, ResidualsFn, get_op


class AutodiffError(ValueError):
    """The objective depends on a requested value through an op without a gradient rule."""


def _forward_reach(graph: Graph, sources: list[Value]) -> set[int]:
    """Ids of float values that depend on any source."""
    reach = {v.id for v in sources}
    for node in graph.nodes:
        if any(v.id in reach for v in node.inputs):
            reach.update(o.id for o in node.outputs if o.dtype in FLOAT_DTYPES)
    return reach


def differentiate(graph: Graph, objective: Value, wrt: list[Value]) -> dict[int, Value | None]:
    """Append d(objective)/d(v) for each v in ``wrt``; returns {v.id: gradient or None if zero}."""
    if objective.shape != ():
        raise AutodiffError(f"the objective must be a scalar, got shape {objective.shape}")
    one = Builder(graph, "autodiff").scalar(1.0, objective.dtype)
    return backprop(graph, [(objective, one)], wrt)


def _with_residuals(graph: Graph, node: Node, residuals: ResidualsFn) -> Node:
    """The node its op's ``residuals`` hook makes (the same outputs and extra ones its gradient
    rule reads), put in ``node``'s place in ``graph`` and made its outputs' producer; ``node``
    itself when the hook has nothing to add. ``node`` is left as it was."""
    new = residuals(node)
    if new is None:
        return node
    if new.outputs[:len(node.outputs)] != node.outputs:
        raise RuntimeError(f"op {node.op}: the residuals hook's node does not start with the node's outputs")
    graph.nodes[next(i for i, n in enumerate(graph.nodes) if n is node)] = new
    for v in node.outputs:
        v.producer = new
    return new


def backprop(graph: Graph, seeds: list[tuple[Value, Value]], wrt: list[Value]) -> dict[int, Value | None]:
    """Append the vector-Jacobian product of ``graph``'s nodes: each (value, gradient) seed is
    propagated back to ``wrt``; returns {v.id: the summed gradient, or None where it is zero}.
    (A control-flow body's gradient is built this way, seeded by the gradients of its outputs.)"""
    depends = _forward_reach(graph, wrt)
    forward_nodes = list(graph.nodes)
    pending: dict[int, list[Value]] = {}
    for v, g in seeds:
        pending.setdefault(v.id, []).append(g)

    def total(b: Builder, v: Value) -> Value | None:
        parts = pending.pop(v.id, None)
        if not parts:
            return None
        return b.add_all(parts)

    for node in reversed(forward_nodes):
        if not any(o.id in pending for o in node.outputs):
            continue
        if not any(v.id in depends for v in node.inputs):
            for o in node.outputs:
                pending.pop(o.id, None)
            continue
        opdef = get_op(node.op)
        if opdef.grad is None:
            raise AutodiffError(f"layer '{node.scope}': op '{node.op}' has no gradient rule, "
                                "but the objective depends on it")
        if opdef.residuals is not None:
            node = _with_residuals(graph, node, opdef.residuals)
        b = Builder(graph, f"{node.scope}.grad" if node.scope else "grad")
        gouts = [total(b, o) for o in node.outputs]
        gins = opdef.grad(b, node, gouts)
        for v, g in zip(node.inputs, gins):
            if g is not None and v.id in depends:
                pending.setdefault(v.id, []).append(g)

    b = Builder(graph, "autodiff")
    return {v.id: total(b, v) for v in wrt}

"""FLOP counts of a graph (or of one layer's nodes), from each op's own count: a Dim, symbolic
in the batch where the graph is."""
from __future__ import annotations

from ..ir.dims import Dim
from ..ir.graph import Graph
from .base import get_op


def graph_flops(graph: Graph, scope: str | None = None) -> Dim:
    total: Dim = 0
    for node in graph.nodes:
        if scope is not None and node.scope != scope:
            continue
        opdef = get_op(node.op)
        if opdef.flops is not None:
            total = total + opdef.flops([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs)
    return total

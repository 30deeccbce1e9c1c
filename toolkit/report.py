"""Per-layer and per-graph figures for reports: output shapes, parameter counts, FLOPs."""
from __future__ import annotations

from .ir.dims import Dim
from .ir.graph import Graph
from .ops.base import get_op


def graph_flops(graph: Graph, scope: str | None = None) -> Dim:
    total: Dim = 0
    for node in graph.nodes:
        if scope is not None and node.scope != scope:
            continue
        opdef = get_op(node.op)
        if opdef.flops is not None:
            total = total + opdef.flops([v.type for v in node.inputs], [v.type for v in node.outputs], node.attrs)
    return total


def human(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}" if isinstance(n, float) else str(n)


def format_count(d: Dim) -> str:
    """FLOPs or sizes as '2.29M*N' for symbolic counts, '1.5k' for fixed ones."""
    if isinstance(d, int):
        return human(d)
    parts = []
    for mono, coeff in sorted(d.terms.items(), key=lambda mc: -len(mc[0])):
        sym = "*".join(mono)
        parts.append(f"{human(coeff)}*{sym}" if mono else human(coeff))
    return " + ".join(parts)


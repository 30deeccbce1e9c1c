"""Dead-code elimination: keep only nodes that an output or a weight update depends on."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.live import keep_live
from .context import PassContext


def eliminate_dead_code(graph: Graph, ctx: PassContext | None = None) -> bool:
    """Drop nodes, inputs and weights that no output or update depends on (ir/live.py), here
    after the passes that leave work nothing needs (a fold, a fusion, a branch taken)."""
    return keep_live(graph)

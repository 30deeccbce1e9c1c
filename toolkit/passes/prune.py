"""Dead-code elimination: keep only nodes that an output or a weight update depends on."""
from __future__ import annotations

from ..ir.graph import Graph
from .context import PassContext


def eliminate_dead_code(graph: Graph, ctx: PassContext | None = None) -> bool:
    """Drop nodes, inputs and weights that no output or update depends on (random ops too:
    unused randomness has no observable effect). A control-flow body keeps its inputs: they are
    its node's interface (passes/control.py drops the unused ones from both sides). Needs no
    context: the front end prunes every phase's graph with it."""
    before = (len(graph.nodes), len(graph.weights), len(graph.inputs))
    live = {v.id for v in graph.outputs.values()} | {v.id for v in graph.updates.values()}
    kept = []
    for node in reversed(graph.nodes):
        if any(o.id in live for o in node.outputs):
            kept.append(node)
            live.update(v.id for v in node.inputs)
    graph.nodes = kept[::-1]
    graph.weights = {k: w for k, w in graph.weights.items() if w.value.id in live or k in graph.updates}
    if graph.phase != "body":
        graph.inputs = {k: v for k, v in graph.inputs.items() if v.id in live}
    return (len(graph.nodes), len(graph.weights), len(graph.inputs)) != before


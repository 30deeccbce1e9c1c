"""A graph cut down to what its outputs and weight updates need: the nodes, inputs and weights
they depend on. The front end hands out each phase's graph so cut (its inputs are those its
outputs read), and the pass pipeline's ``eliminate_dead_code`` cuts again what other passes
leave behind."""
from __future__ import annotations

from .dims import Sym
from .graph import Graph


def keep_live(graph: Graph) -> bool:
    """Drop nodes, inputs and weights that no output or update depends on (random ops too:
    unused randomness has no observable effect); whether anything was dropped. A control-flow
    body keeps its inputs: they are its node's interface (passes/control.py drops the unused
    ones from both sides). An input whose data nothing reads stays where it alone gives a live
    shape a symbol's value."""
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
        graph.inputs = _inputs_kept(graph, live)
    return (len(graph.nodes), len(graph.weights), len(graph.inputs)) != before


def _symbols(values) -> set[str]:
    return {name for v in values for d in v.shape if isinstance(d, Sym) for name in d.symbols}


def _inputs_kept(graph: Graph, live: set[int]) -> dict:
    """The inputs a live node reads, and those whose shape alone a live value's shape depends on
    (an ONNX model's Shape of an input whose data nothing reads): an input is where a symbolic
    dimension gets its value, and a shape left without one fails when the graph is planned."""
    kept = {k for k, v in graph.inputs.items() if v.id in live}
    bound = _symbols(graph.inputs[k] for k in kept)
    wanted = _symbols([o for n in graph.nodes for o in n.outputs] + list(graph.outputs.values())) - bound
    for name, v in graph.inputs.items():
        given = _symbols([v]) & wanted
        if name not in kept and given:
            kept.add(name)
            wanted -= given
    return {k: v for k, v in graph.inputs.items() if k in kept}

"""The graph verifier: structural invariants every pass must keep.

Checks: each value is defined once, before its uses (topological order); node types equal what
the op's shape rule gives for its inputs; outputs and updates name defined values; an update
has its weight's type. Raises VerifyError naming the node and what is wrong.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .base import get_op
from .control import bodies_of


class VerifyError(AssertionError):
    """The graph breaks an IR invariant (a toolkit bug, never a user error)."""


def verify(graph: Graph) -> None:
    defined: set[int] = set()
    for v in graph.graph_values():
        if v.id in defined:
            raise VerifyError(f"value {v!r} ({v.name}) is declared twice")
        defined.add(v.id)
    for index, node in enumerate(graph.nodes):
        where = f"node {index} ({node.op} in '{node.scope}')"
        for v in node.inputs:
            if v.id not in defined:
                raise VerifyError(f"{where} reads {v!r}, which is not defined above it")
        try:
            expected = get_op(node.op).infer([v.type for v in node.inputs], node.attrs)
        except Exception as e:  # the shape rule itself rejects the inputs
            raise VerifyError(f"{where}: its shape rule rejects the inputs: {e}") from None
        if [o.type for o in node.outputs] != expected:
            got = ", ".join(str(o.type) for o in node.outputs)
            want = ", ".join(str(t) for t in expected)
            raise VerifyError(f"{where} outputs {got}, but its shape rule gives {want}")
        _verify_bodies(node, where)
        for o in node.outputs:
            if o.id in defined:
                raise VerifyError(f"{where} redefines {o!r}")
            if o.producer is not node:
                raise VerifyError(f"{where}: output {o!r} does not point back at its producer")
            defined.add(o.id)
    for name, v in graph.outputs.items():
        if v.id not in defined:
            raise VerifyError(f"output '{name}' is {v!r}, which no node defines")
    for name, v in graph.updates.items():
        if name not in graph.weights:
            raise VerifyError(f"update of unknown weight '{name}'")
        if v.id not in defined:
            raise VerifyError(f"update of '{name}' is {v!r}, which no node defines")
        if v.type != graph.weights[name].value.type:
            raise VerifyError(f"update of '{name}' has type {v.type}, the weight is {graph.weights[name].value.type}")


def _verify_bodies(node, where: str) -> None:
    """A control-flow node's bodies are valid graphs; since every value a graph reads must be
    defined in it, this also holds them closed (nothing read from outside)."""
    for body in bodies_of(node):
        try:
            verify(body.graph)
        except VerifyError as e:
            raise VerifyError(f"{where}, in its body: {e}") from None

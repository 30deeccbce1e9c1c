"""The reference interpreter: runs a graph node by node with each op's reference implementation.

Slow and allocation-heavy on purpose; it is the oracle that plans, kernels and passes are
tested against.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..ir.binding import bind_attrs, bind_symbols
from ..ir.graph import Graph
from .base import get_op


def interpret(graph: Graph, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
              rng: np.random.Generator | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Returns (outputs by name, weight updates by name)."""
    bindings = bind_symbols(graph, {k: np.shape(v) for k, v in inputs.items()})
    env: dict[int, np.ndarray] = {}
    for name, v in graph.inputs.items():
        env[v.id] = np.asarray(inputs[name], dtype=v.dtype)
    for name, w in graph.weights.items():
        env[w.value.id] = np.asarray(weights[name], dtype=w.value.dtype)
    rng = rng or np.random.default_rng(0)
    run_nodes(graph, env, bindings, rng)
    outputs = {name: env[v.id] for name, v in graph.outputs.items()}
    updates = {name: env[v.id] for name, v in graph.updates.items()}
    return outputs, updates


def run_nodes(graph: Graph, env: dict, bindings: Mapping[str, int], rng: np.random.Generator) -> None:
    """Run ``graph``'s nodes on ``env`` (value id -> array, holding the graph's own values),
    adding every node's results to it."""
    for node in graph.nodes:
        opdef = get_op(node.op)
        attrs = bind_attrs(node.attrs, bindings)
        if not opdef.pure:
            attrs = dict(attrs, rng=rng)
        result = opdef.reference(*[env[v.id] for v in node.inputs], **attrs)
        results = result if isinstance(result, tuple) else (result,)
        for v, r in zip(node.outputs, results):
            r = np.asarray(r, dtype=v.dtype)
            expected = v.type.concrete(bindings)
            if r.shape != expected:
                raise AssertionError(f"{node.op} in {node.scope}: reference gave {r.shape}, type says {expected}")
            env[v.id] = r


def run_body(graph: Graph, args: list, bindings: Mapping[str, int], rng: np.random.Generator) -> list:
    """A control-flow body on ``args`` (in the order of its inputs): its outputs, in order."""
    env = {v.id: np.asarray(a, dtype=v.dtype) for v, a in zip(graph.inputs.values(), args)}
    run_nodes(graph, env, bindings, rng)
    return [env[v.id] for v in graph.outputs.values()]

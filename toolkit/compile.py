"""From a Net to executable graphs: the infer/test forward graph, and the train step
(forward + generated backward + solver updates) as one graph."""
from __future__ import annotations

from .autodiff import differentiate
from .frontend import OBJECTIVE, Net
from .ir.graph import Graph, Value
from .ops.base import Builder
from .passes.prune import eliminate_dead_code


def forward_graph(net: Net, phase: str = "infer", dtype: str | None = None,
                  outputs: list[str] | None = None) -> Graph:
    return net.graph(phase, dtype, outputs)


def add_gradients(graph: Graph) -> dict[str, Value]:
    """Append the backward pass of the train graph; returns {weight name: gradient}.
    Weights with lr_mult 0 (frozen) and state buffers get no gradient work."""
    trainable = [w for w in graph.weights.values() if w.trainable and w.lr_mult != 0]
    grads = differentiate(graph, graph.outputs[OBJECTIVE], [w.value for w in trainable])
    return {w.name: grads[w.value.id] for w in trainable if grads[w.value.id] is not None}


def add_sgd_updates(graph: Graph, grads: dict[str, Value], lr: float) -> None:
    """Plain SGD as update ops: w <- w - lr * lr_mult * dw (the solver issue adds the others)."""
    for name, g in grads.items():
        w = graph.weights[name]
        b = Builder(graph, f"{w.layer}.sgd")
        graph.updates[name] = b.sub(w.value, b.scale(g, lr * w.lr_mult))


def train_step_graph(net: Net, lr: float = 0.01, dtype: str | None = None) -> Graph:
    graph = net.graph("train", dtype)
    grads = add_gradients(graph)
    add_sgd_updates(graph, grads, lr)
    return eliminate_dead_code(graph)

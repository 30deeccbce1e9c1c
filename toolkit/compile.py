"""From a Net to optimised executable graphs: the forward graph of a phase, and the train step
(forward + generated backward + solver update ops) as one graph; both through the pass pipeline."""
from __future__ import annotations

from .autodiff import differentiate
from .frontend import OBJECTIVE, Net
from .ir.graph import Graph, Value
from .passes.pipeline import run_pipeline
from .train.solvers import SolverConfig, add_solver


def forward_graph(net: Net, phase: str = "infer", dtype: str | None = None,
                  outputs: list[str] | None = None, disable: tuple[str, ...] = ()) -> Graph:
    return run_pipeline(net.graph(phase, dtype, outputs), disable)


def add_gradients(graph: Graph) -> dict[str, Value]:
    """Append the backward pass of the train graph; returns {weight name: gradient}.
    Weights with lr_mult 0 (frozen) and state buffers get no gradient work."""
    trainable = [w for w in graph.weights.values() if w.trainable and w.lr_mult != 0]
    grads = differentiate(graph, graph.outputs[OBJECTIVE], [w.value for w in trainable])
    return {w.name: grads[w.value.id] for w in trainable if grads[w.value.id] is not None}


def solver_config(net: Net) -> SolverConfig:
    """The net's own solver (its train section), or plain SGD when it has none."""
    if net.spec.train is not None:
        return SolverConfig.from_spec(net.spec.train.solver)
    return SolverConfig()


def train_step_graph(net: Net, solver: SolverConfig | None = None, dtype: str | None = None,
                     disable: tuple[str, ...] = ()) -> Graph:
    """Forward, backward and the solver's updates; per-step scalars (``@lr``, ...) are inputs."""
    graph = net.graph("train", dtype)
    add_solver(graph, add_gradients(graph), solver or solver_config(net))
    return run_pipeline(graph, disable)

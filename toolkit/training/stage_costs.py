"""What the pipeline's partitioner weighs beyond the graph (training/stage_balance.py): each layer's time
a micro-batch as this machine's cost model measures it, and the memory a rank may hold.

A layer's time is the sum of its nodes' times in the one-process train step at a micro-batch's
rows, optimised as a run compiles it, from the measured cost model (placement/cost.py: the
kernel timings ``toolkit compile --place auto`` and ``--explain`` use, measured once per machine
and cached; measured here where the cache lacks them). A fused node (scope ``conv1+relu1``)
counts for the first layer it names: the convolution or product it starts with is most of its
time. Where the model cannot time the step (a device it does not measure), the partitioner
weighs FLOPs instead.

A rank's memory limit is ``train.distributed.stage_memory_mb`` where the net sets it, else the
memory this process may still allocate (hostmem.py) split evenly among the job's ranks, all
taken to run on this machine; None where the system says neither.
"""
from __future__ import annotations

from ..compile import optimize, train_graph
from ..errors import UserError
from ..hostmem import available_memory
from .stage_balance import layer_of

MEASURED = "measured time"


def measured_layer_seconds(net, solver, rows: int, device) -> dict[str, float] | None:
    """Each layer's measured seconds a micro-batch of ``rows`` in the train step, or None where
    the measured model cannot time it."""
    from ..placement.cost import measured_model
    graph = optimize(train_graph(net, solver), device=device)
    bindings = {s: rows for s in graph.symbols()}
    try:
        model = measured_model(graph, bindings, device)
        layers = {layer.name for layer in net.spec.layers}
        seconds: dict[str, float] = {}
        for node in graph.nodes:
            layer = layer_of(node.scope, layers) or layer_of(node.scope.split("+")[0], layers)
            if layer is not None:
                seconds[layer] = seconds.get(layer, 0.0) + model.op_seconds(node, device)
    except (KeyError, UserError):
        return None
    return seconds


def stage_memory_limit(distributed, ranks: int) -> int | None:
    """The bytes a pipeline rank may hold for its stage (see the module's docstring)."""
    if distributed.stage_memory_mb is not None:
        return int(distributed.stage_memory_mb * 2**20)
    available = available_memory()
    return None if available is None else available // max(ranks, 1)

"""place_devices: cut the graph where a value crosses from one device to another and insert a
transfer there, once per value and destination (every reader on that device shares it).

Where each node runs is backend/placement.py's rule (its layer's ``device:``, else the one the
graph is compiled for).
Graph inputs arrive on the graph's device, weights live with the layer that owns them, and
constants are copied to every device that reads them when a plan is built, so they need no
transfer. A weight's new value (a solver update, running statistics) is moved back to the
weight's device when it is computed elsewhere. The note says how many transfers there are and
how many bytes they move per step."""
from __future__ import annotations

from ..backend.placement import Placement
from ..ir.dims import format_dim, product
from ..ir.graph import Graph, Node, Value
from .context import PassContext
from .rewrite import CONSTANT_OPS

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "int8": 1, "uint8": 1,
             "bool": 1}


def _home(where: Placement, v: Value, weight_of: dict[int, object]):
    """The device a value lives on, or None for a constant (it lives wherever it is read)."""
    if v.producer is not None:
        return None if v.producer.op in CONSTANT_OPS else where.node(v.producer)
    if v.id in weight_of:
        return where.weight(weight_of[v.id])
    return where.default


def transfer_bytes(nodes) -> object:
    """Bytes the transfers among ``nodes`` move per step (a Dim: symbolic in the batch)."""
    total = 0
    for n in nodes:
        if n.op == "transfer":
            total = total + product(n.outputs[0].shape) * _ITEMSIZE[n.outputs[0].dtype]
    return total


def place_devices(graph: Graph, ctx: PassContext) -> bool:
    """A ``transfer`` node wherever a node reads a value that lives on another device (each
    layer's ``device:``, else the device the graph is compiled for), one per value and
    destination; a weight's new value computed elsewhere is moved back to the weight's device."""
    where = ctx.placement(graph)
    weight_of = {w.value.id: w for w in graph.weights.values()}
    made: dict[tuple[int, object], Value] = {}
    nodes: list[Node] = []

    def moved(v: Value, src, dst, scope: str) -> Value:
        key = (v.id, dst)
        if key not in made:
            node = Node("transfer", [v], {"src": src.name, "dst": dst.name}, scope)
            node.outputs = [Value(v.type, node)]
            nodes.append(node)
            made[key] = node.outputs[0]
        return made[key]

    for node in graph.nodes:
        if node.op != "transfer":
            here = where.node(node)
            for i, v in enumerate(node.inputs):
                home = _home(where, v, weight_of)
                if home is not None and home != here:
                    node.inputs[i] = moved(v, home, here, node.scope)
        nodes.append(node)
    for name, v in list(graph.updates.items()):
        home, target = _home(where, v, weight_of), where.weight(graph.weights[name])
        if home is not None and home != target:
            graph.updates[name] = moved(v, home, target, f"{graph.weights[name].layer}.update")
    graph.nodes = nodes
    added = [n for n in nodes if n.op == "transfer"]
    if made:
        pairs = sorted({f"{n.attrs['src']} -> {n.attrs['dst']}" for n in added})
        ctx.note(f"place_devices: {len(made)} transfer(s) moving {format_dim(transfer_bytes(added))} bytes "
                 f"per step ({', '.join(pairs)})")
    return bool(made)

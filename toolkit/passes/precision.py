"""Precision rewrites: autocast (mixed precision) and half types stored as float32.

``autocast(graph, low)`` runs on a forward graph before the backward pass is generated, as
PyTorch's autocast does at run time, by op class:

- ``LOW_OPS`` (GEMMs and convolutions, where half precision pays): their float inputs are cast
  to ``low``; the weights stay float32 (the master copy) and are cast on the way in.
- ``FLOAT32_OPS`` (softmax, losses, reductions, exp/log): their inputs are cast up to float32,
  so normalisation statistics and losses accumulate in float32.
- every other op runs in its inputs' widest type, except that a weight or a constant meeting a
  half-precision activation is cast down to it (a bias added to a GEMM's output stays in half
  precision, as ``torch.nn.Linear`` does under autocast).

The generated backward then follows the casts: the gradient of a cast is the cast back, so a
half-precision GEMM gets a half-precision gradient GEMM and the weight's gradient arrives in
float32. Each cast is made once per (value, dtype) and reused by every consumer.

``store_half_as_float32(graph)`` prepares a graph for a device without half-precision arrays
(numpy has float16 arithmetic but no fast one, and no bfloat16): every half-typed value is
stored as float32, and every cast to or from a half type and every half-typed accumulation (GEMM,
convolution, sum) rounds its result through ``round_precision``: values overflow and lose
precision where a device with real half storage would. Elementwise ops between them are not
rounded (one rounding of 2**-11 each, never an overflow by themselves: the loss scale's overflows
come out of the accumulations).
"""
from __future__ import annotations

from ..ir.graph import FLOAT_DTYPES, LOW_PRECISION, Graph, Node, TensorType, Value
from ..ops.base import get_op

LOW_OPS = frozenset({"matmul", "conv2d"})
FLOAT32_OPS = frozenset({"softmax", "log_softmax", "nll_loss", "sigmoid_cross_entropy", "accuracy",
                         "reduce_sum", "reduce_mean", "bessel_correct", "exp", "log", "softplus"})
# ops whose dtype is an attribute, not their inputs': left as they are
_TYPED = frozenset({"cast", "scalar", "constant", "round_precision", "all_finite"})
_WIDTH = {"bfloat16": 0, "float16": 0, "float32": 1, "float64": 2}
# ops that accumulate many products or terms into each output (rounded once, at the store)
ACCUMULATING = frozenset({"matmul", "conv2d", "conv2d_grad_input", "conv2d_grad_weight", "reduce_sum",
                          "reduce_mean"})


class _Casts:
    """Cast nodes made while rewriting, one per (value, dtype), each placed just before the first
    node that needs it (so the node list stays in topological order)."""

    def __init__(self, scalars_of: dict[int, Node]):
        self.made: dict[tuple[int, str], Value] = {}
        self.pending: list[Node] = []
        self.scalars_of = scalars_of

    def to(self, v: Value, dtype: str) -> Value:
        if v.dtype == dtype or v.dtype not in FLOAT_DTYPES:
            return v
        key = (v.id, dtype)
        if key not in self.made:
            producer = self.scalars_of.get(v.id)
            if producer is not None:       # a 0-d constant is remade in the dtype, not cast
                node = Node("scalar", [], {"value": producer.attrs["value"], "dtype": dtype}, producer.scope)
            else:
                node = Node("cast", [v], {"dtype": dtype}, v.producer.scope if v.producer else "autocast")
            node.outputs = [Value(TensorType(v.shape, dtype), node)]
            self.pending.append(node)
            self.made[key] = node.outputs[0]
        return self.made[key]

    def flush(self) -> list[Node]:
        out, self.pending = self.pending, []
        return out


def _retype(node: Node) -> None:
    """Re-infer the node's output types after its inputs changed dtype (outputs keep identity)."""
    types = get_op(node.op).infer([v.type for v in node.inputs], node.attrs)
    for out, t in zip(node.outputs, types):
        out.type = t


def _promoted(floats: list[Value], flexible: set[int], low: str) -> str | None:
    """The dtype an op of neither list runs in (None: as it is). Weights and constants
    (``flexible``) follow the activations they meet; otherwise the widest input wins, and a
    half type meeting a wider one goes up to at least float32."""
    rigid = {v.dtype for v in floats if v.id not in flexible}
    if rigid and rigid <= set(LOW_PRECISION):
        return low
    if len({v.dtype for v in floats}) == 1:
        return None
    widest = max(rigid or {v.dtype for v in floats}, key=_WIDTH.__getitem__)
    return "float32" if widest in LOW_PRECISION else widest


def autocast(graph: Graph, low: str) -> Graph:
    """Rewrite ``graph`` in place for mixed precision in ``low`` (float16 or bfloat16)."""
    if low not in LOW_PRECISION:
        raise ValueError(f"autocast needs float16 or bfloat16, not {low}")
    scalars_of = {n.outputs[0].id: n for n in graph.nodes if n.op == "scalar"}
    flexible = {w.value.id for w in graph.weights.values()} | set(scalars_of)
    flexible |= {n.outputs[0].id for n in graph.nodes if n.op == "constant"}
    casts = _Casts(scalars_of)
    nodes: list[Node] = []
    for node in graph.nodes:
        floats = [v for v in node.inputs if v.dtype in FLOAT_DTYPES]
        target = None
        if node.op in _TYPED or not floats:
            pass
        elif node.op in LOW_OPS:
            target = low
        elif node.op in FLOAT32_OPS:
            target = "float32" if any(v.dtype in LOW_PRECISION for v in floats) else None
        else:
            target = _promoted(floats, flexible, low)
        if target is not None:
            node.inputs = [casts.to(v, target) if v.dtype in FLOAT_DTYPES else v for v in node.inputs]
            nodes += casts.flush()
            _retype(node)
        nodes.append(node)
    graph.nodes = nodes
    # what leaves the graph keeps the dtype it had: outputs as float32, updates as their weight's
    for name, v in list(graph.outputs.items()):
        if v.dtype in LOW_PRECISION:
            graph.outputs[name] = casts.to(v, "float32")
    for name, v in list(graph.updates.items()):
        want = graph.weights[name].value.dtype
        if v.dtype != want:
            graph.updates[name] = casts.to(v, want)
    graph.nodes += casts.flush()
    return graph


def has_half(graph: Graph, types: tuple[str, ...] = LOW_PRECISION) -> bool:
    values = graph.graph_values() + [o for n in graph.nodes for o in n.outputs]
    return any(v.dtype in types for v in values)


def store_half_as_float32(graph: Graph, types: tuple[str, ...] = LOW_PRECISION) -> Graph:
    """Rewrite ``graph`` in place so that it holds no value of the half ``types`` (see the
    module doc)."""
    for v in graph.graph_values():
        if v.dtype in types:
            raise ValueError(f"'{v.name}' is {v.dtype}: inputs and weights of an emulated graph are float32")
    stored: dict[int, Value] = {}         # a half-typed accumulation's value -> its rounded copy
    nodes: list[Node] = []
    for node in graph.nodes:
        node.inputs = [stored.get(v.id, v) for v in node.inputs]
        nodes.append(node)
        if node.op in ACCUMULATING and node.outputs[0].dtype in types:
            # a GEMM, convolution or sum "in float16" accumulates in float32 and stores its result
            # in float16: that store is where a device overflows (a loss scale too large) or
            # rounds, so it rounds here too
            v = node.outputs[0]
            store = Node("round_precision", [v], {"dtype": v.dtype}, node.scope)
            v.type = TensorType(v.shape, "float32")
            store.outputs = [Value(TensorType(v.shape, "float32"), store)]
            stored[v.id] = store.outputs[0]
            nodes.append(store)
            continue
        if node.op == "cast":
            src, dst = node.inputs[0].dtype, node.attrs["dtype"]
            half = dst if dst in types else src if src in types else None
            if half is not None and dst in types + ("float32",):
                # a cast up from a half type rounds too: a GEMM "in float16" computed here in
                # float32 has not been rounded yet, and on a real device it would have been
                node.op, node.attrs = "round_precision", {"dtype": half}
                node.outputs[0].type = TensorType(node.outputs[0].shape, "float32")
                continue
        if node.op == "scalar" and node.attrs["dtype"] in types:
            node.attrs = {**node.attrs, "dtype": "float32"}
        for out in node.outputs:
            if out.dtype in types:
                out.type = TensorType(out.shape, "float32")
    graph.nodes = nodes
    graph.outputs = {k: stored.get(v.id, v) for k, v in graph.outputs.items()}
    graph.updates = {k: stored.get(v.id, v) for k, v in graph.updates.items()}
    return graph

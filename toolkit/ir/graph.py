"""The dataflow graph: typed SSA values, op nodes in topological order, and the graph's interface.

Invariant: ``graph.nodes`` is topologically sorted and every value has exactly one producer
(a node, or the graph itself for inputs and weights). Ops are named by string; their rules live
in ``toolkit.ops`` so this module stays free of op knowledge.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .dims import Dim, evaluate, format_dim, product

# half precision types: stored in 16 bits, computed with float32 accumulation (docs/spec.md section 4).
# numpy has float16 but no bfloat16, so a CPU plan never holds either: passes/precision.py
# stores them as float32 there, rounded to the low type wherever the graph casts to or from it
LOW_PRECISION = ("float16", "bfloat16")
# the float types a graph is built in: what --dtype and toolkit.load(dtype=) take
FLOAT_DTYPES = ("float32", "float64") + LOW_PRECISION
# what a train step is built in (toolkit train --dtype, toolkit.train(dtype=)): float32, or mixed
# precision in a half type; its parameters are never float64
TRAIN_DTYPES = ("float32",) + LOW_PRECISION
INT_DTYPES = ("int32", "int64")
# quantized tensors (int8 post-training quantization: ops/quant.py): values of a graph, but not
# INT_DTYPES, which are indices and labels (embedding, accuracy, the loss's labels) that a
# quantized activation never is
QUANT_DTYPES = ("int8", "uint8")
# every type a value of a graph may have
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + QUANT_DTYPES + ("bool",)
SHORT_DTYPE = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
               "int32": "i32", "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "b"}


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return product(self.shape)

    def concrete(self, bindings: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(d, bindings) for d in self.shape)

    def __str__(self) -> str:
        return f"{SHORT_DTYPE[self.dtype]}[{', '.join(format_dim(d) for d in self.shape)}]"


_ids = itertools.count()


class Value:
    """One SSA value. ``producer`` is None for graph inputs and weights."""

    __slots__ = ("id", "type", "producer", "name")

    def __init__(self, type: TensorType, producer: "Node | None" = None, name: str = ""):
        self.id = next(_ids)
        self.type = type
        self.producer = producer
        self.name = name

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return len(self.type.shape)

    def __repr__(self) -> str:
        return f"%{self.id}"


class Node:
    """One op application. ``scope`` names the layer it was lowered from (for errors and dumps)."""

    __slots__ = ("op", "inputs", "outputs", "attrs", "scope")

    def __init__(self, op: str, inputs: list[Value], attrs: dict[str, Any], scope: str):
        self.op = op
        self.inputs = list(inputs)
        self.outputs: list[Value] = []
        self.attrs = attrs
        self.scope = scope

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.inputs} -> {self.outputs}, scope={self.scope})"


@dataclass
class Weight:
    """A persistent array of the model: a trainable parameter or a state buffer (running stats)."""

    name: str                 # LAYER.PARAM, the key in weights files
    value: Value
    trainable: bool
    init: dict                # filler spec: {"type": "xavier"} / {"type": "constant", "value": 0}
    lr_mult: float = 1.0
    decay_mult: float = 1.0
    layer: str = ""
    fan_in: int = 1
    fan_out: int = 1


@dataclass
class Graph:
    """A phase's program: inputs, weights, nodes, named outputs and weight updates."""

    phase: str
    inputs: dict[str, Value] = field(default_factory=dict)
    weights: dict[str, Weight] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    outputs: dict[str, Value] = field(default_factory=dict)
    # weight name -> value that replaces it after a step (running stats, solver updates)
    updates: dict[str, Value] = field(default_factory=dict)
    # names of the loss tops with their weights, for the train phase
    losses: dict[str, float] = field(default_factory=dict)
    # layer name -> device name, for the layers whose net file says ``device:`` (the others run
    # where the graph is compiled for: backend/placement.py)
    layer_devices: dict = field(default_factory=dict)
    # the net's quantization section (schemas/quantization.py) on an infer graph whose net has
    # one: what the quantize pass (passes/quantize.py) rewrites it by; None elsewhere
    quantization: Any = None
    # the net's float32 math policy on the GPU (its ``precision`` key: "strict" or "tf32"; None:
    # not said), which the GPU's convolution kernels read (kernels/gpu/dnn.py)
    precision: str | None = None

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for v in self.inputs.values():
            for d in v.shape:
                if not isinstance(d, int):
                    out |= d.symbols
        return out

    def graph_values(self) -> list[Value]:
        """Values the graph owns before any node runs: inputs, then weights."""
        return list(self.inputs.values()) + [w.value for w in self.weights.values()]

    def consumers(self) -> dict[int, list[Node]]:
        uses: dict[int, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                uses.setdefault(v.id, []).append(node)
        return uses

    def dump(self) -> str:
        """Human-readable text form, one line per node."""
        lines = [f"graph {self.phase} {{"]
        for name, v in self.inputs.items():
            lines.append(f"  input {v!r} {name}: {v.type}")
        for name, w in self.weights.items():
            kind = "param" if w.trainable else "state"
            lines.append(f"  {kind} {w.value!r} {name}: {w.value.type}")
        for node in self.nodes:
            outs = ", ".join(f"{o!r}: {o.type}" for o in node.outputs)
            args = ", ".join(repr(v) for v in node.inputs)
            attrs = "".join(f" {k}={_fmt_attr(v)}" for k, v in node.attrs.items())
            lines.append(f"  {outs} = {node.op}({args}){attrs}  # {node.scope}")
        for name, v in self.outputs.items():
            lines.append(f"  output {name} = {v!r}")
        for name, v in self.updates.items():
            lines.append(f"  update {name} <- {v!r}")
        lines.append("}")
        return "\n".join(lines)


def copy_graph(graph: Graph, values: dict[int, Value] | None = None) -> Graph:
    """A copy of ``graph`` that a pass may change without touching the original: new values,
    nodes, weights and dictionaries; ``values`` (when given) receives old value id -> new value,
    so that what else refers to the original's values (a lowering's blobs) can be mapped. Arrays
    in attributes are shared: nothing changes an attribute's array in place. A subgraph held in
    an attribute (a loop or if body: an object whose ``graph`` is a Graph) is copied too."""
    values = {} if values is None else values
    for v in graph.inputs.values():
        values[v.id] = Value(v.type, name=v.name)
    for w in graph.weights.values():
        values[w.value.id] = Value(w.value.type, name=w.value.name)
    copied = Graph(graph.phase, {k: values[v.id] for k, v in graph.inputs.items()},
                   {k: replace(w, value=values[w.value.id], init=dict(w.init)) for k, w in graph.weights.items()},
                   copy_nodes(graph.nodes, values))
    # a value defined outside the graph (a body before closure conversion) stays itself
    copied.outputs = {k: values.get(v.id, v) for k, v in graph.outputs.items()}
    copied.updates = {k: values.get(v.id, v) for k, v in graph.updates.items()}
    copied.losses = dict(graph.losses)
    copied.layer_devices = dict(graph.layer_devices)
    copied.quantization = graph.quantization
    copied.precision = graph.precision
    return copied


def copy_nodes(nodes: list[Node], values: dict[int, Value]) -> list[Node]:
    """New nodes doing what ``nodes`` do, reading ``values[id]`` in place of each input that has
    an entry there (the others as they are); every output gets a new value, entered in ``values``."""
    out = []
    for node in nodes:
        attrs = {k: _copy_attr(a) for k, a in node.attrs.items()}
        new = Node(node.op, [values.get(v.id, v) for v in node.inputs], attrs, node.scope)
        new.outputs = [Value(o.type, new, o.name) for o in node.outputs]
        values.update((o.id, n) for o, n in zip(node.outputs, new.outputs))
        out.append(new)
    return out


def _copy_attr(a: Any) -> Any:
    body = getattr(a, "graph", None)
    if isinstance(body, Graph):          # ops/control.py's Body, which this floor cannot import
        return type(a)(copy_graph(body))
    return a


def _fmt_attr(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ")"
    if isinstance(v, float):
        return f"{v:g}"
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"array{tuple(v.shape)}" if v.size > 4 else repr(v.tolist())
    return str(v)

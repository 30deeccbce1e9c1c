"""OpDef (one per primitive: shape/dtype rule, gradient rule, reference, FLOPs, facts kernels read),
the op registry, and the Builder that appends type-checked nodes to a graph.

Gradient rules are written with the Builder, so the backward pass is ordinary graph ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..ir.dims import Dim, DimError
from ..ir.graph import Graph, Node, TensorType, Value

InferFn = Callable[[list[TensorType], dict], list[TensorType]]
GradFn = Callable[["Builder", Node, list["Value | None"]], list["Value | None"]]
# forward node -> a new node computing the same and more (extra outputs its gradient rule reads),
# or None where the node has them already; the node is left as it is, and autodiff puts the new
# one in its place. Its outputs start with the node's own Values; the extra ones point at it.
ResidualsFn = Callable[[Node], "Node | None"]


class ShapeError(ValueError):
    """A shape or dtype rule failed; the message names what does not fit."""


@dataclass(frozen=True)
class OpDef:
    name: str
    infer: InferFn
    reference: Callable[..., Any]          # slow, obviously-correct numpy implementation
    grad: GradFn | None = None             # None: not differentiable (integer outputs, grad helpers)
    flops: Callable[[list[TensorType], list[TensorType], dict], Dim] | None = None
    pure: bool = True                      # impure (random) ops are never merged or folded
    elementwise: bool = False              # output i depends on input element i only
    alias: bool = False                    # output is a view of input 0's storage (reshape)
    batch_rows: bool = False               # output rows depend only on the same rows of batched inputs
    batch_sum: bool = False                # output is a sum over the batch rows of its inputs
    fused: bool = False                    # made by a fusion pass: several ops run as one kernel
    # Facts the kernels read, stated by every elementwise op where it is defined (ops/elementwise.py):
    in_place: bool | None = None           # its numpy expression may write over an input of its shape
    scalar_expr: Callable[..., Any] | None = None   # (*operands, dtype, **attrs) -> codegen.loops expression
    numpy_call: str | None = None          # its numpy expression as one call, "np.add({0}, {1}, out={out})"
    residuals: ResidualsFn | None = None   # run by autodiff before ``grad``: see ResidualsFn
    doc: str = ""


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise RuntimeError(f"op {op.name!r} registered twice")
    OPS[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; registered: {', '.join(sorted(OPS))}") from None


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


class Builder:
    """Appends nodes to ``graph`` under a scope name, inferring each output's type."""

    def __init__(self, graph: Graph, scope: str = ""):
        self.graph = graph
        self.scope = scope

    def op(self, name: str, *inputs: Value, **attrs: Any) -> Value:
        outs = self.op_multi(name, *inputs, **attrs)
        if len(outs) != 1:
            raise RuntimeError(f"op {name} has {len(outs)} outputs; use op_multi")
        return outs[0]

    def op_multi(self, name: str, *inputs: Value, **attrs: Any) -> list[Value]:
        opdef = get_op(name)
        attrs = {k: _freeze(v) for k, v in attrs.items()}
        try:
            out_types = opdef.infer([v.type for v in inputs], attrs)
        except DimError as e:
            raise ShapeError(f"{name}: {e}") from None
        node = Node(name, list(inputs), attrs, self.scope)
        node.outputs = [Value(t, node) for t in out_types]
        self.graph.nodes.append(node)
        return node.outputs

    # -- conveniences used by lowerings and gradient rules --------------------------
    def scalar(self, value: float, dtype: str) -> Value:
        return self.op("scalar", value=float(value), dtype=dtype)

    def add(self, a: Value, b: Value) -> Value:
        return self.op("add", a, b)

    def sub(self, a: Value, b: Value) -> Value:
        return self.op("sub", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        return self.op("mul", a, b)

    def div(self, a: Value, b: Value) -> Value:
        return self.op("div", a, b)

    def scale(self, x: Value, factor: float) -> Value:
        if factor == 1.0:
            return x
        return self.mul(x, self.scalar(factor, x.dtype))

    def reshape(self, x: Value, shape: Sequence[Dim]) -> Value:
        if tuple(shape) == tuple(x.shape):
            return x
        return self.op("reshape", x, shape=tuple(shape))

    def reduce_sum(self, x: Value, axes: Sequence[int], keepdims: bool = False) -> Value:
        return self.op("reduce_sum", x, axes=tuple(axes), keepdims=keepdims)

    def sum_to(self, g: Value, shape: Sequence[Dim]) -> Value:
        """Undo numpy broadcasting: sum ``g`` down to ``shape`` (the un-broadcast of a gradient)."""
        shape = tuple(shape)
        if tuple(g.shape) == shape:
            return g
        lead = g.rank - len(shape)
        axes = list(range(lead))
        for i, d in enumerate(shape):
            if d == 1 and g.shape[lead + i] != 1:
                axes.append(lead + i)
        out = self.reduce_sum(g, axes, keepdims=True) if axes else g
        return self.reshape(out, shape)

    def add_all(self, values: Sequence[Value]) -> Value:
        total = values[0]
        for v in values[1:]:
            total = self.add(total, v)
        return total

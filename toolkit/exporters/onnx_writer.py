"""What writing the toolkit's graph as ONNX shares: unique names across the model and its
subgraphs, the initializers, symbolic dimensions as int64 tensors computed from the inputs'
``Shape``, the ``Scope`` of one graph being written, and ``CONVERT``, the converter of each
primitive (registered with ``@converts`` by ``onnx_primitives`` and ``onnx_control``), which
``convert_nodes`` applies to a graph's nodes in order."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import UserError
from ..ir.dims import format_dim
from ..ir.graph import Node, Value
from ..onnxtypes import ONNX_TYPE_NUMBER


class ExportError(UserError):
    """The graph holds something ONNX cannot express; the message names the layer."""


def dim_param(d) -> int | str:
    """A dimension as ONNX writes it in a type: a number, or a symbol's name."""
    return int(d) if isinstance(d, int) else format_dim(d)


class UniqueNames:
    """Unique ONNX names across the model and its subgraphs (ONNX's scoping rule)."""

    def __init__(self):
        self.taken: set[str] = set()

    def fresh(self, hint: str) -> str:
        hint = hint or "t"
        name, i = hint, 1
        while name in self.taken:
            i += 1
            name = f"{hint}_{i}"
        self.taken.add(name)
        return name


class ExportModel:
    """What the whole export shares: names, initializers, the top graph's dimension tensors."""

    def __init__(self, opset: int, names: UniqueNames):
        self.opset = opset
        self.names = names
        self.inits: dict[str, object] = {}
        self.top_nodes: list = []            # the top graph's node list (dimension tensors go there)
        self.symbol_source: dict[str, tuple[str, int]] = {}    # symbol -> (input name, axis)
        self.dim_cache: dict[object, str] = {}

    def initializer(self, arr: np.ndarray, hint: str, name: str | None = None) -> str:
        from onnx import numpy_helper
        name = name or self.names.fresh(hint)
        # (np.ascontiguousarray would make a 0-d array 1-d)
        self.inits[name] = numpy_helper.from_array(np.array(arr, order="C"), name)
        return name

    def const_i64(self, values, hint: str = "const") -> str:
        key = ("i64", tuple(int(v) for v in values))
        if key not in self.dim_cache:
            self.dim_cache[key] = self.initializer(np.array(values, np.int64), hint)
        return self.dim_cache[key]

    def top_node(self, op: str, inputs: list[str], hint: str, **attrs) -> str:
        from onnx import helper
        out = self.names.fresh(hint)
        self.top_nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    # -- symbolic dimensions as int64 [1] tensors, built once in the top graph ------------------
    def symbol(self, name: str) -> str:
        key = ("sym", name)
        if key not in self.dim_cache:
            if name not in self.symbol_source:
                raise ExportError(f"ONNX export: the dimension '{name}' is no graph input's dimension")
            source, axis = self.symbol_source[name]
            shape = self.top_node("Shape", [source], f"shape_of_{source}")
            self.dim_cache[key] = self.top_node("Slice", [shape, self.const_i64([axis]), self.const_i64([axis + 1])],
                                                f"dim_{name}")
        return self.dim_cache[key]

    def dim(self, d) -> str:
        """An int64 [1] tensor holding dimension ``d`` (a number or a polynomial of symbols)."""
        if isinstance(d, int):
            return self.const_i64([d])
        key = ("dim", d)
        if key in self.dim_cache:
            return self.dim_cache[key]
        total = None
        for mono, coeff in sorted(d.terms.items()):
            term = None
            for s in mono:
                term = self.symbol(s) if term is None else self.top_node("Mul", [term, self.symbol(s)], "dim_mul")
            if term is None:
                term = self.const_i64([coeff])
            elif coeff != 1:
                term = self.top_node("Mul", [term, self.const_i64([coeff])], "dim_mul")
            total = term if total is None else self.top_node("Add", [total, term], "dim_add")
        self.dim_cache[key] = total
        return total

    def shape(self, dims) -> str:
        """An int64 [rank] tensor of the shape ``dims``."""
        dims = tuple(dims)
        if all(isinstance(d, int) for d in dims):
            return self.const_i64(dims, "shape")
        key = ("shape", dims)
        if key not in self.dim_cache:
            self.dim_cache[key] = self.top_node("Concat", [self.dim(d) for d in dims], "shape", axis=0)
        return self.dim_cache[key]


class Scope:
    """One graph being written (the top graph or a body): its nodes and the ONNX name of each Value."""

    def __init__(self, model: ExportModel, names: dict[int, str], nodes: list):
        self.model = model
        self.names = names
        self.nodes = nodes
        self.node: Node | None = None        # the node being converted

    def name(self, v: Value) -> str:
        return self.names[v.id]

    def emit(self, op: str, inputs: list[str], n_out: int = 1, hint: str | None = None, **attrs) -> list[str]:
        from onnx import helper
        base = f"{self.node.scope}/{hint or op}" if self.node is not None and self.node.scope else (hint or op)
        outs = [self.model.names.fresh(base) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=outs[0], **attrs))
        return outs

    def one(self, op: str, inputs: list[str], hint: str | None = None, **attrs) -> str:
        return self.emit(op, inputs, 1, hint, **attrs)[0]

    def scalar(self, value, dtype: str) -> str:
        key = ("scalar", dtype, float(value))
        if key not in self.model.dim_cache:
            self.model.dim_cache[key] = self.model.initializer(np.array(value, dtype=dtype), "scalar")
        return self.model.dim_cache[key]

    def fail(self, what: str):
        layer = self.node.scope if self.node is not None else "?"
        raise ExportError(f"ONNX export: layer '{layer}': {what}")


Converter = Callable[[Scope, Node, list[str]], list[str]]
CONVERT: dict[str, Converter] = {}


def converts(*ops: str):
    """Registers the decorated function as the converter of each of the primitives ``ops``."""
    def register(fn):
        for op in ops:
            CONVERT[op] = fn
        return fn
    return register


def value_info(name: str, v: Value):
    """The ONNX ValueInfo (element type and shape) of ``v`` under ``name``."""
    from onnx import helper
    return helper.make_tensor_value_info(name, ONNX_TYPE_NUMBER[v.dtype], [dim_param(d) for d in v.shape])


def convert_nodes(scope: Scope, nodes: list[Node]) -> None:
    """Each node written into ``scope`` by its primitive's converter, its outputs' ONNX names kept."""
    for node in nodes:
        scope.node = node
        convert = CONVERT.get(node.op)
        if convert is None:
            scope.fail(f"the primitive '{node.op}' has no ONNX counterpart here")
        outs = convert(scope, node, [scope.name(v) for v in node.inputs])
        for v, name in zip(node.outputs, outs):
            scope.names[v.id] = name
    scope.node = None

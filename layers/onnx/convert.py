"""Reading an ONNX model into the toolkit's graph of primitive ops.

Every ONNX value is held either as a graph ``Value`` or as a constant known at import: an
initializer, a ``Constant``, or what a node computes from constants only. ``Shape`` of a value
whose shape holds symbolic dimensions is a constant too, an array of dimensions (numbers and
symbols), so the ``Shape`` -> ``Gather`` -> ``Concat`` -> ``Reshape`` subgraphs exporters write fold
away at import and the symbols flow into the graph's own shapes: constant folding with shape
inference. Nodes of constants only are evaluated by ONNX's reference evaluator; the rest map to
primitives by the converters in ``ops/`` (one module per family of ops).

Floats held as initializers of more than one element become the graph's weights (by their
ONNX names); other constants become ``constant``/``scalar`` ops where a primitive reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np

from toolkit.errors import UserError
from toolkit.importers.onnx.files import MIN_OPSET, opened, read_model, symbol_name, type_name  # noqa: F401
from toolkit.ir.dims import Dim, DimError, Sym
from toolkit.ir.graph import Graph, TensorType, Value, Weight
from toolkit.onnxtypes import ONNX_ELEMENT_TYPES
from toolkit.ops.base import Builder, ShapeError

from .qparams import quantization_parameters

NUMPY = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "bool": np.bool_,
         "float16": np.float16}


class ImportError_(UserError):
    """A model the importer cannot read or express; the message names the node."""


@dataclass
class Imported:
    graph: Graph                          # the infer graph: the model's inputs and outputs
    weights: dict[str, np.ndarray]        # the initializers the graph holds as weights
    opset: int
    name: str
    notes: list[str] = field(default_factory=list)
    importer: "Importer | None" = None     # what each ONNX value became (layers/onnx/to_layers.py reads it)
    model: object = None                   # the ModelProto, at opset 13 or later


def is_const(x) -> bool:
    return isinstance(x, np.ndarray)


def is_symbolic(a: np.ndarray) -> bool:
    return a.dtype == object


def dims_of(a: np.ndarray) -> tuple[Dim, ...]:
    """A constant 1-d array of dimensions (numbers or symbols) as a shape tuple."""
    return tuple(d if isinstance(d, Sym) else int(d) for d in np.asarray(a).reshape(-1).tolist())


# filled as the package is imported: the converter of each ONNX op type (ops/, logic.py, control.py,
# recurrent.py register theirs) and the constant folder (fold.py), so that this module imports none
# of them
CONVERTERS: dict = {}
FOLDERS: list = []
# (domain, op type) of the ops outside ONNX's own domain that a converter reads (ONNX Runtime's QGemm)
DOMAIN_OPS: set = set()


class NodeError(Exception):
    """Raised by a converter: what does not fit, said of the node being converted."""


class Importer:
    """Converts one graph (the model's, or a body) into the toolkit's graph."""

    def __init__(self, path: str, opset: int, graph: Graph, weights: dict[str, np.ndarray],
                 builder: Builder | None = None, scope: str = ""):
        self.path = path
        self.opset = opset
        self.graph = graph
        self.weights = weights
        self.env: dict[str, object] = {}         # ONNX name -> Value or np.ndarray
        self.absent: dict[str, str] = {}          # outputs left uncomputed (a Dropout's mask) -> why
        self.node = None
        self.b = builder or Builder(graph, "")
        self.scope = scope                         # prefixed to the nodes' names as the ops' scope
        # the nodes around each value, for converters that read a pattern (ops/quantized.py)
        self.producers: dict[str, object] = {}    # ONNX name -> the node that gives it
        self.readers: dict[str, list] = {}        # ONNX name -> the nodes that read it
        self.graph_outputs: set[str] = set()
        self.arrays: dict[str, np.ndarray] = {}   # the initializers as the file holds them

    def initializers(self, arrays: dict[str, np.ndarray], weight, nodes=()) -> None:
        """Floats of more than one element become weights through ``weight(name, array)`` (a
        Value); the rest stay constants, and so do the scales and zero points that ``nodes``'
        quantized ops read (per-channel scales are not parameters)."""
        constants = quantization_parameters(nodes)
        self.arrays.update(arrays)
        for name, arr in arrays.items():
            parameter = arr.dtype.kind == "f" and arr.size > 1 and name not in constants
            self.env[name] = weight(name, arr) if parameter else arr

    # -- values -------------------------------------------------------------------------------
    def value(self, name: str, like: Value | None = None) -> Value:
        """The graph Value of ``name``, a constant made into one (in ``like``'s dtype for a float)."""
        x = self.env[name]
        if isinstance(x, Value):
            return x
        return self.materialize(x, like)

    def materialize(self, arr: np.ndarray, like: Value | None = None) -> Value:
        if is_symbolic(arr):
            raise NodeError("a shape computed from symbolic dimensions is used as data")
        dtype = str(arr.dtype) if arr.dtype != np.bool_ else "bool"
        if like is not None and arr.dtype.kind == "f" and like.dtype != dtype:
            arr = arr.astype(like.dtype if like.dtype in NUMPY else np.float32)
            dtype = str(arr.dtype)
        if dtype not in NUMPY and dtype != "bool":
            raise NodeError(f"a constant of dtype {arr.dtype} has no counterpart here")
        if arr.ndim == 0 and dtype != "bool":
            return self.b.scalar(arr.item(), dtype)
        return self.b.op("constant", value=np.array(arr))

    def const(self, name: str, what: str) -> np.ndarray:
        """A constant input (an initializer, a Constant or folded): refused where it is computed."""
        x = self.env.get(name)
        if not is_const(x):
            raise NodeError(f"{what} ('{name}') must be known when the model is imported, not computed at run time")
        return x

    def optional(self, node, index: int) -> str | None:
        return node.input[index] if len(node.input) > index and node.input[index] else None

    def fail(self, message: str):
        raise NodeError(message)

    # -- nodes --------------------------------------------------------------------------------
    def run_nodes(self, nodes) -> None:
        fold = FOLDERS[0]
        nodes = list(nodes)
        for node in nodes:
            for name in node.output:
                self.producers[name] = node
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        for node in nodes:
            self.node = node
            self.b.scope = self.scope + (node.name or (node.output[0] if node.output else node.op_type))
            if node.domain not in ("", "ai.onnx") and (node.domain, node.op_type) not in DOMAIN_OPS:
                self._unsupported(node)
            ins = [self.env.get(n) if n else None for n in node.input]
            for n, x in zip(node.input, ins):
                if n and n in self.absent:
                    raise ImportError_(f"{self.path}: node '{self.b.scope}' ({node.op_type}) reads '{n}': "
                                       f"{self.absent[n]}")
                if n and x is None:
                    raise ImportError_(f"{self.path}: node '{self.b.scope}' ({node.op_type}) reads '{n}', which "
                                       "no node, input or initializer gives")
            try:
                _check_inputs(node, self.opset)
                folded = fold(self, node, ins)
                if folded is None:
                    convert = CONVERTERS.get(node.op_type)
                    if convert is None:
                        self._unsupported(node)
                    outs = convert(self, node)
                else:
                    outs = folded
            except (NodeError, ShapeError, DimError) as e:
                # DimError: arithmetic over symbolic dimensions with no integer answer (3*N split
                # into rows of 10^12), said of the node whose shapes asked for it
                raise ImportError_(f"{self.path}: node '{self.b.scope}' ({node.op_type}): {e}") from None
            outs = list(outs) + [None] * (len(node.output) - len(outs))
            for name, out in zip(node.output, outs):
                if name and out is not None:
                    self.env[name] = out
                elif name:             # an output nothing here computes: an error only where it is read
                    self.absent[name] = f"the output {name} of node '{self.b.scope}' ({node.op_type}) has no " \
                                        "counterpart here"
        self.node = None

    def _unsupported(self, node):
        domain = node.domain or "ai.onnx"
        raise ImportError_(f"{self.path}: node '{node.name or node.output[0]}': the op {node.op_type} (domain "
                           f"{domain}, opset {self.opset}) has no counterpart here")

    def attr(self, node, name: str, default=None):
        """The node's attribute ``name`` (else ``default``), of the type the op's schema gives it: a
        model may declare any type for any attribute, or leave out one the op requires."""
        from onnx import AttributeProto, helper
        wanted, required = _attribute_schema(node.op_type, node.domain, self.opset).get(name, (None, False))
        for a in node.attribute:
            if a.name == name:
                if a.type != (wanted or a.type) or a.type == AttributeProto.UNDEFINED:
                    kind = (AttributeProto.AttributeType.Name(a.type)
                            if a.type in AttributeProto.AttributeType.values() else f"type {a.type}")
                    raise NodeError(f"attribute '{name}' is {kind}, where {node.op_type} takes "
                                    f"{AttributeProto.AttributeType.Name(wanted) if wanted else 'another type'}")
                value = helper.get_attribute_value(a)
                # a string attribute is text to every converter (auto_pad, mode, an equation); bytes
                # that are not UTF-8 come out with replacement characters, refused as values no op takes
                if a.type == AttributeProto.STRING:
                    return value.decode("utf-8", "replace")
                if a.type == AttributeProto.STRINGS:
                    return [v.decode("utf-8", "replace") for v in value]
                return value
        if required and default is None:
            raise NodeError(f"attribute '{name}', which {node.op_type} requires, is missing")
        return default


def _check_inputs(node, opset: int) -> None:
    """Every input the op's schema requires is given (a name, not left out or empty): the
    converters read them by position."""
    for position, (name, required) in enumerate(_input_schema(node.op_type, node.domain, opset)):
        if required and (len(node.input) <= position or not node.input[position]):
            raise NodeError(f"input {position} ('{name}'), which {node.op_type} requires, is missing "
                            f"(the node gives {len([n for n in node.input if n])})")


@lru_cache(maxsize=None)
def _input_schema(op_type: str, domain: str, opset: int) -> tuple[tuple[str, bool], ...]:
    """The inputs the op's ONNX schema declares at this opset: (name, required) in order."""
    from onnx import defs
    try:
        schema = defs.get_schema(op_type, opset, domain if domain != "ai.onnx" else "")
    except Exception:                    # an op ONNX does not know: its converter, if any, decides
        return ()
    single = defs.OpSchema.FormalParameterOption.Single
    variadic = defs.OpSchema.FormalParameterOption.Variadic
    return tuple((i.name, i.option == single or (i.option == variadic and schema.min_input > position))
                 for position, i in enumerate(schema.inputs))


@lru_cache(maxsize=None)
def _attribute_schema(op_type: str, domain: str, opset: int) -> dict[str, tuple[int, bool]]:
    """The attributes the op's ONNX schema declares at this opset: name -> (type, required)."""
    from onnx import defs
    try:
        schema = defs.get_schema(op_type, opset, domain if domain != "ai.onnx" else "")
    except Exception:                    # an op ONNX does not know: its converter, if any, decides
        return {}
    return {name: (int(a.type), bool(a.required)) for name, a in schema.attributes.items()}


def _input_type(info, position: int, names: dict) -> TensorType:
    t = info.type.tensor_type
    if t.elem_type not in ONNX_ELEMENT_TYPES:
        raise ImportError_(f"input '{info.name}': element type {type_name(t.elem_type)} has no counterpart here")
    shape: list[Dim] = []
    if not t.HasField("shape"):
        raise ImportError_(f"input '{info.name}': the model gives no shape")
    for axis, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(int(d.dim_value))
        else:
            raw = (d.dim_param if d.HasField("dim_param") and d.dim_param
                   else ("N" if axis == 0 else f"{info.name}_{axis}"))
            shape.append(Sym.named(names.setdefault(raw, symbol_name(raw))))
    return TensorType(tuple(shape), ONNX_ELEMENT_TYPES[t.elem_type])


def _reads(node) -> set[str]:
    """The names a node reads: its inputs and, inside its subgraphs, every name read there."""
    from onnx import AttributeProto
    names = {n for n in node.input if n}
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for g in graphs:
            for inner in g.node:
                names |= _reads(inner)
            names |= {o.name for o in g.output}
    return names


def needed(nodes, outputs: list[str]) -> tuple[list, set[str]]:
    """The nodes the ``outputs`` depend on, in order, and every name they read."""
    wanted = set(outputs)
    keep = []
    for node in reversed(list(nodes)):
        if any(o in wanted for o in node.output):
            keep.append(node)
            wanted |= _reads(node)
    return keep[::-1], wanted


def import_model(path: str, float_dtype: str = "float32") -> Imported:
    """The model at ``path`` as an infer graph and its weights."""
    return import_proto(read_model(path), path, float_dtype)


def import_proto(model, path: str, float_dtype: str = "float32") -> Imported:
    """A ModelProto as an infer graph and its weights; ``path`` names it in messages."""
    loaded = opened(model, path)
    model, opset, initial = loaded.model, loaded.opset, loaded.arrays
    graph = Graph("infer")
    weights: dict[str, np.ndarray] = {}
    imp = Importer(path, opset, graph, weights)
    symbols: dict[str, str] = {}
    for position, info in enumerate(model.graph.input):
        if info.name in initial:
            continue                  # older exporters list initializers among the inputs
        value = Value(_input_type(info, position, symbols), name=info.name)
        graph.inputs[info.name] = value
        imp.env[info.name] = value
    def weight(key: str, arr: np.ndarray) -> Value:
        value = Value(TensorType(tuple(int(d) for d in arr.shape), float_dtype if arr.dtype != np.float64
                                 else "float64"), name=key)
        graph.weights[key] = Weight(key, value, True, {"type": "constant", "value": 0.0}, layer=key)
        weights[key] = arr.astype(value.dtype, copy=False)
        return value
    imp.initializers(initial, weight, model.graph.node)
    imp.graph_outputs = {o.name for o in model.graph.output}
    imp.run_nodes(model.graph.node)
    for info in model.graph.output:
        out = imp.env.get(info.name)
        if info.name in imp.absent:
            raise ImportError_(f"{path}: output '{info.name}': {imp.absent[info.name]}")
        if out is None:
            raise ImportError_(f"{path}: output '{info.name}' is computed by no node")
        graph.outputs[info.name] = out if isinstance(out, Value) else imp.materialize(out)
    used = {v.id for n in graph.nodes for v in n.inputs} | {v.id for v in graph.outputs.values()}
    for key in [k for k, w in graph.weights.items() if w.value.id not in used]:
        del graph.weights[key]
        weights.pop(key, None)
    return Imported(graph, weights, opset, model.graph.name or "imported", importer=imp, model=model)


ConverterFn = Callable[[Importer, object], list]

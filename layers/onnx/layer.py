"""ONNX: an ONNX model's graph as one layer. Its nodes are lowered to the toolkit's primitives
(toolkit/importers/onnx), so the optimiser, the kernels, the buckets and training run them; its
bottoms feed the model's inputs in order and its tops are the model's outputs in order. Its
floating initializers are the layer's parameters, ``LAYER.<initializer name>``, started from the
file's values (``lr_mult: 0`` freezes them for fine-tuning a new head)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

from schemas.base import ParamLayerBase
from toolkit.errors import UserError
from toolkit.ir.dims import Sym
from toolkit.ir.graph import Graph, TensorType, Value, copy_nodes
from toolkit.ops.base import Builder

from ..registry import LayerError, layer


class OnnxParams(ParamLayerBase):
    type: Literal["ONNX"]
    file: str                       # the .onnx file, relative to the net file
    # the ONNX values the tops are (default: the model's outputs): name an inner value, such as
    # the features before a classifier, to cut the graph there and put a new head after it
    outputs: Optional[list[str]] = None
    BOTTOMS: ClassVar[tuple[int, Optional[int]]] = (1, None)
    TOPS: ClassVar[tuple[int, Optional[int]]] = (1, None)


def model_path(p: OnnxParams, base_dir: str) -> str:
    """The model's file from the working folder: no ``./`` put in front of a name the user wrote
    (the messages of a model's run name it so)."""
    return p.file if os.path.isabs(p.file) or base_dir in ("", ".") else os.path.join(base_dir, p.file)


def _as_written(message: str, path: str, p: OnnxParams) -> str:
    """A message about the model file at ``path`` (the net file's folder joined to it) naming the
    file as the layer's ``file:`` key wrote it: the error's place is already the net file's."""
    message = message.removeprefix("error: ")
    return p.file + message[len(path):] if message.startswith(path + ":") else message


@layer(OnnxParams)
def lower_onnx(p: OnnxParams, ctx, bottoms):
    from toolkit.importers.onnx.files import loaded_model, model_inputs
    from toolkit.onnxtypes import ONNX_ELEMENT_TYPES

    path = model_path(p, ctx.base_dir)
    try:
        loaded = loaded_model(path)
    except UserError as e:
        raise LayerError(_as_written(str(e), path, p), "file") from None
    inputs = model_inputs(loaded.model)
    if len(inputs) != len(bottoms):
        raise LayerError(f"{p.file} takes {len(inputs)} inputs ({', '.join(i.name for i in inputs)}), the layer "
                         f"gives {len(bottoms)} bottoms", "bottom")
    outputs = list(p.outputs) if p.outputs is not None else [o.name for o in loaded.model.graph.output]
    # an empty name is an optional output left out: no value
    known = ({o for n in loaded.model.graph.node for o in n.output} | {i.name for i in loaded.model.graph.input} |
             set(loaded.arrays)) - {""}
    for name in outputs:
        if name not in known:
            from toolkit.errors import did_you_mean
            raise LayerError(f"{p.file} has no value '{name}'{did_you_mean(name, sorted(known))}", "outputs")
    if len(outputs) != len(p.tops):
        raise LayerError(f"{p.file} gives {len(outputs)} outputs ({', '.join(outputs)}), the layer names "
                         f"{len(p.tops)} tops", "outputs" if p.outputs is not None else "top")
    for info, value in zip(inputs, bottoms):
        _check_input(info, value, ctx, ONNX_ELEMENT_TYPES)
    # the conversion depends on the model, the layer, its bottoms' types and the float type,
    # not on the phase: a net converts its ONNX layer once and copies it into each phase's graph
    key = ("ONNX", p.name, os.path.realpath(path), tuple(outputs), tuple(v.type for v in bottoms), ctx.float_dtype)
    conversion = ctx.memo.get(key)
    if conversion is None or conversion.loaded is not loaded:
        conversion = ctx.memo[key] = _convert(p, path, loaded, inputs, outputs, bottoms, ctx.float_dtype)
    return conversion.copy_into(ctx, bottoms)


@dataclass
class _Conversion:
    """An ONNX layer's model converted to primitives in a graph of its own, reading stand-ins
    for the bottoms and the parameters; ``copy_into`` puts a copy into a lowering's graph."""

    graph: Graph
    bottoms: list[Value]                              # stand-ins, in the bottoms' order
    params: list[tuple[str, tuple, dict, Value]]      # name, shape, default filler, stand-in
    tops: list[Value]
    failure: tuple[str, str] | None                   # (message, key) of the LayerError the nodes gave
    loaded: object                                    # the model read (a changed file is read anew)

    def copy_into(self, ctx, bottoms: list[Value]) -> list[Value]:
        values = {stand_in.id: bottom for stand_in, bottom in zip(self.bottoms, bottoms)}
        # the parameters are declared before the nodes convert, so a share's problem comes first
        for name, shape, filler, stand_in in self.params:
            values[stand_in.id] = ctx.param(name, shape, default_filler=filler)
        if self.failure is not None:
            raise LayerError(*self.failure)
        ctx.b.graph.nodes.extend(copy_nodes(self.graph.nodes, values))
        ctx.b.scope = ctx.layer.name
        return [values.get(top.id, top) for top in self.tops]


def _convert(p: OnnxParams, path: str, loaded, inputs, outputs: list[str], bottoms: list[Value],
             float_dtype: str) -> _Conversion:
    from .convert import Importer, NodeError, needed
    graph = Graph("onnx")
    builder = Builder(graph, p.name)
    stand_ins = [Value(v.type, name=v.name) for v in bottoms]
    imp = Importer(path, loaded.opset, graph, {}, builder=builder, scope=f"{p.name}/")
    for info, value in zip(inputs, stand_ins):
        imp.env[info.name] = value
    params: list[tuple[str, tuple, dict, Value]] = []

    def weight(name, arr):
        shape = tuple(int(d) for d in arr.shape)
        stand_in = Value(TensorType(shape, float_dtype), name=name)
        params.append((name, shape, {"type": "onnx_initializer", "file": os.path.abspath(path), "name": name},
                       stand_in))
        return stand_in
    nodes, reads = needed(loaded.model.graph.node, outputs)
    # only what the tops depend on: a cut-off classifier declares no parameters
    imp.initializers({k: v for k, v in loaded.arrays.items() if k in reads}, weight, nodes)
    imp.graph_outputs = set(outputs)
    tops: list[Value] = []
    failure = None
    try:
        try:
            imp.run_nodes(nodes)
        except UserError as e:
            raise LayerError(_as_written(str(e), path, p), "file") from None
        builder.scope = p.name
        for name in outputs:
            if name in imp.absent:
                raise LayerError(f"{p.file}: output '{name}': {imp.absent[name]}", "top")
            out = imp.env[name]
            if isinstance(out, Value):
                tops.append(out)
                continue
            try:                              # an output known at import: a constant, unless it holds symbols
                tops.append(imp.materialize(out))
            except NodeError as e:
                raise LayerError(f"{p.file}: output '{name}': {e}", "top") from None
    except LayerError as e:
        failure = (str(e), e.key)
    return _Conversion(graph, stand_ins, params, tops, failure, loaded)


def _check_input(info, value, ctx, dtypes) -> None:
    t = info.type.tensor_type
    want = dtypes.get(t.elem_type)
    if (want is not None and want != value.dtype
            and not (want in ("float32", "float64") and value.dtype.startswith("f"))):
        raise LayerError(f"the model's input '{info.name}' is {want}, the bottom is {ctx.fmt(value)}", "bottom")
    dims = list(t.shape.dim) if t.HasField("shape") else []
    if dims and len(dims) != value.rank:
        raise LayerError(f"the model's input '{info.name}' has {len(dims)} axes, the bottom is {ctx.fmt(value)}",
                         "bottom")
    for axis, (d, have) in enumerate(zip(dims, value.shape)):
        if d.HasField("dim_value") and d.dim_value > 0 and not isinstance(have, Sym) and have != d.dim_value:
            raise LayerError(f"the model's input '{info.name}' has {d.dim_value} on axis {axis}, the bottom is "
                             f"{ctx.fmt(value)}", "bottom")

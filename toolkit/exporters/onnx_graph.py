"""The toolkit's graph of primitive ops written as an ONNX model.

Export works on the lowered graph, not on the layers: every layer of both catalogs lowers to the
primitives below, so a net exports whenever its primitives do, and the ONNX model computes what
the toolkit's graph computes. Each primitive maps to one ONNX node or a few (``onnx_primitives``);
``loop`` becomes ``Scan`` (sequences) or ``Loop`` (a trip count, an early stop), ``if`` becomes
``If``, with the bodies as subgraphs that read outer values by name (``onnx_control``). What they
share (names, initializers, symbolic dimensions, the converter table) is ``onnx_writer``; this
module writes the whole model.

Symbolic dimensions stay symbolic: a shape that holds ``N`` (or ``N*T``) is computed at run time
from the graph inputs' ``Shape``, so the batch (and any other named input dimension) is dynamic
in the model. A primitive with no ONNX counterpart raises ``ExportError`` naming the layer it was
lowered from (the node's scope).

``onnx`` is an optional extra, imported inside functions only.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import UserError
from ..ir.dims import Sym
from ..ir.graph import Graph, Node
from ..onnxtypes import ONNX_TYPE_NUMBER
from . import onnx_control, onnx_primitives, onnx_quant  # noqa: F401  (imported for their converters)
from .onnx_writer import ExportError, ExportModel, Scope, UniqueNames, convert_nodes, dim_param, value_info

__all__ = ["DEFAULT_OPSET", "MIN_OPSET", "ExportError", "export_graph"]

DEFAULT_OPSET = 17
MIN_OPSET = 13


def _live(graph: Graph) -> list[Node]:
    """The nodes some output depends on, in order."""
    producer = {o.id: n for n in graph.nodes for o in n.outputs}
    live: set[int] = set()
    todo = [v for v in graph.outputs.values()]
    while todo:
        v = todo.pop()
        n = producer.get(v.id)
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        todo.extend(n.inputs)
    return [n for n in graph.nodes if id(n) in live]


def export_graph(graph: Graph, weights: Mapping[str, np.ndarray], name: str, opset: int = DEFAULT_OPSET,
                 metadata: Mapping[str, str] | None = None, input_transforms: Mapping[str, dict] | None = None):
    """The ONNX ModelProto of ``graph`` with ``weights`` (by key) as initializers, checked by
    ``onnx.checker`` (full check: with shape inference). ``input_transforms``: per graph input, the
    record of its transform's steps (onnx_transform.py), written as nodes in front of the graph:
    the model then takes the raw input."""
    import onnx
    from onnx import helper

    from .onnx_transform import raw_dims, transform_nodes
    if not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise UserError(f"--opset {opset}: choose one from {MIN_OPSET} to {onnx.defs.onnx_opset_version()}")
    names = UniqueNames()
    model = ExportModel(opset, names)
    value_names: dict[int, str] = {}
    graph_inputs = []
    transforms = {k: r for k, r in (input_transforms or {}).items() if k in graph.inputs}
    for input_name, v in graph.inputs.items():
        names.taken.add(input_name)
        value_names[v.id] = input_name
        dims = [dim_param(d) for d in v.shape]
        if input_name in transforms:
            dims = raw_dims(input_name, dims, transforms[input_name])
        graph_inputs.append(helper.make_tensor_value_info(input_name, ONNX_TYPE_NUMBER[v.dtype], dims))
        for axis, d in enumerate(v.shape):
            if isinstance(d, Sym) and len(d.terms) == 1 and list(d.terms.items())[0][1] == 1 \
                    and len(list(d.terms)[0]) == 1:
                model.symbol_source.setdefault(list(d.terms)[0][0], (input_name, axis))
    names.taken.update(graph.outputs)
    nodes = _live(graph)
    used = {v.id for n in nodes for v in n.inputs} | {v.id for v in graph.outputs.values()}
    for key, w in graph.weights.items():
        if w.value.id not in used:
            continue
        if key not in weights:
            raise UserError(f"ONNX export: no array for weight '{key}'")
        names.taken.add(key)
        arr = np.asarray(weights[key]).astype(w.value.dtype, copy=False)
        model.initializer(arr, key, name=key)
        value_names[w.value.id] = key
    front = []
    for input_name, record in transforms.items():
        v = graph.inputs[input_name]
        added, out = transform_nodes(input_name, record, v.dtype, model.initializer, names.fresh)
        front += added
        value_names[v.id] = out
    scope = Scope(model, value_names, [])
    convert_nodes(scope, nodes)
    graph_outputs = []
    for out_name, v in graph.outputs.items():
        scope.nodes.append(helper.make_node("Identity", [scope.name(v)], [out_name], name=f"{out_name}/output"))
        graph_outputs.append(value_info(out_name, v))
    g = helper.make_graph(front + model.top_nodes + scope.nodes, name, graph_inputs, graph_outputs,
                          list(model.inits.values()))
    proto = helper.make_model(g, producer_name="toolkit", opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = min(proto.ir_version, 10)
    for key, value in (metadata or {}).items():
        proto.metadata_props.add(key=key, value=value)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as e:               # onnx's ValidationError / InferenceError
        raise ExportError(f"ONNX export: the model does not pass onnx.checker: {str(e).splitlines()[0]}") from None
    return proto

"""The toolkit's ``loop`` as ONNX's ``Scan`` (over sequences) or ``Loop`` (a trip count, an
early stop), and ``if`` as ``If``: the bodies written as subgraphs that read outer values by name
(ONNX's scoping)."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from ..onnxtypes import ONNX_TYPE_NUMBER
from .onnx_writer import Scope, convert_nodes, converts, value_info

OUTER = "\0outer:"          # marks a body input that reads an outer value by its name


def _outer(name: str) -> str:
    return OUTER + name


def _body(s: Scope, graph: Graph, formal: list, label: str, loop_flag: int | None = None):
    """A subgraph of ``graph``. ``formal`` pairs each body input with its ONNX input name, or with
    ``_outer(name)`` where it reads an outer value (ONNX bodies see the outer scope). With
    ``loop_flag`` (0 or 1) it is a Loop body: its first output is the go-on condition, the body's
    own flag converted to bool, or the condition passed through."""
    from onnx import helper
    names: dict[int, str] = {}
    inputs = []
    for v, name in formal:
        if name.startswith(OUTER):
            names[v.id] = name[len(OUTER):]
        else:
            if v.id is not None:
                names[v.id] = name
            inputs.append(value_info(name, v))
    scope = Scope(s.model, names, [])
    convert_nodes(scope, graph.nodes)
    outputs = []
    body_outputs = list(graph.outputs.values())
    if loop_flag == 0:
        cond = s.model.names.fresh(f"{label}/cond_out")
        scope.nodes.append(helper.make_node("Identity", [formal[1][1]], [cond], name=cond))
        outputs.append(helper.make_tensor_value_info(cond, ONNX_TYPE_NUMBER["bool"], []))
    for i, v in enumerate(body_outputs):
        name = s.model.names.fresh(f"{label}/out")
        if loop_flag == 1 and i == 0:
            scope.nodes.append(helper.make_node("Cast", [scope.name(v)], [name], name=name,
                                                to=ONNX_TYPE_NUMBER["bool"]))
            outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE_NUMBER["bool"], []))
            continue
        scope.nodes.append(helper.make_node("Identity", [scope.name(v)], [name], name=name))
        outputs.append(value_info(name, v))
    return helper.make_graph(scope.nodes, label, inputs, outputs)


@converts("loop")
def _loop(s, node, ins):
    a = node.attrs
    body, k, n_scan = a["body"].graph, a["carried"], a["scanned"]
    formals = list(body.inputs.values())
    flag = 1 if a["condition"] else 0
    init = []
    for i in range(k):          # a carry that enters narrower ([1, H]) than the body carries it ([N, H])
        x, formal = node.inputs[i], formals[i]
        init.append(ins[i] if tuple(x.shape) == tuple(formal.shape)
                    else s.one("Expand", [ins[i], s.model.shape(formal.shape)], hint="carry"))
    label = s.model.names.fresh(f"{node.scope}/loop_body")
    closure = [(v, _outer(ins[k + n_scan + j])) for j, v in enumerate(formals[k + n_scan:])]
    if n_scan and not flag:
        own = [(v, s.model.names.fresh(f"{label}/in")) for v in formals[:k + n_scan]]
        graph = _body(s, body, own + closure, label)
        direction = [1 if a["reverse"] else 0]
        n_out = len(body.outputs) - k
        return s.emit("Scan", init + ins[k:k + n_scan], k + n_out, hint="scan", body=graph, num_scan_inputs=n_scan,
                      scan_input_directions=direction * n_scan, scan_output_directions=direction * n_out)
    if n_scan:
        s.fail("a loop over sequences that can stop early")
    # a trip count (and an optional stop flag): ONNX Loop, whose body takes (iteration, condition, carries)
    stubs = [(_Stub("int64"), s.model.names.fresh(f"{label}/iteration")),
             (_Stub("bool"), s.model.names.fresh(f"{label}/cond_in"))]
    own = [(v, s.model.names.fresh(f"{label}/in")) for v in formals[:k]]
    graph = _body(s, body, stubs + own + closure, label, loop_flag=flag)
    # a loop whose trips are a bound it must not reach (an imported while-loop's) is written as one
    trips = None if a.get("unfinished") else a.get("trips")
    count = "" if trips is None else s.one("Squeeze", [s.model.dim(trips), s.model.const_i64([0])], hint="trips")
    go = s.model.initializer(np.array(True), "go")
    n_out = len(body.outputs) - flag - k
    return s.emit("Loop", [count, go] + init, k + n_out, hint="loop", body=graph)


class _Stub:
    """A scalar body input of ONNX's own (Loop's iteration number and condition): no Value."""

    def __init__(self, dtype: str):
        self.dtype, self.shape, self.id = dtype, (), None


@converts("if")
def _if(s, node, ins):
    a = node.attrs
    branches = {}
    for key in ("then_body", "else_body"):
        body = a[key].graph
        label = s.model.names.fresh(f"{node.scope}/{key}")
        formal = [(v, _outer(ins[1 + j])) for j, v in enumerate(body.inputs.values())]
        branches[key] = _body(s, body, formal, label)
    cond = ins[0] if node.inputs[0].dtype == "bool" else s.one("Cast", [ins[0]], to=ONNX_TYPE_NUMBER["bool"])
    return s.emit("If", [cond], len(node.outputs), hint="if", then_branch=branches["then_body"],
                  else_branch=branches["else_body"])

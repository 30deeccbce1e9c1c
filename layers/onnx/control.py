"""ONNX's Scan and If as the graph's loop and if. A body (an ONNX subgraph) is converted by a
fresh importer on the body's builder, seeing the outer values by name, as ONNX scoping does; the
loop and if helpers turn the outer values it reads into the body's inputs.

An If whose condition is known at import is inlined (exporters write such Ifs around shapes). A
Loop runs at most ``MAX_LOOP_TRIPS`` trips: one whose body cannot stop it is refused at import
above that, one that can is stopped with an error when it reaches that many.
Scan runs every sequence in one direction, its outputs in the same direction (the form loops
and RNNs export to); other mixes of directions and axes other than 0 are refused."""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import Value
from toolkit.ops.control import if_, loop

from .convert import Importer, is_const
from .ops import converts


def _sub_importer(imp: Importer, builder) -> Importer:
    sub = Importer(imp.path, imp.opset, builder.graph, imp.weights, builder=builder, scope=imp.scope)
    sub.env = dict(imp.env)                # the outer scope, read by name
    sub.absent = dict(imp.absent)
    return sub


def _outputs(imp: Importer, sub: Importer, graph, builder) -> list[Value]:
    outs = []
    for info in graph.output:
        if info.name in sub.absent:
            imp.fail(f"the body's output {info.name}: {sub.absent[info.name]}")
        if info.name not in sub.env:
            imp.fail(f"the body's output {info.name!r} is given by no node, input or initializer")
        v = sub.env[info.name]
        outs.append(v if isinstance(v, Value) else sub.materialize(v))
    return outs


@converts("If")
def _if(imp: Importer, node):
    cond = imp.env[node.input[0]]
    then_graph, else_graph = imp.attr(node, "then_branch"), imp.attr(node, "else_branch")
    if is_const(cond):
        chosen = then_graph if bool(np.asarray(cond).reshape(-1)[0]) else else_graph
        sub = _sub_importer(imp, imp.b)
        sub.run_nodes(chosen.node)
        out = []
        for info in chosen.output:
            if info.name in sub.absent:
                imp.fail(f"the branch's output {info.name}: {sub.absent[info.name]}")
            if info.name not in sub.env:
                imp.fail(f"the branch's output {info.name!r} is given by no node, input or initializer")
            out.append(sub.env[info.name])
        return out
    c = imp.value(node.input[0])
    if c.dtype != "bool":
        c = imp.b.op("cast", c, dtype="bool")

    def branch(graph):
        def build(bb):
            sub = _sub_importer(imp, bb)
            sub.run_nodes(graph.node)
            return _outputs(imp, sub, graph, bb)
        return build
    return list(if_(imp.b, c, branch(then_graph), branch(else_graph)))


@converts("Scan")
def _scan(imp: Importer, node):
    body = imp.attr(node, "body")
    n_scan = int(imp.attr(node, "num_scan_inputs"))
    k = len(node.input) - n_scan
    in_dirs = list(imp.attr(node, "scan_input_directions", [0] * n_scan))
    n_out = len(node.output) - k
    out_dirs = list(imp.attr(node, "scan_output_directions", [0] * n_out))
    if any(list(imp.attr(node, key, [])) and any(list(imp.attr(node, key))) for key in
           ("scan_input_axes", "scan_output_axes")):
        imp.fail("scan axes other than 0 have no counterpart here")
    if len(set(in_dirs + out_dirs)) > 1:
        imp.fail("scan directions that differ between the sequences and the outputs have no counterpart here")
    reverse = bool((in_dirs + out_dirs + [0])[0])
    init = [imp.value(n) for n in node.input[:k]]
    sequences = [imp.value(n) for n in node.input[k:]]
    formal = [i.name for i in body.input]

    def step(bb, carries, xs):
        sub = _sub_importer(imp, bb)
        for name, v in zip(formal, list(carries) + list(xs)):
            sub.env[name] = v
        sub.run_nodes(body.node)
        outs = _outputs(imp, sub, body, bb)
        return outs[:k], outs[k:]
    return loop(imp.b, init, sequences, step, reverse=reverse)


# the most trips a Loop may make: its trip count is a number in the file, and 10^12 trips of even
# the smallest body would run for days (a loop's per-step outputs are bounded by memory when its
# plan is built, its carried values are not); a while-loop's count is often 2^63 - 1, "no bound"
MAX_LOOP_TRIPS = 1 << 20


@converts("Loop")
def _loop(imp: Importer, node):
    """ONNX's Loop with a trip count known at import: the graph's loop, carrying the iteration
    number as one more value; an early stop (a condition the body computes) becomes the loop's
    condition, which gathers no per-step outputs."""
    body = imp.attr(node, "body")
    trips = imp.optional(node, 0)
    if trips is None:
        imp.fail("a loop without a trip count (until its condition fails) has no counterpart here")
    count = int(np.asarray(imp.const(trips, "the trip count")).reshape(-1)[0])
    start = imp.optional(node, 1)
    if start is not None and not bool(np.asarray(imp.const(start, "the first condition")).reshape(-1)[0]):
        count = 0
    carried_names = [n for n in node.input[2:]]
    k = len(carried_names)
    n_scan = len(body.output) - 1 - k
    if len(body.input) != 2 + k or n_scan < 0:
        imp.fail(f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs: a loop carrying "
                 f"{k} values needs {2 + k} inputs (the iteration, the condition, the values) and {1 + k} outputs "
                 "at least")
    iter_name, cond_name = body.input[0].name, body.input[1].name
    stops = _stops(imp, body, [imp.value(n) for n in carried_names])
    if stops and n_scan:
        imp.fail("a loop that can stop early with per-step outputs has no counterpart here")
    if not stops and count > MAX_LOOP_TRIPS:
        imp.fail(f"a trip count of {count:,}, over the {MAX_LOOP_TRIPS:,} trips a loop may run here")
    unfinished = None
    if count > MAX_LOOP_TRIPS:         # one that can stop: run to the bound, checked each trip
        count = MAX_LOOP_TRIPS
        unfinished = f"{imp.path}: node '{imp.b.scope}' (Loop): its condition still holds after " \
                     f"{MAX_LOOP_TRIPS:,} trips, the most a loop may run here"
    if count == 0:
        if n_scan:
            imp.fail("a loop that runs no step, with per-step outputs (empty tensors)")
        return [imp.env[n] for n in carried_names]
    b = imp.b
    counter = b.op("constant", value=np.array(0, dtype=np.int64))
    init = [counter] + [imp.value(n) for n in carried_names]
    formal = [i.name for i in body.input[2:]]

    def step(bb, carries, _xs):
        sub = _sub_importer(imp, bb)
        sub.env[iter_name] = carries[0]
        sub.env[cond_name] = np.array(True)
        for name, v in zip(formal, carries[1:]):
            sub.env[name] = v
        sub.run_nodes(body.node)
        outs = []
        for info in body.output:
            if info.name not in sub.env:
                imp.fail(f"the body's output {info.name!r} is given by no node, input or initializer")
            v = sub.env[info.name]
            outs.append(v if isinstance(v, Value) else sub.materialize(v) if not np.asarray(v).dtype == bool
                        else v)
        following = bb.add(carries[0], bb.op("constant", value=np.array(1, dtype=np.int64)))
        new = [following] + [v if isinstance(v, Value) else sub.materialize(v) for v in outs[1:1 + k]]
        if stops:
            flag = outs[0] if isinstance(outs[0], Value) else bb.op("constant", value=np.asarray(outs[0], bool))
            return flag, new
        return new, [v if isinstance(v, Value) else sub.materialize(v) for v in outs[1 + k:]]
    outs = loop(b, init, [], step, trips=count, condition=stops, unfinished=unfinished)
    return outs[1:]


def _stops(imp: Importer, body, carried: list[Value]) -> bool:
    """Whether the body's condition output can be false: converted once on a scratch graph with
    the condition input true, a for-loop's condition folds to a constant true."""
    from toolkit.ir.graph import Graph, TensorType
    from toolkit.ops.base import Builder
    scratch = Graph("infer")
    sub = _sub_importer(imp, Builder(scratch, imp.b.scope))
    sub.env[body.input[0].name] = Value(TensorType((), "int64"), name="iteration")
    sub.env[body.input[1].name] = np.array(True)
    for info, v in zip(body.input[2:], carried):
        sub.env[info.name] = Value(v.type, name=info.name)
    sub.run_nodes(body.node)
    flag = sub.env.get(body.output[0].name)
    return not (is_const(flag) and bool(np.asarray(flag).reshape(-1)[0]))

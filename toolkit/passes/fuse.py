"""Operator fusion: groups of ops replaced by one fused op, only where the fused kernel is
registered for the graph's device and dtype.

Placement rule shared by the fusions: a fused node runs where the group's last member ran, so a
group may only grow while no node outside it has read one of its values; the first outside
reader closes the group (else that reader would run before the value exists).
"""
from __future__ import annotations

from ..backend.registry import KERNELS
from ..ir.graph import Graph, Node, Value
from ..ops.base import ShapeError, get_op
from ..ops.fused import EPILOGUE_HEADS, POOL_PREFIX, make_step, store_program
from ..ops.reduce import reduced_count
from .context import PassContext
from .rewrite import kept_ids

# Elementwise ops a fused program may hold: pure, one output, same dtype in and out (a cast
# changes the dtype: a group holds values of one type).
NOT_FUSABLE = frozenset({"cast"})
# the points of a pipeline stage's schedule that no fused group spans
PIPELINE_POINTS = frozenset({"send", "recv"})


def fuse_conv_max_pool(graph: Graph, ctx: PassContext) -> bool:
    """conv2d -> max_pool2d becomes conv2d_max_pool2d when the convolution's output is read by
    that pooling alone (so never in a train graph, whose pooling gradient reads it too), is not
    a graph output, and the pooling is unpadded and floor-mode (its windows stay inside)."""
    where = ctx.placement(graph)
    readers = graph.consumers()
    kept = kept_ids(graph)
    new_nodes: list[Node] = []
    fused_any = False
    for node in graph.nodes:
        if node.op == "max_pool2d":
            conv = node.inputs[0].producer
            device = where.node(node)
            ok = (conv is not None and conv.op == "conv2d" and where.node(conv) == device
                  and len(readers.get(node.inputs[0].id, [])) == 1
                  and node.inputs[0].id not in kept
                  and node.attrs["pad"] == (0, 0) and not node.attrs["ceil_mode"]
                  and KERNELS.has("conv2d_max_pool2d", device, node.outputs[0].dtype))
            if ok:
                attrs = dict(conv.attrs)
                attrs.update({POOL_PREFIX + k: v for k, v in node.attrs.items()})
                fused = Node("conv2d_max_pool2d", conv.inputs, attrs, f"{conv.scope}+{node.scope}")
                fused.outputs = node.outputs
                for out in fused.outputs:
                    out.producer = fused
                new_nodes.remove(conv)
                new_nodes.append(fused)
                ctx.note(f"fuse_conv_max_pool: {fused.scope}")
                fused_any = True
                continue
        new_nodes.append(node)
    graph.nodes = new_nodes
    return fused_any


# -- elementwise groups ---------------------------------------------------------------------------
def _fusable(node: Node) -> bool:
    opdef = get_op(node.op)
    return (opdef.elementwise and opdef.pure and node.op not in NOT_FUSABLE and len(node.outputs) == 1
            and all(v.dtype == node.outputs[0].dtype for v in node.inputs))


class _Group:
    def __init__(self, node: Node, device):
        self.members = [node]
        self.type = node.outputs[0].type
        self.device = device
        self.open = True

    def produced(self) -> set[int]:
        return {n.outputs[0].id for n in self.members}


def _scope_of(nodes: list[Node]) -> str:
    scopes = list(dict.fromkeys(n.scope for n in nodes))
    return scopes[0] if len(scopes) == 1 else f"{scopes[0]}+{len(scopes) - 1} more"


def _view_of(v: Value) -> tuple | None:
    """(source, (axis, start, stop)) when ``v`` is a slice a fused program can read in place:
    along a non-batch axis, with fixed bounds."""
    node = v.producer
    if node is None or node.op != "slice":
        return None
    axis = node.attrs["axis"] % v.rank
    start, stop = node.attrs["start"], node.attrs["stop"]
    if axis < 1 or not isinstance(start, int) or not isinstance(stop, int):
        return None
    return node.inputs[0], (axis, start, stop)


def _program(members: list[Node], inputs: list[Value], views: list[tuple], absorb=lambda v: False):
    """Steps for ``members`` in order; values they read from outside become node inputs
    (appended to ``inputs``, with ``views``), a slice that ``absorb`` allows read in place
    through a view of its source."""
    step_of = {n.outputs[0].id: j for j, n in enumerate(members)}
    slot = {(v.id, view): i for i, (v, view) in enumerate(zip(inputs, views))}
    steps = []
    for n in members:
        refs = []
        for v in n.inputs:
            if v.id in step_of:
                refs.append(("t", step_of[v.id]))
                continue
            source, view = v, ()
            viewed = _view_of(v) if absorb(v) else None
            if viewed is not None:
                source, view = viewed
            if (source.id, view) not in slot:
                slot[(source.id, view)] = len(inputs)
                inputs.append(source)
                views.append(view)
            refs.append(("x", slot[(source.id, view)]))
        steps.append(make_step(n.op, refs, n.attrs))
    return tuple(steps)


def _replace_group(graph: Graph, members: list[Node], fused: Node, leaving: list[Value]) -> None:
    """Put ``fused`` where the last member was, drop the members, point ``leaving`` at it."""
    fused.outputs = leaving
    for v in leaving:
        v.producer = fused
    gone = {id(n) for n in members}
    last = max(i for i, n in enumerate(graph.nodes) if id(n) in gone)
    graph.nodes = [fused if i == last else n for i, n in enumerate(graph.nodes) if id(n) not in gone or i == last]


def _spread_by_readers(value: Value, small: Value, readers: list[Node]) -> bool:
    """Every reader of ``value`` is a fusable elementwise op of ``value``'s type that broadcasts
    ``small`` in its place to that same type (its shape rule says so, and another operand gives
    the shape): reading the smaller operand, each computes the same values."""
    def same_result(r: Node) -> bool:
        types = [small.type if v.id == value.id else v.type for v in r.inputs]
        try:
            return get_op(r.op).infer(types, dict(r.attrs)) == [r.outputs[0].type]
        except ShapeError:       # a shape rule refusing the smaller operand: no spread
            return False
    return bool(readers) and all(
        _fusable(r) and r.outputs[0].type == value.type
        and any(v.id != value.id and v.type.shape == value.type.shape for v in r.inputs) and same_result(r)
        for r in readers)


def spread_mean_gradients(graph: Graph, ctx: PassContext) -> bool:
    """reduce_mean_grad(g) spreads g / count over a whole image: written out, a full-size array
    that the next elementwise op reads back (two per BatchNorm in a train step). Where every
    reader is an elementwise op that broadcasts g anyway, the readers take div_count(g) (g's own
    size) and the spread happens in their registers once they are fused. The division is the
    one reduce_mean_grad makes, so the values are the same bit for bit."""
    where = ctx.placement(graph)
    readers = graph.consumers()
    kept = kept_ids(graph)
    changed = False
    new_nodes: list[Node] = []
    for node in graph.nodes:
        out = node.outputs[0] if node.outputs else None
        if (node.op == "reduce_mean_grad" and out.id not in kept
                and _spread_by_readers(out, node.inputs[0], readers.get(out.id, []))
                and all(where.node(r) == where.node(node) for r in readers[out.id])
                and KERNELS.has("fused_elementwise", where.node(node), out.dtype)):
            g = node.inputs[0]
            spread = Node("div_count", [g], {"count": reduced_count(node.attrs["shape"], node.attrs["axes"])},
                          node.scope)
            spread.outputs = [Value(g.type, spread)]
            for r in readers[out.id]:
                r.inputs = [spread.outputs[0] if v.id == out.id else v for v in r.inputs]
            new_nodes.append(spread)
            changed = True
            ctx.note(f"spread_mean_gradients: {node.scope}: its readers broadcast g / count")
            continue
        new_nodes.append(node)
    graph.nodes = new_nodes
    return changed


def fuse_elementwise(graph: Graph, ctx: PassContext) -> bool:
    """Chains and trees of elementwise ops of one shape and dtype become one fused_elementwise
    op that passes over memory once; values read outside the group become its outputs."""
    fused_any = spread_mean_gradients(graph, ctx)
    where = ctx.placement(graph)
    owner: dict[int, _Group] = {}
    groups: list[_Group] = []
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        joined: list[_Group] = []
        device = where.node(node)
        if _fusable(node):
            for v in node.inputs:
                g = owner.get(v.id)
                if (g is not None and g.open and g.type == node.outputs[0].type and g.device == device
                        and g not in joined):
                    joined.append(g)
        for v in node.inputs:                 # an outside reader closes the group it reads
            g = owner.get(v.id)
            if g is not None and g not in joined:
                g.open = False
        if node.op in PIPELINE_POINTS:
            # a pipeline stage's schedule puts work on either side of each send and receive (a
            # micro-batch's gradient added to its running sum in that micro-batch's backward
            # pass): a group joined across one would run later, holding what it reads until then
            for g in groups:
                g.open = False
        if joined:
            # every group this node reads is still open (no outside reader has seen its values),
            # so they may all run where this node runs: one group
            target = joined[0]
            for other in joined[1:]:
                target.members.extend(other.members)
                for n in other.members:
                    owner[n.outputs[0].id] = target
                groups.remove(other)
            target.members.append(node)
            target.members.sort(key=lambda n: order[id(n)])
            owner[node.outputs[0].id] = target
        elif _fusable(node):
            g = _Group(node, device)
            groups.append(g)
            owner[node.outputs[0].id] = g

    kept = kept_ids(graph)
    readers = graph.consumers()
    for g in groups:
        if not KERNELS.has("fused_elementwise", g.device, g.type.dtype):
            continue
        inside = {id(n) for n in g.members}

        def absorb(v: Value) -> bool:     # a slice only this group reads: read it in place
            return v.id not in kept and all(id(r) in inside for r in readers.get(v.id, []))
        reads_slice = any(absorb(v) and _view_of(v) for n in g.members for v in n.inputs)
        if len(g.members) < 2 and not reads_slice:
            continue
        leaving = [n.outputs[0] for n in g.members
                   if n.outputs[0].id in kept or any(id(r) not in inside for r in readers.get(n.outputs[0].id, []))]
        inputs: list[Value] = []
        views: list[tuple] = []
        program = _program(g.members, inputs, views, absorb)
        step_of = {n.outputs[0].id: j for j, n in enumerate(g.members)}
        attrs = {"program": program, "outputs": tuple(step_of[v.id] for v in leaving)}
        if any(views):
            attrs["views"] = tuple(views)
        fused = Node("fused_elementwise", inputs, attrs, _scope_of(g.members))
        _replace_group(graph, g.members, fused, leaving)
        fused_any = True
        ctx.note(f"fuse_elementwise: {len(g.members)} op(s) of {fused.scope} -> one pass "
                 f"({', '.join(n.op for n in g.members)}{', reading slices in place' if any(views) else ''})")
    return fused_any


# -- epilogues ------------------------------------------------------------------------------------
def _can_head(node: Node) -> bool:
    """A head whose output the plan splits by rows (or not at all), never a sum over the batch
    (a weight gradient: its per-core shares are added after the GEMM, so no epilogue can run on
    a share)."""
    if node.op not in EPILOGUE_HEADS or len(node.outputs) != 1:
        return False
    if node.op == "matmul" and node.attrs["trans_a"]:
        return False
    return True


def fuse_epilogue(graph: Graph, ctx: PassContext) -> bool:
    """A GEMM or convolution whose result only an elementwise op or group reads becomes one
    fused_epilogue op: the program runs on the head's output while it is still in cache (bias,
    activation, residual add, scaling)."""
    where = ctx.placement(graph)
    readers = graph.consumers()
    kept = kept_ids(graph)
    fused_any = False
    for node in list(graph.nodes):
        if node.op == "fused_elementwise":
            program, outputs = node.attrs["program"], node.attrs["outputs"]
            views = node.attrs.get("views", ((),) * len(node.inputs))
        elif _fusable(node):
            program, outputs = (make_step(node.op, [("x", i) for i in range(len(node.inputs))], node.attrs),), (0,)
            views = ((),) * len(node.inputs)
        else:
            continue
        group_type = node.outputs[0].type
        device = where.node(node)
        head = next((v.producer for v, view in zip(node.inputs, views)
                     if not view and v.producer is not None and _can_head(v.producer) and v.type == group_type
                     and v.id not in kept and len(readers.get(v.id, [])) == 1
                     and where.node(v.producer) == device), None)
        if head is None or not KERNELS.has("fused_epilogue", device, group_type.dtype):
            continue
        head_value = head.outputs[0]
        inputs = list(head.inputs)
        new_views = [()] * len(inputs)
        old_to_new = {}
        for i, (v, view) in enumerate(zip(node.inputs, views)):
            if v.id == head_value.id and not view:
                old_to_new[i] = ("h",)
            else:
                old_to_new[i] = ("x", len(inputs))
                inputs.append(v)
                new_views.append(view)
        remapped = tuple((op, tuple(old_to_new[r[1]] if r[0] == "x" else r for r in args), attrs)
                         for op, args, attrs in program)
        # the blocked convolutions' kernels apply only what a tile applies as it stores
        if head.op == "conv2d_blocked" and store_program(
                remapped, outputs, lambda i: not new_views[i] and inputs[i].type == head_value.type) is None:
            continue
        attrs = {"head": head.op, "head_attrs": tuple(sorted(head.attrs.items())), "head_inputs": len(head.inputs),
                 "program": remapped, "outputs": outputs}
        if any(new_views):
            attrs["views"] = tuple(new_views)
        fused = Node("fused_epilogue", inputs, attrs, f"{head.scope}+{node.scope}")
        _replace_group(graph, [head, node], fused, list(node.outputs))
        fused_any = True
        ctx.note(f"fuse_epilogue: {head.op} of {head.scope} + {len(program)} elementwise op(s) "
                 f"({', '.join(step[0] for step in program)})")
    return fused_any

"""fuse_reductions: a reduce_sum / reduce_mean over every axis but the channels (axis 1 of NCHW,
the last of a channels-last NHWC) whose input is an elementwise group (or one elementwise op)
read by nothing else becomes one ``fused_reduce``: the group's program is evaluated inside the
reduction and its result, an activation-sized tensor, is never written nor read back. BatchNorm
in training makes these: its variance is the mean of square(x - mean), and its backward pass
sums dy * xc and dy per channel.

Then reductions of that kind that read a whole operand in common (the backward pass's sums of dy,
dy * x_hat and dy * w * xc) become one fused_reduce of several outputs, which reads each operand
once: placed before the first of them where every operand is made by then, else after the last
where none of their results is read before.

It fires where the device has a kernel that pays (a GPU's two-stage channel reduction, while
the ``channel_reductions`` setting is on), for operands read whole, per channel or as one value.
Runs after the elementwise fusion, so the groups it absorbs are already formed; the fused node
takes the reduction's place, which every operand of the group precedes.
"""
from __future__ import annotations

from ..backend.registry import KERNELS
from ..ir.graph import Graph, Node, Value
from ..ops.base import get_op
from ..ops.fused import program_types
from .context import PassContext
from .rewrite import kept_ids, reader_counts

REDUCTIONS = ("reduce_sum", "reduce_mean")
DTYPES = ("float32", "float64", "float16")       # the channel kernel's (bfloat16 is not among them)


def _channel_axis(node: Node) -> int | None:
    """The channel axis of a reduction over every other axis: 1 of [N, C, ...], or the last of a
    channels-last [..., C] (and of [N, C]); None for a reduction of any other axes."""
    rank = node.inputs[0].rank
    axes = tuple(sorted(a % rank for a in node.attrs["axes"])) if rank else ()
    if rank >= 2 and axes == tuple(range(rank - 1)):
        return rank - 1
    if rank >= 3 and axes == tuple(i for i in range(rank) if i != 1):
        return 1
    return None


def _cone(program, step: int):
    """The steps ``step`` needs, renumbered, with the inputs they read: (program, its output
    step, the original input positions in their new order)."""
    needed, stack = set(), [step]
    while stack:
        s = stack.pop()
        if s not in needed:
            needed.add(s)
            stack += [ref[1] for ref in program[s][1] if ref[0] == "t"]
    order = sorted(needed)
    steps = {old: new for new, old in enumerate(order)}
    inputs = sorted({ref[1] for s in order for ref in program[s][1] if ref[0] == "x"})
    places = {old: new for new, old in enumerate(inputs)}
    renamed = tuple((op, tuple(("t", steps[r[1]]) if r[0] == "t" else ("x", places[r[1]]) for r in args), attrs)
                    for op, args, attrs in (program[s] for s in order))
    return renamed, steps[step], inputs


def _program(producer: Node, value: Value):
    """(program, output step, operands) computing ``value``: the steps of an elementwise group
    that it needs, or a lone pure elementwise op; None for any other producer."""
    if producer.op == "fused_elementwise":
        program = producer.attrs["program"]
        if any(producer.attrs.get("views", ())) or any(get_op(op).scalar_expr is None for op, _a, _t in program):
            return None          # a view, or a step the kernel generator cannot write
        k = next(i for i, out in enumerate(producer.outputs) if out.id == value.id)
        program, output, inputs = _cone(program, producer.attrs["outputs"][k])
        return program, output, [producer.inputs[i] for i in inputs]
    opdef = get_op(producer.op)
    if opdef.elementwise and opdef.pure and len(producer.outputs) == 1 and opdef.scalar_expr is not None:
        args = tuple(("x", i) for i in range(len(producer.inputs)))
        return ((producer.op, args, tuple(sorted(producer.attrs.items()))),), 0, list(producer.inputs)
    return None


def _operand_fits(v: Value, group: Value, axis: int) -> bool:
    """``v`` is read whole (the group's shape), per channel ([C] broadcast along the channel
    ``axis``), or as one value, in the group's dtype."""
    if v.dtype != group.dtype:
        return False
    if tuple(v.shape) == tuple(group.shape) or v.type.numel == 1:
        return True
    if v.rank > group.rank:
        return False
    padded = (1,) * (group.rank - v.rank) + tuple(v.shape)
    return padded[axis] == group.shape[axis] and all(d == 1 for i, d in enumerate(padded) if i != axis)


def fuse_reductions(graph: Graph, ctx: PassContext) -> bool:
    """Each per-channel reduce_sum / reduce_mean whose input is read by nothing else and computed by
    an elementwise group or op on the same device becomes a fused_reduce of the steps it needs (a
    group loses that output, and goes when it has none left); then per-channel reductions that
    read a whole operand in common become one fused_reduce of several outputs."""
    absorbed = _absorb_producers(graph, ctx)
    return _merge_siblings(graph, ctx) or absorbed


def _absorb_producers(graph: Graph, ctx: PassContext) -> bool:
    where = ctx.placement(graph)
    producer_of = {v.id: n for n in graph.nodes for v in n.outputs}
    readers = reader_counts(graph)
    replaced: dict[int, Node] = {}          # id(reduction) -> the fused node at its place
    taken: dict[int, set[int]] = {}         # id(group) -> ids of its outputs now computed by a fused node
    for node in graph.nodes:
        axis = _channel_axis(node) if node.op in REDUCTIONS else None
        if axis is None:
            continue
        x = node.inputs[0]
        producer = producer_of.get(x.id)
        if producer is None or readers.get(x.id, 0) != 1:
            continue
        found = _program(producer, x)
        device = where.node(node)
        if (found is None or x.dtype not in DTYPES or where.node(producer) != device
                or not all(_operand_fits(v, x, axis) for v in found[2])
                or not KERNELS.fusion_pays("fused_reduce", device, x.dtype, node)):
            continue
        program, output, operands = found
        fused = Node("fused_reduce", operands,
                     {"program": program, "outputs": (("t", output),), "means": (node.op == "reduce_mean",),
                      "axes": tuple(node.attrs["axes"]), "keepdims": node.attrs["keepdims"]}, node.scope)
        fused.outputs = list(node.outputs)
        for out in fused.outputs:
            out.producer = fused
        replaced[id(node)] = fused
        taken.setdefault(id(producer), set()).add(x.id)
        ctx.note(f"fuse_reductions: {node.scope}: {node.op} of {producer.op}")
    if not replaced:
        return False
    nodes = []
    for node in graph.nodes:
        if id(node) in taken:
            node = _without_outputs(node, taken[id(node)])
            if node is None:
                continue
        nodes.append(replaced.get(id(node), node))
    graph.nodes = nodes
    return True


def _without_outputs(group: Node, gone: set[int]) -> Node | None:
    """``group`` without the outputs whose ids are in ``gone`` (None when none is left): the
    steps that computed them stay, unstored, where the other outputs need them."""
    kept = [k for k, out in enumerate(group.outputs) if out.id not in gone]
    if not kept:
        return None
    if len(kept) == len(group.outputs):
        return group
    attrs = {**group.attrs, "outputs": tuple(group.attrs["outputs"][k] for k in kept)}
    smaller = Node(group.op, list(group.inputs), attrs, group.scope)
    smaller.outputs = [group.outputs[k] for k in kept]
    for out in smaller.outputs:
        out.producer = smaller
    return smaller


# -- siblings: reductions reading a whole operand in common, one pass over it -------------------
MAX_OUTPUTS = 4          # each output keeps four sums per lane: registers, not memory


def _member(node: Node, where, ctx_device) -> tuple | None:
    """(program, outputs, means, operands, key) of a per-channel reduction that may join others,
    key what must be equal to join (device, dtype, the reduced values' shape, axes, keepdims)."""
    if node.op == "fused_reduce":
        program, outputs, means = node.attrs["program"], tuple(node.attrs["outputs"]), tuple(node.attrs["means"])
        operands = list(node.inputs)
        first = outputs[0]
        shape = (operands[first[1]].shape if first[0] == "x" else
                 program_types(program, [v.type for v in operands])[first[1]].shape)
    elif node.op in REDUCTIONS and _channel_axis(node) is not None and node.inputs[0].dtype in DTYPES:
        program, outputs, means, operands = (), (("x", 0),), (node.op == "reduce_mean",), [node.inputs[0]]
        shape = node.inputs[0].shape
        if not KERNELS.fusion_pays("fused_reduce", where.node(node), node.inputs[0].dtype, node):
            return None
    else:
        return None
    rank = len(shape)
    axes = tuple(sorted(a % rank for a in node.attrs["axes"]))
    key = (where.node(node), node.outputs[0].dtype, tuple(shape), axes, node.attrs["keepdims"])
    return program, outputs, means, operands, key


def _whole(operands, shape) -> set[int]:
    return {v.id for v in operands if tuple(v.shape) == tuple(shape)}


def _merged(members: list[Node], parts: list[tuple]) -> Node:
    """One fused_reduce computing every member's outputs, in the members' order."""
    operands, place = [], {}
    program, outputs, means = [], [], []
    for prog, outs, mns, ops, _key in parts:
        local = []
        for v in ops:
            if v.id not in place:
                place[v.id] = len(operands)
                operands.append(v)
            local.append(place[v.id])
        base = len(program)

        def ref(r, base=base, local=local):
            return ("t", r[1] + base) if r[0] == "t" else ("x", local[r[1]])
        program += [(op, tuple(ref(r) for r in args), attrs) for op, args, attrs in prog]
        outputs += [ref(r) for r in outs]
        means += list(mns)
    first = members[0]
    node = Node("fused_reduce", operands, {"program": tuple(program), "outputs": tuple(outputs),
                                           "means": tuple(means), "axes": tuple(first.attrs["axes"]),
                                           "keepdims": first.attrs["keepdims"]}, first.scope)
    node.outputs = [o for m in members for o in m.outputs]
    for out in node.outputs:
        out.producer = node
    return node


def _merge_siblings(graph: Graph, ctx: PassContext) -> bool:
    where = ctx.placement(graph)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    produced_at = {v.id: position[id(n)] for n in graph.nodes for v in n.outputs}
    first_read: dict[int, float] = {v: float("inf") for v in kept_ids(graph)}
    for n in graph.nodes:
        for v in n.inputs:
            first_read[v.id] = min(first_read.get(v.id, float("inf")), position[id(n)])
    parts = {id(n): _member(n, where, ctx.device) for n in graph.nodes}

    def placement(group: list[Node]) -> int | None:
        """Where the merged node may stand: before the first member, if every operand is made
        by then; else after the last, if no output is read before; else nowhere."""
        first, last = min(position[id(m)] for m in group), max(position[id(m)] for m in group)
        if all(produced_at.get(v.id, -1) < first for m in group for v in m.inputs):
            return first
        if all(first_read.get(o.id, float("inf")) > last for m in group for o in m.outputs):
            return last
        return None

    merged_at: dict[int, Node] = {}         # position -> the merged node standing there
    gone: set[int] = set()                  # id(member) merged into another node
    for node in graph.nodes:
        part = parts[id(node)]
        if part is None or id(node) in gone:
            continue
        key = part[4]
        group, shared, outputs = [node], _whole(part[3], key[2]), len(part[1])
        for other in graph.nodes[position[id(node)] + 1:]:
            other_part = parts[id(other)]
            if (other_part is None or id(other) in gone or other_part[4] != key
                    or not shared & _whole(other_part[3], key[2])
                    or outputs + len(other_part[1]) > MAX_OUTPUTS or placement(group + [other]) is None):
                continue
            group.append(other)
            shared |= _whole(other_part[3], key[2])
            outputs += len(other_part[1])
        if len(group) < 2:
            continue
        at = placement(group)
        merged_at[at] = _merged(group, [parts[id(m)] for m in group])
        gone |= {id(m) for m in group}
        for m in group:         # the next groups' placements see this one where it now stands
            for o in m.outputs:
                produced_at[o.id] = at
            for v in m.inputs:
                first_read[v.id] = min(first_read.get(v.id, float("inf")), at)
        ctx.note(f"fuse_reductions: {len(group)} reductions read {key[2]} once at {node.scope}")
    if not merged_at:
        return False
    nodes = []
    for i, n in enumerate(graph.nodes):
        if i in merged_at:
            nodes.append(merged_at[i])
        if id(n) not in gone:
            nodes.append(n)
    graph.nodes = nodes
    return True

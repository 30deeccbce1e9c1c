"""fuse_reductions: a reduce_sum / reduce_mean over every axis but the channels whose input is an
elementwise group (or one elementwise op) read by nothing else becomes one ``fused_reduce``: the
group's program is evaluated inside the reduction and its result, an activation-sized tensor, is
never written nor read back. BatchNorm in training makes these: its variance is the mean of
square(x - mean), and its backward pass sums dy * xc and dy per channel.

It fires where the device has a kernel that pays (a GPU's two-stage channel reduction, while
the ``channel_reductions`` setting is on), for operands read whole, per channel or as one value.
Runs after the elementwise fusion, so the groups it absorbs are already formed; the fused node
takes the reduction's place, which every operand of the group precedes.
"""
from __future__ import annotations

from ..backend.registry import KERNELS
from ..ir.graph import Graph, Node, Value
from ..ops.base import get_op
from .context import PassContext
from .rewrite import reader_counts

REDUCTIONS = ("reduce_sum", "reduce_mean")
DTYPES = ("float32", "float64", "float16")       # the channel kernel's (bfloat16 is not among them)


def _channel_axes(node: Node) -> bool:
    rank = node.inputs[0].rank
    axes = tuple(sorted(a % rank for a in node.attrs["axes"])) if rank else ()
    return rank >= 2 and axes == tuple(i for i in range(rank) if i != 1)


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


def _operand_fits(v: Value, group: Value) -> bool:
    """``v`` is read whole (the group's shape), per channel ([C] broadcast as [1, C, 1, ...]),
    or as one value, in the group's dtype."""
    if v.dtype != group.dtype:
        return False
    if tuple(v.shape) == tuple(group.shape) or v.type.numel == 1:
        return True
    if v.rank > group.rank:
        return False
    padded = (1,) * (group.rank - v.rank) + tuple(v.shape)
    return padded[1] == group.shape[1] and all(d == 1 for i, d in enumerate(padded) if i != 1)


def fuse_reductions(graph: Graph, ctx: PassContext) -> bool:
    """Each per-channel reduce_sum / reduce_mean whose input is read by nothing else and computed by
    an elementwise group or op on the same device becomes a fused_reduce of the steps it needs;
    a group loses that output (and goes when it has none left)."""
    where = ctx.placement(graph)
    producer_of = {v.id: n for n in graph.nodes for v in n.outputs}
    readers = reader_counts(graph)
    replaced: dict[int, Node] = {}          # id(reduction) -> the fused node at its place
    taken: dict[int, set[int]] = {}         # id(group) -> ids of its outputs now computed by a fused node
    for node in graph.nodes:
        if node.op not in REDUCTIONS or not _channel_axes(node):
            continue
        x = node.inputs[0]
        producer = producer_of.get(x.id)
        if producer is None or readers.get(x.id, 0) != 1:
            continue
        found = _program(producer, x)
        device = where.node(node)
        if (found is None or x.dtype not in DTYPES or where.node(producer) != device
                or not all(_operand_fits(v, x) for v in found[2])
                or not KERNELS.fusion_pays("fused_reduce", device, x.dtype, node)):
            continue
        program, output, operands = found
        fused = Node("fused_reduce", operands,
                     {"program": program, "outputs": (output,), "axes": tuple(node.attrs["axes"]),
                      "keepdims": node.attrs["keepdims"], "mean": node.op == "reduce_mean"}, node.scope)
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

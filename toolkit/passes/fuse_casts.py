"""Casts taken into the fused kernels beside them: a mixed-precision step's float16 <-> float32
conversions done where a fused kernel loads or stores the value, instead of as passes of their
own over memory.

A mixed-precision train step keeps convolutions in float16 and BatchNorm's arithmetic in float32
(passes/precision.py), so every BatchNorm reads its convolution's output through a widening cast
and hands its result to the next convolution through a narrowing one; in the backward pass the
gradients cross the same way. Each cast reads and writes a whole activation. Here:

- a **widening** cast (float16 -> float32: exact) whose value only fused kernels read that can
  widen an input as they load it (fused_elementwise, fused_reduce) goes: they read its operand in
  the narrow type;
- a **narrowing** cast (float32 -> float16) of a fused group's output goes: the group stores
  that output rounded, as the cast would have (round to nearest even), beside the float32 one
  where something else still reads that.

A lone elementwise op or per-channel reduction beside such a cast becomes a fused op of one step
(or of its operand) to take it in.

The fused ops record it in ``compute``, ``in_dtypes`` and ``out_dtypes`` (ops/fused.py), and
the values are the same bit for bit. Only where the device's fused kernel says it stores that
dtype (``stores`` in the kernel registry: the GPU's CUDA kernels); the CPU's kernels compute in
one dtype, so its graphs keep their casts.
"""
from __future__ import annotations

import numpy as np

from ..backend.registry import KERNELS
from ..ir.graph import FLOAT_DTYPES, Graph, Node
from ..ops.fused import make_step
from .context import PassContext
from .fuse import _fusable
from .fuse_reductions import REDUCTIONS, _channel_axis
from .rewrite import kept_ids

# the fused ops that may read inputs stored in a narrower type
WIDENING_READERS = ("fused_elementwise", "fused_reduce")


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def compute_dtype(node: Node) -> str:
    """The dtype a fused node's program computes in."""
    return node.attrs.get("compute") or node.outputs[0].dtype


def _stored_types(node: Node) -> tuple[str, tuple, tuple]:
    compute = compute_dtype(node)
    ins = tuple(node.attrs.get("in_dtypes") or (v.dtype for v in node.inputs))
    outs = tuple(node.attrs.get("out_dtypes") or (v.dtype for v in node.outputs))
    return compute, ins, outs


def _record(node: Node, compute: str, ins: tuple, outs: tuple) -> None:
    node.attrs = {**node.attrs, "compute": compute, "in_dtypes": ins}
    if node.op == "fused_elementwise":
        node.attrs["out_dtypes"] = outs


def _stores(node: Node, device, dtype: str) -> bool:
    return dtype in KERNELS.stores(node.op, device, compute_dtype(node))


def _uniform(node: Node) -> bool:
    """Every input of a fused node without stored types has its compute dtype (then the program
    reads them all as one type, and one may be stored narrower)."""
    return "compute" in node.attrs or all(v.dtype == compute_dtype(node) for v in node.inputs)


def _fused_form(node: Node, device) -> dict | None:
    """A lone op in the form of the fused op that can store values narrower (its new op and
    attributes), so that a cast beside it can be taken in: an elementwise op as a one-step
    group, a per-channel reduction as a fused_reduce of its operand; None for any other op."""
    if node.op in WIDENING_READERS:
        return {"op": node.op, "attrs": node.attrs}
    dtype = node.outputs[0].dtype if node.outputs else None
    if _fusable(node) and KERNELS.has("fused_elementwise", device, dtype):
        step = make_step(node.op, [("x", i) for i in range(len(node.inputs))], node.attrs)
        return {"op": "fused_elementwise", "attrs": {"program": (step,), "outputs": (0,)}}
    if (node.op in REDUCTIONS and _channel_axis(node) is not None
            and KERNELS.fusion_pays("fused_reduce", device, node.inputs[0].dtype, node)):
        return {"op": "fused_reduce", "attrs": {"program": (), "outputs": (("x", 0),),
                                                "means": (node.op == "reduce_mean",),
                                                "axes": tuple(node.attrs["axes"]),
                                                "keepdims": node.attrs["keepdims"]}}
    return None


def _become(node: Node, form: dict) -> None:
    """Turn ``node`` into its fused form in place (its inputs, outputs and place stay)."""
    node.op, node.attrs = form["op"], dict(form["attrs"])


def _store_narrowed(cast: Node, readers, kept, where) -> bool:
    """The cast's operand is an output of a fused group (or of a lone elementwise op): the group
    stores the cast's value too, in place of its own output where nothing else reads that."""
    x, y = cast.inputs[0], cast.outputs[0]
    group = x.producer
    device = where.node(cast)
    form = _fused_form(group, device) if group is not None and where.node(group) == device else None
    if form is None or form["op"] != "fused_elementwise":
        return False
    probe = Node(form["op"], group.inputs, form["attrs"], group.scope)
    probe.outputs = group.outputs
    if not _uniform(probe) or not _stores(probe, device, y.dtype):
        return False
    _become(group, form)
    compute, ins, outs = _stored_types(group)
    k = next(i for i, v in enumerate(group.outputs) if v.id == x.id)
    if x.id in kept or len(readers.get(x.id, [])) != 1:       # others read it: store both
        group.attrs["outputs"] = tuple(group.attrs["outputs"]) + (group.attrs["outputs"][k],)
        _record(group, compute, ins, outs + (y.dtype,))
        group.outputs.append(y)
    else:
        _record(group, compute, ins, outs[:k] + (y.dtype,) + outs[k + 1:])
        group.outputs[k] = y
    y.producer = group
    return True


def _load_widened(cast: Node, readers, where) -> bool:
    """Every reader of the cast's value is a fused op (or a lone op that can be one) that can
    widen the operand as it loads it: they read the operand instead."""
    x, y = cast.inputs[0], cast.outputs[0]
    device = where.node(cast)
    users = list(dict.fromkeys(readers.get(y.id, [])))      # a reader reading it twice is one reader
    forms = [_fused_form(r, device) if where.node(r) == device else None for r in users]
    if not users or any(f is None for f in forms):
        return False
    for r, form in zip(users, forms):
        probe = Node(form["op"], r.inputs, form["attrs"], r.scope)
        probe.outputs = r.outputs
        if not _uniform(probe) or compute_dtype(probe) != y.dtype or not _stores(probe, device, x.dtype):
            return False
    for r, form in zip(users, forms):
        _become(r, form)
        compute, ins, outs = _stored_types(r)
        ins = tuple(x.dtype if v.id == y.id else d for v, d in zip(r.inputs, ins))
        r.inputs = [x if v.id == y.id else v for v in r.inputs]
        _record(r, compute, ins, outs)
    return True


def fuse_casts(graph: Graph, ctx: PassContext) -> bool:
    """Widening casts read only by fused kernels, and narrowing casts of fused groups' outputs,
    taken into those kernels where the device's kernels store the dtype."""
    where = ctx.placement(graph)
    readers = graph.consumers()
    kept = kept_ids(graph)
    gone: set[int] = set()
    for node in graph.nodes:
        if node.op != "cast" or node.outputs[0].id in kept:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if x.dtype not in FLOAT_DTYPES or y.dtype not in FLOAT_DTYPES:
            continue
        if _itemsize(y.dtype) < _itemsize(x.dtype):
            taken = _store_narrowed(node, readers, kept, where)
            how = "stored rounded by the group computing it"
        elif _itemsize(y.dtype) > _itemsize(x.dtype):
            taken = _load_widened(node, readers, where)
            how = "loaded widened by the fused kernels reading it"
        else:
            taken = False
        if taken:
            gone.add(id(node))
            readers = graph.consumers()
            ctx.note(f"fuse_casts: {node.scope}: {x.dtype} -> {y.dtype} {how}")
    if gone:
        graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    return bool(gone)


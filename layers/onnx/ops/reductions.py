"""ONNX's reductions (ReduceMean ... ReduceLogSumExp), TopK, ArgMax and ArgMin."""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import Value

from .base import axes_input, converts, float_input, reduce_max


@converts("ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceL1", "ReduceMax", "ReduceMin",
          "ReduceLogSumExp")
def _reduce(imp, node):
    given = imp.value(node.input[0])
    if given.dtype == "bool" and node.op_type in ("ReduceMax", "ReduceMin"):     # any / all, on a 0/1 mask
        y = _reduce_floats(imp, node, imp.b.op("cast", given, dtype="float32"))
        return [imp.b.op("cast", y, dtype="bool")]
    return [_reduce_floats(imp, node, float_input(imp, node.input[0]))]


def _reduce_floats(imp, node, x: Value) -> Value:
    op = node.op_type
    takes_input = op == "ReduceSum" or imp.opset >= 18
    axes = axes_input(imp, node, 1, x.rank) if takes_input else \
        ([int(a) % x.rank for a in imp.attr(node, "axes")] if imp.attr(node, "axes") is not None else None)
    keep = bool(imp.attr(node, "keepdims", 1))
    if not axes:
        if imp.attr(node, "noop_with_empty_axes", 0):
            return x
        axes = list(range(x.rank))
    axes = tuple(sorted(set(axes)))
    b = imp.b
    if op == "ReduceMax":
        return reduce_max(imp, x, axes, keep)
    if op == "ReduceMin":
        return b.op("neg", reduce_max(imp, b.op("neg", x), axes, keep))
    if op == "ReduceMean":
        return b.op("reduce_mean", x, axes=axes, keepdims=keep)
    if op == "ReduceLogSumExp":
        top = reduce_max(imp, x, axes, True)
        total = b.reduce_sum(b.op("exp", b.sub(x, top)), axes, keepdims=True)
        y = b.add(b.op("log", total), top)
        return y if keep else b.reshape(y, tuple(d for i, d in enumerate(x.shape) if i not in axes))
    source = {"ReduceSum": x, "ReduceSumSquare": b.op("square", x) if op == "ReduceSumSquare" else None,
              "ReduceL2": b.op("square", x) if op == "ReduceL2" else None,
              "ReduceL1": b.op("abs", x) if op == "ReduceL1" else None}[op]
    y = b.reduce_sum(source, axes, keepdims=keep)
    return b.op("sqrt", y) if op == "ReduceL2" else y


@converts("TopK")
def _topk(imp, node):
    given = imp.value(node.input[0])
    # integers ranked as float64: exact for every int32, and int64 below 2^53
    x = imp.b.op("cast", given, dtype="float64") if given.dtype in ("int32", "int64") \
        else float_input(imp, node.input[0])
    k = int(np.asarray(imp.const(node.input[1], "k")).reshape(-1)[0])
    axis = imp.attr(node, "axis", -1) % x.rank
    largest = imp.attr(node, "largest", 1)
    b = imp.b
    src = x if largest else b.op("neg", x)
    values = b.op("topk", src, axis=axis, k=k, values=True)
    indices = b.op("cast", b.op("topk", src, axis=axis, k=k, values=False), dtype="int64")
    values = values if largest else b.op("neg", values)
    return [values if values.dtype == given.dtype else b.op("cast", values, dtype=given.dtype), indices]


@converts("ArgMax", "ArgMin")
def _argmax(imp, node):
    x = float_input(imp, node.input[0])
    axis = imp.attr(node, "axis", 0) % x.rank
    b = imp.b
    if imp.attr(node, "select_last_index", 0):
        from ..windows import last_index_arg
        y = last_index_arg(imp, x, axis, node.op_type == "ArgMax")
    else:
        src = x if node.op_type == "ArgMax" else b.op("neg", x)
        y = b.op("cast", b.op("topk", src, axis=axis, k=1, values=False), dtype="int64")
    if not imp.attr(node, "keepdims", 1):
        y = b.reshape(y, tuple(d for i, d in enumerate(x.shape) if i != axis))
    return [y]

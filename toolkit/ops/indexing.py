"""Ops that index: the embedding lookup (rows of a table picked by integer indices) with its
gradient, a scatter-add of rows; and top-k along an axis (values or indices).

An index outside the table is the user's data, not a bug: the lookup raises a UserError naming
the layer (``layer`` attribute) and the index, as a label out of range does in the losses.
"""
from __future__ import annotations

import numpy as np

from ..errors import UserError
from ..ir.graph import INT_DTYPES, TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import fmt_shape, need_float


def _embedding_infer(types, attrs):
    table, index = types
    need_float(table, "the table")
    if table.rank != 2:
        raise ShapeError(f"the embedding table must be [rows, width], got {fmt_shape(table.shape)}")
    if index.dtype not in INT_DTYPES:
        raise ShapeError(f"embedding indices must be integers ({', '.join(INT_DTYPES)}), got {index.dtype}")
    return [TensorType(tuple(index.shape) + (table.shape[1],), table.dtype)]


def check_indices(index, rows: int, layer: str) -> None:
    bad = (index < 0) | (index >= rows)
    if bad.any():
        raise UserError(f"layer '{layer}': index {int(index[bad][0])} is outside [0, {rows}) "
                        f"(input_dim is {rows})")


def embedding_reference(table, index, layer):
    check_indices(index, table.shape[0], layer)
    return table[index]


def _embedding_grad(b: Builder, node, gouts):
    table, index = node.inputs
    return [b.op("embedding_grad", gouts[0], index, rows=table.shape[0]), None]


def _embedding_flops(ins, outs, attrs):
    return 0


def _embedding_grad_infer(types, attrs):
    g, _index = types
    return [TensorType((attrs["rows"], g.shape[-1]), g.dtype)]


def embedding_grad_reference(g, index, rows):
    """Each row of ``g`` added into the table row its index names (repeats add up)."""
    out = np.zeros((rows, g.shape[-1]), g.dtype)
    np.add.at(out, index.reshape(-1), g.reshape(-1, g.shape[-1]))
    return out


register(OpDef("embedding", _embedding_infer, embedding_reference, _embedding_grad, _embedding_flops,
               doc="table[index]: rows of a [rows, width] table for integer indices"))
register(OpDef("embedding_grad", _embedding_grad_infer, embedding_grad_reference,
               flops=lambda i, o, a: i[0].numel, doc="gradient of embedding for its table: rows scatter-added"))


def _topk_infer(types, attrs):
    x, = types
    need_float(x)
    axis = attrs["axis"]
    if not -x.rank <= axis < x.rank:
        raise ShapeError(f"axis {axis} is out of range for {fmt_shape(x.shape)}")
    axis %= x.rank
    size = x.shape[axis]
    if isinstance(size, int) and attrs["k"] > size:
        raise ShapeError(f"top_k {attrs['k']} is more than the {size} entries along axis {axis}")
    shape = list(x.shape)
    shape[axis] = attrs["k"]
    return [TensorType(tuple(shape), x.dtype)]


def topk_reference(x, axis, k, values):
    """The k largest along ``axis``, largest first (ties: the lower index first): their values,
    or their indices in x's float dtype (as Caffe's ArgMax gives them)."""
    order = np.argsort(-x, axis=axis, kind="stable")
    picked = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, picked, axis) if values else picked.astype(x.dtype)


register(OpDef("topk", _topk_infer, topk_reference, None, lambda i, o, a: i[0].numel,
               doc="the k largest entries along an axis: values, or indices as floats"))

"""matmul with transpose flags, so that InnerProduct and its gradients need no transpose ops."""
from __future__ import annotations

import numpy as np

from ..ir.graph import TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import broadcast_shapes, fmt_shape, need_float, same_dtype


def _operand(shape, transposed):
    rows, cols = shape[-2], shape[-1]
    return (cols, rows) if transposed else (rows, cols)


def _matmul_infer(types, attrs):
    a, b = types
    dtype = same_dtype(types)
    need_float(a)
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"matmul needs matrices, got {fmt_shape(a.shape)} and {fmt_shape(b.shape)}")
    m, k = _operand(a.shape, attrs["trans_a"])
    k2, n = _operand(b.shape, attrs["trans_b"])
    if k != k2:
        raise ShapeError(f"matmul inner dimensions differ: {fmt_shape(a.shape)} x {fmt_shape(b.shape)}"
                         f" (trans_a={attrs['trans_a']}, trans_b={attrs['trans_b']})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [TensorType(batch + (m, n), dtype)]


def _t(x, flag):
    return np.swapaxes(x, -1, -2) if flag else x


def _matmul_ref(a, b, trans_a, trans_b):
    return np.matmul(_t(a, trans_a), _t(b, trans_b))


def _matmul_grad(b: Builder, node, gouts):
    g, = gouts
    x, y = node.inputs
    ta, tb = node.attrs["trans_a"], node.attrs["trans_b"]
    # C = op(A) op(B): dop(A) = g op(B)^T, dop(B) = op(A)^T g; then undo the op on each side.
    if ta:
        gx = b.op("matmul", y, g, trans_a=tb, trans_b=True)
    else:
        gx = b.op("matmul", g, y, trans_a=False, trans_b=not tb)
    if tb:
        gy = b.op("matmul", g, x, trans_a=True, trans_b=ta)
    else:
        gy = b.op("matmul", x, g, trans_a=not ta, trans_b=False)
    return [b.sum_to(gx, x.shape), b.sum_to(gy, y.shape)]


def _matmul_flops(ins, outs, attrs):
    k = _operand(ins[0].shape, attrs["trans_a"])[1]
    return 2 * outs[0].numel * k


register(OpDef("matmul", _matmul_infer, _matmul_ref, _matmul_grad, _matmul_flops, batch_rows=True,
               doc="op(a) @ op(b), op = transpose of the last two axes where the flag is set"))

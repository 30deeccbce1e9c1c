"""Reductions and broadcasting: reduce_sum, reduce_mean (+ its gradient), broadcast_to, bessel_correct.

Ops that only need a tensor's shape take it as an attribute (possibly symbolic) rather than as an
input, so that no tensor is kept alive just to be measured.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import broadcast_shapes, fmt_shape, need_float, norm_axis


def _reduced_type(types, attrs) -> list[TensorType]:
    x = types[0]
    axes = [norm_axis(a, x.rank) for a in attrs["axes"]]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated reduction axes {attrs['axes']}")
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [TensorType(shape, x.dtype)]


def _kept_shape(node):
    """The reduced output's shape with the reduced axes kept as 1 (for broadcasting back)."""
    x = node.inputs[0]
    axes = {norm_axis(a, x.rank) for a in node.attrs["axes"]}
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _reduce_sum_grad(b: Builder, node, gouts):
    x = node.inputs[0]
    g = b.reshape(gouts[0], _kept_shape(node))
    return [b.op("broadcast_to", g, shape=x.shape)]


def _reduce_mean_grad(b: Builder, node, gouts):
    x = node.inputs[0]
    g = b.reshape(gouts[0], _kept_shape(node))
    return [b.op("reduce_mean_grad", g, shape=tuple(x.shape), axes=node.attrs["axes"])]


def _reduce_flops(ins, outs, attrs):
    return ins[0].numel


register(OpDef("reduce_sum", _reduced_type,
               lambda x, axes, keepdims: np.sum(x, axis=tuple(axes), keepdims=keepdims),
               _reduce_sum_grad, _reduce_flops))
register(OpDef("reduce_mean", _reduced_type,
               lambda x, axes, keepdims: np.mean(x, axis=tuple(axes), keepdims=keepdims),
               _reduce_mean_grad, _reduce_flops))


def reduced_count(shape, axes):
    """How many elements each output of a reduction over ``axes`` of ``shape`` sums (a Dim)."""
    count = 1
    for a in axes:
        count = count * shape[a % len(shape)]
    return count


def _reduce_mean_grad_ref(g, shape, axes):
    return np.broadcast_to(g / reduced_count(shape, axes), shape).copy()


def _reduce_mean_grad_infer(types, attrs):
    shape = tuple(attrs["shape"])
    if broadcast_shapes(types[0].shape, shape) != shape:
        raise ShapeError(f"cannot spread {fmt_shape(types[0].shape)} over {fmt_shape(shape)}")
    return [TensorType(shape, types[0].dtype)]


register(OpDef("reduce_mean_grad", _reduce_mean_grad_infer, _reduce_mean_grad_ref, flops=lambda i, o, a: o[0].numel,
               batch_rows=True,
               doc="g (kept dims) spread evenly over the reduced axes of `shape`: g / count"))


def _broadcast_infer(types, attrs):
    x = types[0]
    target = tuple(attrs["shape"])
    if broadcast_shapes(x.shape, target) != target:
        raise ShapeError(f"cannot broadcast {fmt_shape(x.shape)} to {fmt_shape(target)}")
    return [TensorType(target, x.dtype)]


def _broadcast_grad(b: Builder, node, gouts):
    return [b.sum_to(gouts[0], node.inputs[0].shape)]


register(OpDef("broadcast_to", _broadcast_infer,
               lambda x, shape: np.broadcast_to(x, shape).copy(), _broadcast_grad,
               flops=lambda i, o, a: 0))


def _bessel_infer(types, attrs):
    need_float(types[0])
    return [types[0]]


def bessel_factor(count: int) -> float:
    return count / max(count - 1, 1)


def _bessel_ref(var, count):
    return var * bessel_factor(count)


register(OpDef("bessel_correct", _bessel_infer, _bessel_ref, flops=lambda i, o, a: o[0].numel,
               doc="a biased variance over `count` values -> unbiased: var * count / (count - 1)"))


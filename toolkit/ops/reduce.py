"""Reductions and broadcasting: reduce_sum, reduce_mean (+ its gradient), broadcast_to, bessel_correct."""
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
    return [b.op("reduce_mean_grad", g, x, axes=node.attrs["axes"])]


def _reduce_flops(ins, outs, attrs):
    return ins[0].numel


register(OpDef("reduce_sum", _reduced_type,
               lambda x, axes, keepdims: np.sum(x, axis=tuple(axes), keepdims=keepdims),
               _reduce_sum_grad, _reduce_flops))
register(OpDef("reduce_mean", _reduced_type,
               lambda x, axes, keepdims: np.mean(x, axis=tuple(axes), keepdims=keepdims),
               _reduce_mean_grad, _reduce_flops))


def _reduce_mean_grad_ref(g, x, axes):
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    return np.broadcast_to(g / count, x.shape).copy()


register(OpDef("reduce_mean_grad", lambda types, attrs: [TensorType(types[1].shape, types[0].dtype)],
               _reduce_mean_grad_ref, flops=lambda i, o, a: o[0].numel,
               doc="g (kept dims) spread evenly over x's reduced axes: g / count"))


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


def _bessel_ref(var, x, axes):
    n = int(np.prod([x.shape[a] for a in axes]))
    return var * (n / max(n - 1, 1))


register(OpDef("bessel_correct", _bessel_infer, _bessel_ref, flops=lambda i, o, a: o[0].numel,
               doc="biased variance over x's axes -> unbiased: var * n / (n - 1)"))


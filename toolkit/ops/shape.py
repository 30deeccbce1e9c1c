"""Data-movement primitives: reshape (a view), transpose, concat, slice and its gradient pad_axis;
and iota, each element's index along an axis, for masks made from the sizes bound at run time."""
from __future__ import annotations

import numpy as np

from ..ir.dims import product
from ..ir.graph import ALL_DTYPES, TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import fmt_shape, norm_axis, same_dtype

_no_flops = lambda ins, outs, attrs: 0  # noqa: E731  data movement is not arithmetic


def _reshape_infer(types, attrs):
    x = types[0]
    target = tuple(attrs["shape"])
    if product(target) != x.numel:
        raise ShapeError(f"cannot reshape {fmt_shape(x.shape)} to {fmt_shape(target)}: "
                         "the element counts differ")
    return [TensorType(target, x.dtype)]


def _reshape_grad(b: Builder, node, gouts):
    return [b.reshape(gouts[0], node.inputs[0].shape)]


def _reshape_ref(x, shape):
    return x.reshape([d if isinstance(d, int) else -1 for d in shape])


register(OpDef("reshape", _reshape_infer, _reshape_ref, _reshape_grad, _no_flops, alias=True))


def _transpose_infer(types, attrs):
    x = types[0]
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"perm {perm} is not a permutation of {x.rank} axes")
    return [TensorType(tuple(x.shape[p] for p in perm), x.dtype)]


def _transpose_grad(b: Builder, node, gouts):
    inverse = tuple(int(i) for i in np.argsort(node.attrs["perm"]))
    return [b.op("transpose", gouts[0], perm=inverse)]


register(OpDef("transpose", _transpose_infer,
               lambda x, perm: np.ascontiguousarray(np.transpose(x, perm)), _transpose_grad, _no_flops))


def _concat_infer(types, attrs):
    dtype = same_dtype(types)
    rank = types[0].rank
    axis = norm_axis(attrs["axis"], rank)
    total = 0
    for t in types:
        if t.rank != rank or any(d != e for i, (d, e) in enumerate(zip(t.shape, types[0].shape)) if i != axis):
            raise ShapeError("cannot concatenate " + ", ".join(fmt_shape(t.shape) for t in types)
                             + f" along axis {axis}: the other dimensions differ")
        total = total + t.shape[axis]
    shape = list(types[0].shape)
    shape[axis] = total
    return [TensorType(tuple(shape), dtype)]


def _concat_grad(b: Builder, node, gouts):
    axis = norm_axis(node.attrs["axis"], node.inputs[0].rank)
    grads, start = [], 0
    for x in node.inputs:
        stop = start + x.shape[axis]
        grads.append(b.op("slice", gouts[0], axis=axis, start=start, stop=stop))
        start = stop
    return grads


register(OpDef("concat", _concat_infer,
               lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_grad, _no_flops))


def _slice_infer(types, attrs):
    x = types[0]
    axis = norm_axis(attrs["axis"], x.rank)
    start, stop = attrs["start"], attrs["stop"]
    length = stop - start
    if isinstance(length, int) and length <= 0:
        raise ShapeError(f"empty slice [{start}:{stop}] of axis {axis}")
    size = x.shape[axis]
    if (isinstance(start, int) and start < 0) or (isinstance(stop, int) and isinstance(size, int) and stop > size):
        raise ShapeError(f"slice [{start}:{stop}] is out of range for axis {axis} of size {size}")
    shape = list(x.shape)
    shape[axis] = length
    return [TensorType(tuple(shape), x.dtype)]


def _slice_ref(x, axis, start, stop):
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)].copy()


def _slice_grad(b: Builder, node, gouts):
    x = node.inputs[0]
    axis = norm_axis(node.attrs["axis"], x.rank)
    start, stop = node.attrs["start"], node.attrs["stop"]
    return [b.op("pad_axis", gouts[0], axis=axis, before=start, after=x.shape[axis] - stop)]


register(OpDef("slice", _slice_infer, _slice_ref, _slice_grad, _no_flops))


def _pad_infer(types, attrs):
    x = types[0]
    axis = norm_axis(attrs["axis"], x.rank)
    shape = list(x.shape)
    shape[axis] = attrs["before"] + shape[axis] + attrs["after"]
    return [TensorType(tuple(shape), x.dtype)]


def _pad_ref(x, axis, before, after):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (before, after)
    return np.pad(x, widths)


def _pad_grad(b: Builder, node, gouts):
    x = node.inputs[0]
    axis, before = node.attrs["axis"], node.attrs["before"]
    return [b.op("slice", gouts[0], axis=axis, start=before, stop=before + x.shape[axis])]


register(OpDef("pad_axis", _pad_infer, _pad_ref, _pad_grad, _no_flops,
               doc="zero padding along one axis (the gradient of slice)"))


def _iota_infer(types, attrs):
    shape, axis, dtype = tuple(attrs["shape"]), attrs["axis"], attrs["dtype"]
    if types:
        raise ShapeError("iota takes no inputs")
    if not -len(shape) <= axis < len(shape):
        raise ShapeError(f"axis {axis} is outside the shape {fmt_shape(shape)}")
    if dtype not in ALL_DTYPES:
        raise ShapeError(f"unknown dtype {dtype!r}")
    return [TensorType(shape, dtype)]


def _iota_ref(shape, axis, dtype):
    shape = tuple(int(d) for d in shape)
    axis %= len(shape)
    ramp = np.arange(shape[axis], dtype=dtype).reshape([-1 if k == axis else 1 for k in range(len(shape))])
    return np.ascontiguousarray(np.broadcast_to(ramp, shape))


# No inputs: folded at compile time where the shape is numbers, else computed once when a plan
# binds the sizes (runtime/build.py evaluates pure nodes on constants when a plan is built), so a mask
# built from it costs nothing per run either way.
register(OpDef("iota", _iota_infer, _iota_ref, None, _no_flops,
               doc="each element's index along `axis` (0, 1, 2, ...) in a tensor of `shape`, which may hold "
                   "symbols: the positions a causal or length mask compares"))

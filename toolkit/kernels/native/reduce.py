"""Generated reductions: reduce_sum and reduce_mean over any axes, the mean's gradient, and the
Bessel correction of BatchNorm's running variance.

A reduction views its input as (outer, kept, inner) blocks once neighbouring axes of one kind
are merged: the kept axes must form one run (a bias gradient [N, C] -> [C], BatchNorm's
statistics [N, C, H, W] -> [C], global pooling [N, C, H, W] -> [N, C]), or the reduced axes one
run between kept ones (global pooling in the blocked layout); any other pattern stays with the
numpy kernel. Sums accumulate in double precision and round once, which is closer to
the exact sum than numpy's pairwise float32 sum, so the two agree to float32 rounding.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_native
from ...codegen.loops import (
    Bin,
    Buf,
    Cast,
    Const,
    Expr,
    For,
    Kernel,
    Let,
    Names,
    Set,
    SizeInt,
    Store,
    ThreadIndex,
    as_size,
    lift,
    parallel_from,
    size_product,
)
from ...codegen.native import NativeCall
from ...ops.reduce import bessel_factor, reduced_count
from ...ops.rules import norm_axis
from .elementwise import FLOATS, PARALLEL_MIN_ELEMENTS, one_step_call


def _i(v):
    return lift(as_size(v), "int64")


def _blocks(shape, axes) -> tuple[int, int, int] | None:
    """(outer, kept, inner) sizes when the kept axes are one run, else None."""
    kept = [d for d in range(len(shape)) if d not in axes]
    if not kept:
        return 1, 1, size_product(shape)
    if kept != list(range(kept[0], kept[-1] + 1)):
        return None
    return size_product(shape[:kept[0]]), size_product(shape[kept[0]:kept[-1] + 1]), size_product(shape[kept[-1] + 1:])


def reduction_call(name: str, ins, outs, shape, axes, dtype: str, scale, threads: int) -> NativeCall | None:
    """The call of ``reduction_kernel``'s kernel on x, y and the scratch it may need."""
    built = reduction_kernel(name, shape, axes, dtype, scale, threads)
    if built is None:
        return None
    kernel, scratch = built
    return NativeCall(kernel, [ins[0], outs[0]] + scratch)


def reduction_kernel(name: str, shape, axes, dtype: str, scale, threads: int):
    """y[k] = scale * sum of x over the reduced axes, for each kept position k: (the kernel, the
    scratch arrays that follow x and y among its parameters), or None. ``scale``: a float, a
    mean's count as a ``SizeInt`` (one over it worked out as the kernel runs), or None for none."""
    axes = sorted({norm_axis(a, len(shape)) for a in axes})
    blocks = _blocks(shape, axes) if shape else (1, 1, 1)
    if blocks is None:
        return _middle_reduction(name, shape, axes, dtype, scale, threads)
    outer, mid, inner = blocks
    names = Names()
    x = Buf("x", dtype, outer * mid * inner)
    y = Buf("y", dtype, mid, const=False)
    acc = names.var("acc", "float64")
    ch, a, b = names.var("ch"), names.var("a"), names.var("b")
    total = Cast(dtype, acc * _scale(scale)) if scale is not None else Cast(dtype, acc)
    if outer == 1:                     # each kept position sums one contiguous run
        inner_loop = For(b, _i(0), _i(inner), [Set(acc, acc + Cast("float64", x[ch * inner + b]))], reduction=acc)
    else:
        inner_loop = For(a, _i(0), _i(outer), [For(b, _i(0), _i(inner), [
            Set(acc, acc + Cast("float64", x[(a * mid + ch) * inner + b]))], reduction=acc)])
    body = For(ch, _i(0), _i(mid), [Let(acc, lift(0.0, "float64")), inner_loop, Store(y, ch, total)],
               parallel=parallel_from(threads, outer * mid * inner, PARALLEL_MIN_ELEMENTS) if mid > 1 else False)
    return Kernel(name, [x, y], [body], threads), []


def _middle_reduction(name: str, shape, axes, dtype: str, scale, threads: int):
    """The reduced axes one run between kept ones on both sides: y[o, l] = scale * sum over r of
    x[o, r, l] (global pooling in the blocked layout, [N, C/16, H, W, 16] -> [N, C/16, 16]). The
    lanes are summed side by side, in a double-precision row of the thread's (a scalar sum per
    lane strides over the input: MobileNet's pool6 at batch 8 took 0.28 ms)."""
    if axes != list(range(axes[0], axes[-1] + 1)) or axes[0] == 0 or axes[-1] == len(shape) - 1:
        return None
    outer, red, lanes = size_product(shape[:axes[0]]), size_product(shape[axes[0]:axes[-1] + 1]), \
        size_product(shape[axes[-1] + 1:])
    names = Names()
    x = Buf("x", dtype, outer * red * lanes)
    y = Buf("y", dtype, outer * lanes, const=False)
    rows = Buf("sums", "float64", max(threads, 1) * lanes, const=False)
    o, lane, r, slot = names.var("o"), names.var("lane"), names.var("r"), names.var("slot")
    at = slot * lanes + lane
    total = rows[at] * _scale(scale) if scale is not None else rows[at]
    body = For(o, _i(0), _i(outer), [
        Let(slot, ThreadIndex()),
        For(lane, _i(0), _i(lanes), [Store(rows, at, lift(0.0, "float64"))], vector=True),
        For(r, _i(0), _i(red), [For(lane, _i(0), _i(lanes), [
            Store(rows, at, Cast("float64", x[(o * red + r) * lanes + lane]), accumulate=True)], vector=True)]),
        For(lane, _i(0), _i(lanes), [Store(y, o * lanes + lane, Cast(dtype, total))], vector=True)],
        parallel=parallel_from(threads, outer * red * lanes, PARALLEL_MIN_ELEMENTS) if outer > 1 else False)
    return Kernel(name, [x, y, rows], [body], threads), [np.zeros(rows.size, np.float64)]


def _scale(scale):
    """The factor a sum is multiplied by: a float, or the count of a mean, one over which is
    computed in double precision when the kernel runs (the same number Python's 1.0 / count is)."""
    if isinstance(scale, SizeInt):
        return Bin("/", Const(1.0, "float64"), Cast("float64", scale.expr))
    return lift(float(scale), "float64")


@register_native("reduce_sum", "cpu", run_time_sizes=True)
def reduce_sum_native(ctx, ins, outs):
    if ctx.dtype not in FLOATS:
        return None
    return reduction_call("sum_axes", ins, outs, [as_size(d) for d in ctx.in_shapes[0]], ctx.attrs["axes"], ctx.dtype,
                          None, ctx.threads)


@register_native("reduce_mean", "cpu", run_time_sizes=True)
def reduce_mean_native(ctx, ins, outs):
    if ctx.dtype not in FLOATS:
        return None
    shape = [as_size(d) for d in ctx.in_shapes[0]]
    kept = size_product(ctx.out_shapes[0])
    count = size_product(shape) // kept if shape and kept else 1
    if count == 0:
        return None                    # a mean of nothing is NaN: the numpy kernel says so
    # the mean's factor: one over the count, worked out when the kernel runs if the count varies
    scale = count if isinstance(count, SizeInt) else (1.0 / count if count != 1 else None)
    return reduction_call("mean_axes", ins, outs, shape, ctx.attrs["axes"], ctx.dtype, scale, ctx.threads)


def _scaled(name: str, ctx, ins, outs, factor):
    """out = in * factor, the input broadcast over the output's shape; ``factor`` a float, or an
    expression of run-time sizes."""
    factor = factor if isinstance(factor, Expr) else float(factor)
    return one_step_call(name, ("scale", (("x", 0),), (("factor", factor),)), ctx, ins, outs)


@register_native("reduce_mean_grad", "cpu", run_time_sizes=True)
def reduce_mean_grad_native(ctx, ins, outs):
    count = reduced_count(ctx.attrs["shape"], ctx.attrs["axes"])
    if not count:
        return None
    return _scaled("mean_grad", ctx, ins, outs, _scale(count) if isinstance(count, SizeInt) else 1.0 / int(count))


@register_native("bessel_correct", "cpu")
def bessel_correct_native(ctx, ins, outs):
    return _scaled("bessel", ctx, ins, outs, bessel_factor(ctx.attrs["count"]))

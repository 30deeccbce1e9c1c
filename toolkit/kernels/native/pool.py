"""Generated max pooling (forward and backward) and sums over axes.

Max pooling runs one (image, channel) plane per iteration, threads over planes. Its gradient
finds each window's first maximum in row-major order (PyTorch's and the numpy kernel's rule)
and adds the output gradient there, so overlapping windows accumulate as they should. Padding
counts as -inf. Sums accumulate in double precision, then round once: closer to the exact sum
than numpy's pairwise float32 sum, so the two agree to float32 rounding.
"""
from __future__ import annotations

import numpy as np

from ...codegen.loops import Buf, Cast, For, If, Kernel, Let, Names, Set, Store, lift, maximum, select
from ...codegen.native import NativeCall
from ...ops.rules import norm_axis
from ..registry import register_native
from .elementwise import FLOATS, PARALLEL_MIN_ELEMENTS


def _i(v):
    return lift(int(v), "int64")


def _pool_geometry(x_shape, y_shape, attrs):
    n, c, h, w = (int(d) for d in x_shape)
    oh, ow = (int(d) for d in y_shape[2:])
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
    return n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw


def _window_max(names, x, plane, h, w, y0, x0, kh, kw, dtype, track: bool, padded: bool):
    """Statements leaving the window's maximum in m (and its flat position in arg if track).
    Padded pooling skips positions outside the input (padding is -inf); unpadded pooling, whose
    windows all lie inside, reads without checks so that the compiler can vectorise it."""
    m = names.var("m", dtype)
    arg = names.var("arg")
    stmts = [Let(m, lift(float("-inf"), dtype)), Let(arg, _i(-1))]
    for di in range(kh):
        for dj in range(kw):
            yy, xx = y0 + di, x0 + dj
            pos = yy * w + xx
            v = x[plane * (h * w) + pos]
            if not track:
                update = [Set(m, maximum(m, v))]          # np.maximum: NaN propagates
            else:                                         # strictly greater: the first maximum wins
                update = [If(v.gt(m), [Set(m, v), Set(arg, pos)])]
            if padded:
                inside = (select(yy.ge(0), 1, 0) * select(yy.lt(h), 1, 0) * select(xx.ge(0), 1, 0)
                          * select(xx.lt(w), 1, 0))
                update = [If(inside.gt(0), update)]
            stmts += update
    return stmts, m, arg


def _needs_checks(h, w, oh, ow, kh, kw, sh, sw, ph, pw) -> bool:
    return bool(ph or pw) or (oh - 1) * sh + kh > h or (ow - 1) * sw + kw > w


@register_native("max_pool2d", "cpu")
def max_pool2d_native(ctx, ins, outs):
    dtype = ctx.dtype
    if dtype not in FLOATS:
        return None
    n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw = _pool_geometry(ctx.in_shapes[0], ctx.out_shapes[0], ctx.attrs)
    names = Names()
    x = Buf("x", dtype, n * c * h * w)
    y = Buf("y", dtype, n * c * oh * ow, const=False)
    plane, i, j = names.var("plane"), names.var("i"), names.var("j")
    stmts, m, _ = _window_max(names, x, plane, h, w, i * sh - ph, j * sw - pw, kh, kw, dtype, False,
                               _needs_checks(h, w, oh, ow, kh, kw, sh, sw, ph, pw))
    body = For(plane, _i(0), _i(n * c), [For(i, _i(0), _i(oh), [For(j, _i(0), _i(ow), stmts + [
        Store(y, (plane * oh + i) * ow + j, m)])])], parallel=ctx.threads > 1 and n * c * oh * ow >= 4096)
    return NativeCall(Kernel("max_pool", [x, y], [body], ctx.threads), [ins[0], outs[0]])


@register_native("max_pool2d_grad", "cpu")
def max_pool2d_grad_native(ctx, ins, outs):
    dtype = ctx.dtype
    if dtype not in FLOATS:
        return None
    g_shape, x_shape = ctx.in_shapes
    n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw = _pool_geometry(x_shape, g_shape, ctx.attrs)
    names = Names()
    g = Buf("g", dtype, n * c * oh * ow)
    x = Buf("x", dtype, n * c * h * w)
    dx = Buf("dx", dtype, n * c * h * w, const=False)
    plane, i, j, e = names.var("plane"), names.var("i"), names.var("j"), names.var("e")
    stmts, _m, arg = _window_max(names, x, plane, h, w, i * sh - ph, j * sw - pw, kh, kw, dtype, True,
                                 _needs_checks(h, w, oh, ow, kh, kw, sh, sw, ph, pw))
    stmts.append(If(arg.ge(0), [Store(dx, plane * (h * w) + arg, g[(plane * oh + i) * ow + j], accumulate=True)]))
    body = For(plane, _i(0), _i(n * c), [
        For(e, _i(0), _i(h * w), [Store(dx, plane * (h * w) + e, lift(0.0, dtype))]),
        For(i, _i(0), _i(oh), [For(j, _i(0), _i(ow), stmts)])], parallel=ctx.threads > 1 and n * c * h * w >= 4096)
    return NativeCall(Kernel("max_pool_grad", [g, x, dx], [body], ctx.threads), [ins[0], ins[1], outs[0]])


@register_native("reduce_sum", "cpu")
def reduce_sum_native(ctx, ins, outs):
    """Sums over any set of axes: the input as (outer, reduced, inner) blocks when the reduced
    axes are contiguous in it (biases' gradients: (0,) on [N, C], (0, 2, 3) on NCHW is not, so
    NCHW is read as [N, C, HW] with N and HW reduced)."""
    dtype = ctx.dtype
    if dtype not in FLOATS:
        return None
    shape = [int(d) for d in ctx.in_shapes[0]]
    rank = len(shape)
    axes = sorted({norm_axis(a, rank) for a in ctx.attrs["axes"]})
    kept = [d for d in range(rank) if d not in axes]
    if len(kept) > 1 or rank == 0:
        return None                              # several kept axes: the numpy kernel
    names = Names()
    x = Buf("x", dtype, int(np.prod(shape)))
    y = Buf("y", dtype, int(np.prod(ctx.out_shapes[0])) or 1, const=False)
    acc = names.var("acc", "float64")
    if not kept:                                 # everything: one sum
        e = names.var("e")
        body = [Let(acc, lift(0.0, "float64")),
                For(e, _i(0), _i(int(np.prod(shape))), [Set(acc, acc + Cast("float64", x[e]))], reduction=acc),
                Store(y, _i(0), Cast(dtype, acc))]
        return NativeCall(Kernel("sum_all", [x, y], body, 1), [ins[0], outs[0]])
    k = kept[0]
    outer, mid, inner = int(np.prod(shape[:k])), shape[k], int(np.prod(shape[k + 1:]))
    ch, a, b = names.var("ch"), names.var("a"), names.var("b")
    body = For(ch, _i(0), _i(mid), [
        Let(acc, lift(0.0, "float64")),
        For(a, _i(0), _i(outer), [For(b, _i(0), _i(inner), [
            Set(acc, acc + Cast("float64", x[(a * mid + ch) * inner + b]))], reduction=acc)]),
        Store(y, ch, Cast(dtype, acc))], parallel=ctx.threads > 1 and outer * mid * inner >= PARALLEL_MIN_ELEMENTS)
    return NativeCall(Kernel("sum_axes", [x, y], [body], ctx.threads), [ins[0], outs[0]])

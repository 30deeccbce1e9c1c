"""Generated max pooling, forward and backward.

Max pooling runs one (image, channel) plane per iteration, threads over planes. Its gradient
finds each window's first maximum in row-major order (PyTorch's and the numpy kernel's rule)
and adds the output gradient there, so overlapping windows accumulate as they should. Padding
counts as -inf (for int8 and uint8, the type's least value).
"""
from __future__ import annotations

from ...backend.registry import register_native
from ...codegen.loops import Buf, For, If, Kernel, Let, Names, Set, Store, lift, maximum, select
from ...codegen.native import NativeCall
from .elementwise import FLOATS

# an int8 / uint8 window's starting maximum (padding counts as the type's lowest value)
QUANT_LOWEST = {"uint8": 0, "int8": -128}


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
    lowest = lift(float("-inf"), dtype) if dtype in FLOATS else lift(QUANT_LOWEST[dtype], dtype)
    stmts = [Let(m, lowest), Let(arg, _i(-1))]
    for di in range(kh):
        for dj in range(kw):
            yy, xx = y0 + di, x0 + dj
            pos = yy * w + xx
            v = x[plane * (h * w) + pos]
            if not track and dtype not in FLOATS:         # int8 / uint8: a compare the compiler vectorises
                update = [Set(m, select(v.gt(m), v, m))]
            elif not track:
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


def _inside(size, out, k, stride, pad) -> tuple[int, int]:
    """The output positions [lo, hi) whose windows lie wholly inside an input of ``size``."""
    lo = min(out, -(-pad // stride))
    hi = max(lo, min(out, (size + pad - k) // stride + 1))
    return lo, hi


def _window_loops(i, j, geometry, window) -> For:
    """The loops over one plane's outputs. ``window(checked)`` gives one output's statements;
    where padding or a ragged edge needs bounds checks, only the border runs them: the outputs
    whose windows lie inside the input run the unchecked form, which the compiler vectorises
    (measured on a 3x3, stride-1, pad-1 pool over 64x64x28x28 on one thread: 63 ms with checks
    at every output, 21 ms with checks on the border only)."""
    n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw = geometry
    if not _needs_checks(h, w, oh, ow, kh, kw, sh, sw, ph, pw):
        return For(i, _i(0), _i(oh), [For(j, _i(0), _i(ow), window(False))])
    (i0, i1), (j0, j1) = _inside(h, oh, kh, sh, ph), _inside(w, ow, kw, sw, pw)
    row = [For(j, _i(start), _i(stop), window(checked))
           for start, stop, checked in ((0, j0, True), (j0, j1, False), (j1, ow, True)) if stop > start]
    inside = (select(i.ge(i0), 1, 0) * select(i.lt(i1), 1, 0)).gt(0)
    return For(i, _i(0), _i(oh), [If(inside, row, [For(j, _i(0), _i(ow), window(True))])])


@register_native("max_pool2d", "cpu")
def max_pool2d_native(ctx, ins, outs):
    dtype = ctx.dtype
    if dtype not in FLOATS and dtype not in QUANT_LOWEST:     # the float types, and int8 models' pools
        return None
    n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw = _pool_geometry(ctx.in_shapes[0], ctx.out_shapes[0], ctx.attrs)
    names = Names()
    x = Buf("x", dtype, n * c * h * w)
    y = Buf("y", dtype, n * c * oh * ow, const=False)
    plane, i, j = names.var("plane"), names.var("i"), names.var("j")

    def window(checked):
        stmts, m, _ = _window_max(names, x, plane, h, w, i * sh - ph, j * sw - pw, kh, kw, dtype, False, checked)
        return stmts + [Store(y, (plane * oh + i) * ow + j, m)]
    geometry = (n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw)
    body = For(plane, _i(0), _i(n * c), [_window_loops(i, j, geometry, window)],
               parallel=ctx.threads > 1 and n * c * oh * ow >= 4096)
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

    def window(checked):
        stmts, _m, arg = _window_max(names, x, plane, h, w, i * sh - ph, j * sw - pw, kh, kw, dtype, True, checked)
        return stmts + [If(arg.ge(0), [Store(dx, plane * (h * w) + arg, g[(plane * oh + i) * ow + j],
                                             accumulate=True)])]
    geometry = (n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw)
    body = For(plane, _i(0), _i(n * c), [
        For(e, _i(0), _i(h * w), [Store(dx, plane * (h * w) + e, lift(0.0, dtype))]),
        _window_loops(i, j, geometry, window)], parallel=ctx.threads > 1 and n * c * h * w >= 4096)
    return NativeCall(Kernel("max_pool_grad", [g, x, dx], [body], ctx.threads), [ins[0], ins[1], outs[0]])

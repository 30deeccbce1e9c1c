"""Depthwise convolutions (each group reads one input channel: MobileNet's 3x3 layers, with any
channel multiplier) as direct loops, forward and backward.

im2col + GEMM wastes most of its time here: each group's GEMM is one row (or a few) of
kh*kw columns, a BLAS call per group and image for a handful of multiply-adds per element. The
direct form walks each output plane once per kernel tap: for tap (i, j) and every output row
whose input row lies inside the image, one strided, vectorised multiply-add of the input row
into the output row, the span of valid columns computed once per tap (no test in the inner
loop). The code is the same whatever the channel count: the channels are a loop, not unrolled.

- forward: one parallel iteration per (image, output channel) plane, started from the bias (or
  0), then the taps, then the fused elementwise epilogue over that plane while it is in cache;
- input gradient: one iteration per (image, input channel) plane, which gathers the taps of its
  ``multiplier`` output channels;
- weight gradient: one iteration per output channel, each tap a sum over images and positions
  (a reduction the compiler vectorises).
"""
from __future__ import annotations

import numpy as np

from ...codegen import depthwise3x3, microkernel
from ...codegen.loops import Buf, Extern, For, If, Kernel, Let, Names, Set, Store, ThreadIndex, lift, select
from ...codegen.native import NativeCall
from ...ops.fused import store_program
from .conv_parts import ConvShape, epilogue_buffers, epilogue_statements, i64, valid_span


def is_depthwise(s: ConvShape) -> bool:
    """Each group reads one input channel (and there is more than one group)."""
    return s.g > 1 and s.cg == 1


def _tap_rows(names: Names, s: ConvShape, ki, kj):
    """The lets that bound the output rows [rlo, rhi) and columns [lo, hi) whose input position
    for tap (ki, kj) lies inside the image."""
    cols_lets, lo, hi = valid_span(names, s.ow, s.w, s.sw, s.pw, kj * s.dw)
    rows_lets, rlo, rhi = valid_span(names, s.oh, s.h, s.sh, s.ph, ki * s.dh)
    return cols_lets + rows_lets, lo, hi, rlo, rhi


def _plane_epilogue(names, program, ctx, shape, x_bufs, out_bufs, head: Buf, n, channel) -> list | None:
    """The fused elementwise program over one plane (image n, ``channel``) of ``head``: [] without
    a program, None where the program is unsupported."""
    if program is None:
        return []
    return epilogue_statements(names, program[0], program[1], shape, ctx.in_shapes, ctx.attrs.get("views", ()),
                               ctx.dtype, x_bufs, out_bufs, head, n, channel, channel + 1)


MAX_TAPS = 49            # kernels up to 7x7 keep every tap's weight in a variable


def forward(ctx, ins, outs, s: ConvShape, has_bias: bool, out_shape, program=None) -> NativeCall | None:
    """A 3x3 kernel at stride 1 or 2 with at most a ReLU after it goes to the hand-vectorised
    plane function (``_forward_3x3``); any other of at most MAX_TAPS taps sums each output in a
    register (``_forward_padded``); larger ones take a pass over the output plane per tap
    (``_forward_by_taps``)."""
    relu = _plane_relu(ctx, s, program, out_shape)
    if relu is not None:
        return _forward_3x3(ctx, ins, outs, s, has_bias, out_shape, relu)
    if s.kh * s.kw <= MAX_TAPS:
        return _forward_padded(ctx, ins, outs, s, has_bias, out_shape, program)
    return _forward_by_taps(ctx, ins, outs, s, has_bias, out_shape, program)


def avx2_only() -> bool:
    """An AVX2 processor without AVX-512: the plane function's vectors are AVX2's 8 floats, and
    it was measured against the loop language's kernel there only (an AVX-512 processor's
    compiler vectorises that kernel 16 wide)."""
    return microkernel.gemm_available() and not microkernel.available()


def _plane_relu(ctx, s: ConvShape, program, out_shape) -> bool | None:
    """Whether a ReLU follows, where codegen/depthwise3x3.py's function computes this
    convolution: on an AVX2 processor without AVX-512, float32, 3x3, stride 1 or 2 both ways, no
    dilation, at most one padded column or row each side, and no epilogue but a ReLU; None where
    it does not."""
    if not avx2_only():
        return None
    if (ctx.dtype != "float32" or (s.kh, s.kw) != (3, 3) or (s.dh, s.dw) != (1, 1) or s.sh != s.sw
            or s.sh not in (1, 2) or s.ph != s.pw or s.ph not in (0, 1) or s.w > depthwise3x3.MAX_WIDTH):
        return None
    if program is None:
        return False
    views = ctx.attrs.get("views", ())
    in_store = store_program(*program, lambda i: tuple(ctx.in_shapes[i]) == tuple(out_shape)
                             and not (i < len(views) and views[i]))
    if in_store is None or in_store[0] is not None:
        return None                       # a residual, or another program
    return in_store[1]


def _forward_3x3(ctx, ins, outs, s: ConvShape, has_bias: bool, out_shape, relu: bool) -> NativeCall:
    """One call of ``tk_dw3x3`` per output plane (image, channel), the planes split among the
    threads; a fused ReLU is applied by the function as it stores, on the output array."""
    names = Names()
    x = Buf("x", "float32", s.n * s.c * s.h * s.w)
    w = Buf("w", "float32", s.o * 9)
    b = Buf("bias", "float32", s.o) if has_bias else None
    y = Buf("y", "float32", int(np.prod(out_shape)), const=False)
    params = [x, w] + ([b] if b else []) + [y]
    arrays = [ins[0], ins[1]] + ([ins[2]] if b else []) + [outs[0]]
    plane, n, o = names.var("plane"), names.var("n"), names.var("o")
    call = Extern("tk_dw3x3", ((x, (n * s.c + o // s.og) * (s.h * s.w)), i64(s.h), i64(s.w), (w, o * 9),
                               (b, o) if b else None, (y, plane * s.p), i64(s.oh), i64(s.ow), i64(s.sh),
                               i64(s.ph), lift(int(relu), "int32")), depthwise3x3.C_SOURCE)
    loop = For(plane, i64(0), i64(s.n * s.o), [Let(n, plane // s.o), Let(o, plane % s.o), call],
               parallel=ctx.threads > 1)
    return NativeCall(Kernel("depthwise", params, [loop], ctx.threads), arrays)


def _forward_padded(ctx, ins, outs, s: ConvShape, has_bias: bool, out_shape, program=None) -> NativeCall | None:
    """Each plane's input is first copied, zero-padded, into the thread's scratch, its columns
    split by their position modulo the stride (``phase``): column ``stride*j + p`` of the padded
    row lands at ``[p][j]``. Every tap of output column ``ow`` then reads column
    ``ow + (kj*dilation) // stride`` of phase ``(kj*dilation) % stride``: a contiguous run for
    every stride, so one vectorised loop over a row's outputs sums all kh*kw taps in registers
    and stores once, with no bounds test (the padding is in the copy). Against a pass over the
    output per tap, measured on MobileNet v1's thirteen layers (batch 1, one thread): see the
    README's real-nets section."""
    dtype, threads = ctx.dtype, ctx.threads
    names = Names()
    sh, sw = s.sh, s.sw
    rows = (s.oh - 1) * sh + (s.kh - 1) * s.dh + 1             # padded rows the outputs read
    width = s.ow + ((s.kw - 1) * s.dw) // sw                    # columns per phase they read
    phase_size = rows * width
    scratch = sw * phase_size
    x = Buf("x", dtype, s.n * s.c * s.h * s.w)
    w = Buf("w", dtype, s.o * s.kh * s.kw)
    b = Buf("bias", dtype, s.o) if has_bias else None
    y = Buf("y", dtype, int(np.prod(out_shape)), const=False)
    xs = Buf("dw_pad", dtype, threads * scratch, const=False)
    params = [x, w] + ([b] if b else []) + [y, xs]
    arrays = [ins[0], ins[1]] + ([ins[2]] if b else []) + [outs[0], np.zeros(xs.size, dtype)]
    x_bufs, out_bufs = epilogue_buffers(program, ctx, ins, outs, out_shape, params, arrays)
    plane, n, o, c, slot = (names.var(v) for v in ("plane", "n", "o", "c", "slot"))
    r, j, ih, oh, ow, src = (names.var(v) for v in ("r", "j", "ih", "oh", "ow", "src"))
    acc_type = "float64" if dtype == "float64" else "float32"
    zero = lift(0.0, dtype)
    base = slot * scratch
    x_base = (n * s.c + c) * (s.h * s.w)

    # the copy: padded row r is input row r - ph (zeros outside); phase p's column j is input
    # column sw*j + p - pw
    copy, zero_row = [], []
    for p in range(sw):
        spans, lo, hi = valid_span(names, width, s.w, sw, s.pw, i64(p))
        dst = base + p * phase_size + r * width
        copy += spans + [
            For(j, i64(0), lo, [Store(xs, dst + j, zero)]),
            For(j, lo, hi, [Store(xs, dst + j, x[src + j * sw + (p - s.pw)])], vector=True),
            For(j, hi, i64(width), [Store(xs, dst + j, zero)])]
        zero_row.append(For(j, i64(0), i64(width), [Store(xs, dst + j, zero)], vector=True))
    inside = (select(ih.ge(0), 1, 0) * select(ih.lt(s.h), 1, 0)).gt(0)
    fill = [For(r, i64(0), i64(rows), [Let(ih, r - s.ph), If(inside, [Let(src, x_base + ih * s.w)] + copy, zero_row)])]

    # every tap's weight in a variable, the taps summed in a register per output
    taps = [(ki, kj) for ki in range(s.kh) for kj in range(s.kw)]
    wv = {t: names.var(f"w{t[0]}_{t[1]}", acc_type) for t in taps}
    weights = [Let(wv[(ki, kj)], w[(o * s.kh + ki) * s.kw + kj]) for ki, kj in taps]
    total = b[o] if b else lift(0.0, dtype)
    for ki, kj in taps:
        p, shift = (kj * s.dw) % sw, (kj * s.dw) // sw
        total = total + wv[(ki, kj)] * xs[base + p * phase_size + (oh * sh + ki * s.dh) * width + ow + shift]
    y_base = (n * s.o + o) * s.p
    compute = [For(oh, i64(0), i64(s.oh), [For(ow, i64(0), i64(s.ow), [
        Store(y, y_base + oh * s.ow + ow, total)], vector=True)])]
    mult = names.var("mult")
    tail = _plane_epilogue(names, program, ctx, out_shape, x_bufs, out_bufs, y, n, o)
    if tail is None:
        return None
    inner = [Let(o, c * s.og + mult)] + weights + compute + tail
    # one plane of input per iteration, copied once for all its output channels (the multiplier)
    body = [Let(slot, ThreadIndex()), Let(n, plane // s.c), Let(c, plane % s.c)] + fill + \
        [For(mult, i64(0), i64(s.og), inner)]
    loop = For(plane, i64(0), i64(s.n * s.c), body, parallel=threads > 1)
    return NativeCall(Kernel("depthwise", params, [loop], threads), arrays)


def _forward_by_taps(ctx, ins, outs, s: ConvShape, has_bias: bool, out_shape, program=None) -> NativeCall | None:
    dtype, threads = ctx.dtype, ctx.threads
    names = Names()
    x = Buf("x", dtype, s.n * s.c * s.h * s.w)
    w = Buf("w", dtype, s.o * s.kh * s.kw)
    b = Buf("bias", dtype, s.o) if has_bias else None
    y = Buf("y", dtype, int(np.prod(out_shape)), const=False)
    params = [x, w] + ([b] if b else []) + [y]
    arrays = [ins[0], ins[1]] + ([ins[2]] if b else []) + [outs[0]]
    x_bufs, out_bufs = epilogue_buffers(program, ctx, ins, outs, out_shape, params, arrays)
    plane, n, o, c = names.var("plane"), names.var("n"), names.var("o"), names.var("c")
    q, ki, kj, oh, ow, ih = (names.var(v) for v in ("q", "ki", "kj", "oh", "ow", "ih"))
    weight = names.var("wv", "float64" if dtype == "float64" else "float32")
    y_base, x_base = (n * s.o + o) * s.p, (n * s.c + c) * (s.h * s.w)
    spans, lo, hi, rlo, rhi = _tap_rows(names, s, ki, kj)
    start = b[o] if b else lift(0.0, dtype)
    taps = For(ki, i64(0), i64(s.kh), [For(kj, i64(0), i64(s.kw), [
        Let(weight, w[(o * s.kh + ki) * s.kw + kj])] + spans + [
        For(oh, rlo, rhi, [Let(ih, oh * s.sh - s.ph + ki * s.dh), For(ow, lo, hi, [
            Store(y, y_base + oh * s.ow + ow, weight * x[x_base + ih * s.w + ow * s.sw - s.pw + kj * s.dw],
                  accumulate=True)], vector=True)])])])
    tail = _plane_epilogue(names, program, ctx, out_shape, x_bufs, out_bufs, y, n, o)
    if tail is None:
        return None
    body = [Let(n, plane // s.o), Let(o, plane % s.o), Let(c, o // s.og),
            For(q, i64(0), i64(s.p), [Store(y, y_base + q, start)], vector=True), taps] + tail
    loop = For(plane, i64(0), i64(s.n * s.o), body, parallel=threads > 1)
    return NativeCall(Kernel("depthwise", params, [loop], threads), arrays)


def grad_input(ctx, ins, outs, s: ConvShape, x_shape, program=None) -> NativeCall | None:
    """dx[n, c] = the sum over c's output channels and taps of w * g, scattered back along each
    tap's valid rows (distinct input elements within a row, so the adds share vector lanes)."""
    dtype, threads = ctx.dtype, ctx.threads
    names = Names()
    gy = Buf("gy", dtype, s.n * s.o * s.p)
    w = Buf("w", dtype, s.o * s.kh * s.kw)
    dx = Buf("dx", dtype, int(np.prod(x_shape)), const=False)
    params, arrays = [gy, w, dx], [ins[0], ins[1], outs[0]]
    x_bufs, out_bufs = epilogue_buffers(program, ctx, ins, outs, x_shape, params, arrays)
    plane, n, c, j, o = names.var("plane"), names.var("n"), names.var("c"), names.var("j"), names.var("o")
    e, ki, kj, oh, ow, ih = (names.var(v) for v in ("e", "ki", "kj", "oh", "ow", "ih"))
    weight = names.var("wv", "float64" if dtype == "float64" else "float32")
    image = s.h * s.w
    x_base, g_base = (n * s.c + c) * image, (n * s.o + o) * s.p
    spans, lo, hi, rlo, rhi = _tap_rows(names, s, ki, kj)
    taps = For(ki, i64(0), i64(s.kh), [For(kj, i64(0), i64(s.kw), [
        Let(weight, w[(o * s.kh + ki) * s.kw + kj])] + spans + [
        For(oh, rlo, rhi, [Let(ih, oh * s.sh - s.ph + ki * s.dh), For(ow, lo, hi, [
            Store(dx, x_base + ih * s.w + ow * s.sw - s.pw + kj * s.dw, weight * gy[g_base + oh * s.ow + ow],
                  accumulate=True)], vector=True)])])])
    body = [Let(n, plane // s.c), Let(c, plane % s.c),
            For(e, i64(0), i64(image), [Store(dx, x_base + e, lift(0.0, dtype))], vector=True),
            For(j, i64(0), i64(s.og), [Let(o, c * s.og + j), taps])]
    tail = _plane_epilogue(names, program, ctx, x_shape, x_bufs, out_bufs, dx, n, c)
    if tail is None:
        return None
    body += tail
    loop = For(plane, i64(0), i64(s.n * s.c), body, parallel=threads > 1)
    return NativeCall(Kernel("depthwise_grad_input", params, [loop], threads), arrays)


def grad_weight(ctx, ins, outs, s: ConvShape) -> NativeCall:
    """dw[o, 0, i, j] = the sum over images and valid positions of g[n, o] * x[n, c(o)] at tap
    (i, j): each output channel's taps in one parallel iteration, so no partial sums to add."""
    dtype, threads = ctx.dtype, ctx.threads
    names = Names()
    gy = Buf("gy", dtype, s.n * s.o * s.p)
    x = Buf("x", dtype, s.n * s.c * s.h * s.w)
    dw = Buf("dw", dtype, s.o * s.kh * s.kw, const=False)
    o, c, n, ki, kj, oh, ow, ih = (names.var(v) for v in ("o", "c", "n", "ki", "kj", "oh", "ow", "ih"))
    total = names.var("sum", "float64" if dtype == "float64" else "float32")
    spans, lo, hi, rlo, rhi = _tap_rows(names, s, ki, kj)
    g_base, x_base = (n * s.o + o) * s.p, (n * s.c + c) * (s.h * s.w)
    product = gy[g_base + oh * s.ow + ow] * x[x_base + ih * s.w + ow * s.sw - s.pw + kj * s.dw]
    tap = [Let(total, lift(0.0, total.dtype))] + spans + [
        For(n, i64(0), i64(s.n), [For(oh, rlo, rhi, [Let(ih, oh * s.sh - s.ph + ki * s.dh), For(ow, lo, hi, [
            Set(total, total + product)], reduction=total)])]),
        Store(dw, (o * s.kh + ki) * s.kw + kj, total)]
    loop = For(o, i64(0), i64(s.o), [Let(c, o // s.og), For(ki, i64(0), i64(s.kh), [For(kj, i64(0), i64(s.kw), tap)])],
               parallel=threads > 1)
    return NativeCall(Kernel("depthwise_grad_weight", [gy, x, dw], [loop], threads), [ins[0], ins[1], outs[0]])

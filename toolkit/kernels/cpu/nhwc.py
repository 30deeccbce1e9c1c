"""Kernels of the channels-last layout's ops (ops/nhwc.py) over an array module: the reorders as
one transposing copy each, pooling as the NCHW kernel's strided windows over channels-last
memory, and the convolution as the NCHW kernel between two reorders. The layout pass makes
these ops only on a GPU, where cuDNN runs the convolution (kernels/gpu/nhwc.py); the
convolution here runs them anywhere else (tests, a graph made for a GPU run on the host, a GPU
without cuDNN) at the NCHW kernel's speed plus the copies."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...backend.registry import register_kernel
from ...ops.nhwc import TO_NCHW, TO_NHWC, nchw_shape
from ...ops.pool import avg_divisor, lowest
from .conv import conv2d
from .pool import _Pool


def to_nhwc(ctx, xp=np):
    def run(ins, outs):
        xp.copyto(outs[0], ins[0].transpose(TO_NHWC))
    return run


def from_nhwc(ctx, xp=np):
    def run(ins, outs):
        xp.copyto(outs[0], ins[0].transpose(TO_NCHW))
    return run


def nhwc_conv2d(ctx, xp=np):
    """The NCHW kernel on a reordered copy of the input and weight, its output reordered back."""
    o, kh, kw, cg = ctx.in_shapes[1]
    x_shape, y_shape = nchw_shape(ctx.in_shapes[0]), nchw_shape(ctx.out_shapes[0])
    inner = conv2d(replace(ctx, in_shapes=[x_shape, (o, cg, kh, kw)] + list(ctx.in_shapes[2:]),
                           out_shapes=[y_shape]), xp)
    x, w, y = xp.empty(x_shape, ctx.dtype), xp.empty((o, cg, kh, kw), ctx.dtype), xp.empty(y_shape, ctx.dtype)

    def run(ins, outs):
        xp.copyto(x, ins[0].transpose(TO_NCHW))
        xp.copyto(w, ins[1].transpose(TO_NCHW))
        inner([x, w] + list(ins[2:]), [y])
        xp.copyto(outs[0], y.transpose(TO_NHWC))
    return run


def _channels_last_pool(ctx, fill, xp):
    """pool.py's windows over [N, C, H, W] views of channels-last arrays, its padded buffer
    channels last too, so every window's copy walks memory in order."""
    pool = _Pool(nchw_shape(ctx.in_shapes[0]), nchw_shape(ctx.out_shapes[0]), ctx.attrs, ctx.dtype, fill, xp)
    if pool.needs_pad:
        n, c, hp, wp = pool.buffer.shape
        pool.buffer = xp.full((n, hp, wp, c), fill, ctx.dtype).transpose(TO_NCHW)
    return pool


def nhwc_max_pool2d(ctx, xp=np):
    pool = _channels_last_pool(ctx, lowest(ctx.dtype), xp)
    first, rest = pool.offsets()[0], pool.offsets()[1:]

    def run(ins, outs):
        src, y = pool.source(ins[0].transpose(TO_NCHW)), outs[0].transpose(TO_NCHW)
        xp.copyto(y, pool.window(src, *first))
        for i, j in rest:
            xp.maximum(y, pool.window(src, i, j), out=y)
    return run


def nhwc_avg_pool2d(ctx, xp=np):
    pool = _channels_last_pool(ctx, 0.0, xp)
    inv_divisor = xp.asarray((1.0 / avg_divisor(pool.h, pool.w, pool.oh, pool.ow, ctx.attrs)).astype(ctx.dtype))
    offsets = pool.offsets()

    def run(ins, outs):
        src, y = pool.source(ins[0].transpose(TO_NCHW)), outs[0].transpose(TO_NCHW)
        xp.copyto(y, pool.window(src, *offsets[0]))
        for i, j in offsets[1:]:
            xp.add(y, pool.window(src, i, j), out=y)
        xp.multiply(y, inv_divisor, out=y)
    return run


# the same builders over numpy here; the GPU back end registers them over CuPy
NHWC_KERNELS = {"to_nhwc": to_nhwc, "from_nhwc": from_nhwc, "nhwc_conv2d": nhwc_conv2d,
                "nhwc_max_pool2d": nhwc_max_pool2d, "nhwc_avg_pool2d": nhwc_avg_pool2d}
for _op, _builder in NHWC_KERNELS.items():
    register_kernel(_op, "cpu", fusion_pays=False)(_builder)

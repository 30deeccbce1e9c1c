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
from .conv import conv2d, conv2d_grad_input, conv2d_grad_weight
from .pool import _Pool, avg_pool2d_grad, max_pool2d_grad


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


def _nchw_shapes(shapes):
    return [nchw_shape(s) if len(s) == 4 else tuple(s) for s in shapes]


def _between_copies(nchw_builder, ctx, xp):
    """The NCHW kernel ``nchw_builder`` makes, on NCHW copies of the 4-d inputs (images NHWC,
    filters [O, kH, kW, C/group]: one permutation), its output permuted back."""
    inner = nchw_builder(replace(ctx, in_shapes=_nchw_shapes(ctx.in_shapes), out_shapes=_nchw_shapes(ctx.out_shapes)),
                         xp)
    staged = [xp.empty(s, ctx.dtype) if len(s) == 4 else None for s in _nchw_shapes(ctx.in_shapes)]
    y = xp.empty(nchw_shape(ctx.out_shapes[0]), ctx.dtype)

    def run(ins, outs):
        for stage, a in zip(staged, ins):
            if stage is not None:
                xp.copyto(stage, a.transpose(TO_NCHW))
        inner([a if stage is None else stage for stage, a in zip(staged, ins)], [y])
        xp.copyto(outs[0], y.transpose(TO_NHWC))
    return run


def _on_views(nchw_builder, ctx, xp):
    """The NCHW kernel ``nchw_builder`` makes, on [N, C, H, W] views of the channels-last arrays
    (pooling's kernels index windows of them and write through ``out=``)."""
    inner = nchw_builder(replace(ctx, in_shapes=_nchw_shapes(ctx.in_shapes), out_shapes=_nchw_shapes(ctx.out_shapes)),
                         xp)

    def run(ins, outs):
        inner([a.transpose(TO_NCHW) for a in ins], [o.transpose(TO_NCHW) for o in outs])
    return run


def nhwc_conv2d_backward_data(ctx, xp=np):
    return _between_copies(conv2d_grad_input, ctx, xp)


def nhwc_conv2d_backward_filter(ctx, xp=np):
    return _between_copies(conv2d_grad_weight, ctx, xp)


def nhwc_max_pool2d_backward(ctx, xp=np):
    return _on_views(max_pool2d_grad, ctx, xp)


def nhwc_avg_pool2d_backward(ctx, xp=np):
    return _on_views(avg_pool2d_grad, ctx, xp)


# the same builders over numpy here; the GPU back end registers them over CuPy
NHWC_KERNELS = {"to_nhwc": to_nhwc, "from_nhwc": from_nhwc, "nhwc_conv2d": nhwc_conv2d,
                "nhwc_max_pool2d": nhwc_max_pool2d, "nhwc_avg_pool2d": nhwc_avg_pool2d,
                "nhwc_conv2d_backward_data": nhwc_conv2d_backward_data,
                "nhwc_conv2d_backward_filter": nhwc_conv2d_backward_filter,
                "nhwc_max_pool2d_backward": nhwc_max_pool2d_backward,
                "nhwc_avg_pool2d_backward": nhwc_avg_pool2d_backward}
for _op, _builder in NHWC_KERNELS.items():
    register_kernel(_op, "cpu", fusion_pays=False)(_builder)

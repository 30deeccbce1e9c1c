"""CPU pooling: one vectorised pass per kernel offset over strided window views.

Padded buffers keep their fill (-inf for max, a uint8 / int8 input's least value; 0 for average)
in the border from plan build on; only the interior is rewritten per call. Written against an
array module ``xp`` (numpy here), so the GPU back end registers the same kernels over CuPy.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_kernel
from ...ops.pool import avg_divisor, lowest


class _Pool:
    def __init__(self, x_shape, y_shape, attrs, dtype, fill, xp=np):
        self.xp = xp
        self.n, self.c, self.h, self.w = x_shape
        self.oh, self.ow = y_shape[2:]
        (self.kh, self.kw), (self.sh, self.sw), (self.ph, self.pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
        hp = max((self.oh - 1) * self.sh + self.kh, self.h + 2 * self.ph)
        wp = max((self.ow - 1) * self.sw + self.kw, self.w + 2 * self.pw)
        self.needs_pad = (hp, wp) != (self.h, self.w)
        self.buffer = xp.full((self.n, self.c, hp, wp), fill, dtype) if self.needs_pad else None

    def interior(self, buf):
        return buf[:, :, self.ph: self.ph + self.h, self.pw: self.pw + self.w]

    def source(self, x):
        if not self.needs_pad:
            return x
        self.xp.copyto(self.interior(self.buffer), x)
        return self.buffer

    def window(self, src, i, j):
        return src[:, :, i: i + self.sh * (self.oh - 1) + 1: self.sh, j: j + self.sw * (self.ow - 1) + 1: self.sw]

    def offsets(self):
        return [(i, j) for i in range(self.kh) for j in range(self.kw)]


def max_pool2d(ctx, xp=np):
    pool = _Pool(ctx.in_shapes[0], ctx.out_shapes[0], ctx.attrs, ctx.dtype, lowest(ctx.dtype), xp)
    first, rest = pool.offsets()[0], pool.offsets()[1:]

    def run(ins, outs):
        src, y = pool.source(ins[0]), outs[0]
        xp.copyto(y, pool.window(src, *first))
        for i, j in rest:
            xp.maximum(y, pool.window(src, i, j), out=y)
    return run


def max_pool2d_grad(ctx, xp=np):
    g_shape, x_shape = ctx.in_shapes
    pool = _Pool(x_shape, g_shape, ctx.attrs, ctx.dtype, -np.inf, xp)
    grad_buf = xp.zeros(pool.buffer.shape, ctx.dtype) if pool.needs_pad else None
    y = xp.empty(g_shape, ctx.dtype)
    taken = xp.empty(g_shape, bool)
    hit = xp.empty(g_shape, bool)
    routed = xp.empty(g_shape, ctx.dtype)
    offsets = pool.offsets()

    def run(ins, outs):
        g, x = ins
        src = pool.source(x)
        xp.copyto(y, pool.window(src, *offsets[0]))
        for i, j in offsets[1:]:
            xp.maximum(y, pool.window(src, i, j), out=y)
        target = grad_buf if grad_buf is not None else outs[0]
        target.fill(0)
        taken.fill(False)
        for i, j in offsets:            # row-major scan: each window's first maximum wins, as PyTorch
            xp.equal(pool.window(src, i, j), y, out=hit)
            xp.greater(hit, taken, out=hit)          # hit and not taken
            xp.logical_or(taken, hit, out=taken)
            xp.multiply(g, hit, out=routed)
            view = pool.window(target, i, j)
            xp.add(view, routed, out=view)
        if grad_buf is not None:
            xp.copyto(outs[0], pool.interior(grad_buf))
    return run


def avg_pool2d(ctx, xp=np):
    pool = _Pool(ctx.in_shapes[0], ctx.out_shapes[0], ctx.attrs, ctx.dtype, 0.0, xp)
    inv_divisor = xp.asarray((1.0 / avg_divisor(pool.h, pool.w, pool.oh, pool.ow, ctx.attrs)).astype(ctx.dtype))
    offsets = pool.offsets()

    def run(ins, outs):
        src, y = pool.source(ins[0]), outs[0]
        xp.copyto(y, pool.window(src, *offsets[0]))
        for i, j in offsets[1:]:
            xp.add(y, pool.window(src, i, j), out=y)
        xp.multiply(y, inv_divisor, out=y)
    return run


def avg_pool2d_grad(ctx, xp=np):
    g_shape = ctx.in_shapes[0]
    x_shape = ctx.out_shapes[0]
    pool = _Pool(x_shape, g_shape, ctx.attrs, ctx.dtype, 0.0, xp)
    inv_divisor = xp.asarray((1.0 / avg_divisor(pool.h, pool.w, pool.oh, pool.ow, ctx.attrs)).astype(ctx.dtype))
    share = xp.empty(g_shape, ctx.dtype)

    def run(ins, outs):
        xp.multiply(ins[0], inv_divisor, out=share)
        target = pool.buffer if pool.needs_pad else outs[0]
        target.fill(0)
        for i, j in pool.offsets():
            view = pool.window(target, i, j)
            xp.add(view, share, out=view)
        if pool.needs_pad:
            xp.copyto(outs[0], pool.interior(pool.buffer))
    return run


# the same builders over numpy; the GPU back end registers them over CuPy
POOL_KERNELS = {"max_pool2d": max_pool2d, "max_pool2d_grad": max_pool2d_grad,
                "avg_pool2d": avg_pool2d, "avg_pool2d_grad": avg_pool2d_grad}
for _op, _builder in POOL_KERNELS.items():
    register_kernel(_op, "cpu")(_builder)

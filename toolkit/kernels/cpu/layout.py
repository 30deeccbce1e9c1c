"""Kernels of the blocked channel layout's ops (ops/layout.py) over an array module: the reorders
as one strided copy each, and the blocked convolution as the NCHW kernel between two reorders.
The layout pass only chooses the blocked layout where the generated kernels run it
(kernels/native/blocked.py); these run the ops anywhere else (tests, a plan without a
compiler, the GPU back end over CuPy) at the NCHW kernel's speed plus two copies."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...backend.registry import register_kernel
from ...codegen import microkernel, toolchain
from .conv import conv2d


def blocked_kernels_pay() -> bool:
    """The layout pass blocks convolutions where the generated kernels run them: a C compiler,
    and a processor with 16-float vectors. This module's kernels never pay for themselves."""
    return toolchain.available() and microkernel.available()


def to_blocked(ctx, xp=np):
    block = ctx.attrs["block"]

    def run(ins, outs):
        n, c, h, w = ins[0].shape
        xp.copyto(outs[0], ins[0].reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2))
    return run


def from_blocked(ctx, xp=np):
    def run(ins, outs):
        n, c, h, w = outs[0].shape
        cb, block = ins[0].shape[1], ins[0].shape[4]
        xp.copyto(outs[0].reshape(n, cb, block, h, w), ins[0].transpose(0, 1, 4, 2, 3))
    return run


def conv2d_blocked(ctx, xp=np):
    block = ctx.attrs["block"]
    n, cb, h, w, _ = ctx.in_shapes[0]
    _, ob, oh, ow, _ = ctx.out_shapes[0]
    plain_in, plain_out = (n, cb * block, h, w), (n, ob * block, oh, ow)
    attrs = {k: v for k, v in ctx.attrs.items() if k != "block"}
    inner = conv2d(replace(ctx, attrs=attrs, in_shapes=[plain_in] + list(ctx.in_shapes[1:]), out_shapes=[plain_out]),
                   xp)
    x = xp.empty(plain_in, ctx.dtype)
    y = xp.empty(plain_out, ctx.dtype)

    def run(ins, outs):
        xp.copyto(x.reshape(n, cb, block, h, w), ins[0].transpose(0, 1, 4, 2, 3))
        inner([x] + list(ins[1:]), [y])
        xp.copyto(outs[0], y.reshape(n, ob, block, oh, ow).transpose(0, 1, 3, 4, 2))
    return run


# the same builders over numpy here; the GPU back end registers them over CuPy
LAYOUT_KERNELS = {"to_blocked": to_blocked, "from_blocked": from_blocked, "conv2d_blocked": conv2d_blocked}
register_kernel("to_blocked", "cpu")(to_blocked)
register_kernel("from_blocked", "cpu")(from_blocked)
register_kernel("conv2d_blocked", "cpu", fusion_pays=blocked_kernels_pay)(conv2d_blocked)

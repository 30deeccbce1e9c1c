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
from ..native import winograd
from ..native.conv_parts import ConvShape
from .conv import conv2d
from .pool import max_pool2d


def blocked_kernels_pay(node=None) -> bool:
    """Whether the layout pass should block ``node`` (a conv2d; None: any): where the generated
    kernels run (a C compiler, a processor with 16-float vectors; this module's kernels never pay
    for themselves), and not where the NCHW kernel runs Winograd F(2x2, 3x3), whose 2.25x fewer
    multiplications beat the blocked direct tile (GoogLeNet's 3x3 layers, one thread: 0.65 ms
    blocked against 0.46 at 14x14, 1.57 against 1.06 at 28x28; at 7x7 Winograd does not apply
    and the blocked tile wins, 0.48 against 0.63)."""
    if not (toolchain.available() and microkernel.available()):
        return False
    if node is None:
        return True
    x, w = node.inputs[0], node.inputs[1]
    if not all(isinstance(d, int) for d in (*x.shape[1:], *w.shape)):
        return True
    out_hw = node.outputs[0].shape[2:]
    per_image = (1, *x.shape[1:])            # the batch may be symbolic; the rule is per image
    return not winograd.applies(ConvShape(per_image, w.shape, out_hw, node.attrs), pool=False)


def to_blocked(ctx, xp=np):
    block = ctx.attrs["block"]

    def run(ins, outs):
        n, c, h, w = ins[0].shape
        whole, extra = divmod(c, block)
        xp.copyto(outs[0][:, :whole], ins[0][:, :whole * block].reshape(n, whole, block, h, w)
                  .transpose(0, 1, 3, 4, 2))
        if extra:                              # the last block: the channels left, then zeros
            last = outs[0][:, whole]
            last[..., extra:] = 0
            xp.copyto(last[..., :extra], ins[0][:, whole * block:].transpose(0, 2, 3, 1))
    return run


def from_blocked(ctx, xp=np):
    def run(ins, outs):
        n, c, h, w = outs[0].shape
        block = ins[0].shape[4]
        whole, extra = divmod(c, block)
        xp.copyto(outs[0][:, :whole * block].reshape(n, whole, block, h, w),
                  ins[0][:, :whole].transpose(0, 1, 4, 2, 3))
        if extra:
            xp.copyto(outs[0][:, whole * block:], ins[0][:, whole, ..., :extra].transpose(0, 3, 1, 2))
    return run


def _between_reorders(plain_builder, ctx, xp):
    """The NCHW kernel ``plain_builder`` makes, run between a reorder of input 0 from blocked and
    one of its output back to blocked."""
    block = ctx.attrs["block"]
    nchw_input = len(ctx.in_shapes[0]) == 4          # an NCHW input: only the output is reordered
    if nchw_input:
        n, c, h, w = ctx.in_shapes[0]
        plain_in = (n, c, h, w)
    else:
        n, cb, h, w, _ = ctx.in_shapes[0]
        plain_in = (n, cb * block, h, w)
    _, ob, oh, ow, _ = ctx.out_shapes[0]
    plain_out = (n, ob * block, oh, ow)
    attrs = {k: v for k, v in ctx.attrs.items() if k != "block"}
    inner = plain_builder(replace(ctx, attrs=attrs, in_shapes=[plain_in] + list(ctx.in_shapes[1:]),
                                  out_shapes=[plain_out]), xp)
    x = None if nchw_input else xp.empty(plain_in, ctx.dtype)
    y = xp.empty(plain_out, ctx.dtype)

    def run(ins, outs):
        if nchw_input:
            inner(list(ins), [y])
        else:
            xp.copyto(x.reshape(n, cb, block, h, w), ins[0].transpose(0, 1, 4, 2, 3))
            inner([x] + list(ins[1:]), [y])
        xp.copyto(outs[0], y.reshape(n, ob, block, oh, ow).transpose(0, 1, 3, 4, 2))
    return run


def conv2d_blocked(ctx, xp=np):
    return _between_reorders(conv2d, ctx, xp)


def max_pool2d_blocked(ctx, xp=np):
    return _between_reorders(max_pool2d, ctx, xp)


# the same builders over numpy here; the GPU back end registers them over CuPy
LAYOUT_KERNELS = {"to_blocked": to_blocked, "from_blocked": from_blocked, "conv2d_blocked": conv2d_blocked,
                  "max_pool2d_blocked": max_pool2d_blocked}
register_kernel("to_blocked", "cpu")(to_blocked)
register_kernel("from_blocked", "cpu")(from_blocked)
register_kernel("max_pool2d_blocked", "cpu")(max_pool2d_blocked)
register_kernel("conv2d_blocked", "cpu", fusion_pays=blocked_kernels_pay)(conv2d_blocked)

"""CPU reductions and broadcasts, writing into preallocated outputs."""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_kernel
from ...ops.reduce import bessel_factor, reduced_count


@register_kernel("reduce_sum", "cpu")
def reduce_sum_cpu(ctx):
    axes, keep = tuple(ctx.attrs["axes"]), ctx.attrs["keepdims"]

    def run(ins, outs):
        np.sum(ins[0], axis=axes, keepdims=keep, out=outs[0])
    return run


@register_kernel("reduce_mean", "cpu")
def reduce_mean_cpu(ctx):
    axes, keep = tuple(ctx.attrs["axes"]), ctx.attrs["keepdims"]

    def run(ins, outs):
        np.mean(ins[0], axis=axes, keepdims=keep, out=outs[0])
    return run


@register_kernel("reduce_mean_grad", "cpu")
def reduce_mean_grad_cpu(ctx):
    inv = 1.0 / reduced_count(ctx.out_shapes[0], ctx.attrs["axes"])

    def run(ins, outs):
        np.multiply(ins[0], inv, out=outs[0])
    return run


@register_kernel("broadcast_to", "cpu")
def broadcast_to_cpu(ctx):
    def run(ins, outs):
        np.copyto(outs[0], ins[0])
    return run


@register_kernel("bessel_correct", "cpu", inplace=True)
def bessel_correct_cpu(ctx):
    factor = bessel_factor(ctx.attrs["count"])

    def run(ins, outs):
        np.multiply(ins[0], factor, out=outs[0])
    return run

"""CPU reductions and broadcasts, writing into preallocated outputs."""
from __future__ import annotations

import numpy as np

from ..registry import register_kernel


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


def _count(shape, axes):
    return int(np.prod([shape[a] for a in axes])) if axes else 1


@register_kernel("reduce_mean_grad", "cpu")
def reduce_mean_grad_cpu(ctx):
    inv = 1.0 / _count(ctx.in_shapes[1], [a % len(ctx.in_shapes[1]) for a in ctx.attrs["axes"]])

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
    n = _count(ctx.in_shapes[1], ctx.attrs["axes"])
    factor = n / max(n - 1, 1)

    def run(ins, outs):
        np.multiply(ins[0], factor, out=outs[0])
    return run

"""CPU kernels of the collective ops: numpy buffers handed to the communicator. A bucket's send
and receive buffers are the kernel's own, allocated once when the plan is built."""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_kernel
from ...distributed.comm import current
from ...ops.collective import unpack


@register_kernel("allreduce_sum", "cpu")
def allreduce_sum_cpu(ctx):
    def run(ins, outs):
        np.copyto(outs[0], current().allreduce(ins[0]))
    return run


def _flat_size(shapes) -> int:
    return sum(int(np.prod(s, dtype=np.int64)) for s in shapes)


@register_kernel("allreduce_start", "cpu")
def allreduce_start_cpu(ctx):
    bucket = ctx.attrs["bucket"]
    send = np.empty(_flat_size(ctx.in_shapes), dtype=ctx.node.inputs[0].dtype)
    recv = np.empty_like(send)
    views, offset = [], 0
    for shape in ctx.in_shapes:
        n = int(np.prod(shape, dtype=np.int64))
        views.append(send[offset: offset + n].reshape(shape))
        offset += n

    def run(ins, outs):
        for view, g in zip(views, ins):
            np.copyto(view, g)
        current().start_allreduce(bucket, send, recv)
        outs[0][...] = bucket
    return run


@register_kernel("allreduce_wait", "cpu")
def allreduce_wait_cpu(ctx):
    bucket = ctx.attrs["bucket"]
    shapes = ctx.out_shapes

    def run(ins, outs):
        for out, part in zip(outs, unpack(current().wait_allreduce(bucket), shapes)):
            np.copyto(out, part)
    return run

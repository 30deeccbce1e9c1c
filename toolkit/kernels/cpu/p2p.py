"""CPU kernels of the point-to-point ops (ops/p2p.py): numpy buffers handed to the communicator.
A send copies its value into the kernel's own buffer, which the communicator sends without
waiting; the buffer is reused only once that send has finished (the communicator waits for it
first). A receive blocks: its value is what the stage's next op reads."""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_kernel
from ...distributed.comm import current


@register_kernel("send", "cpu")
def send_cpu(ctx):
    peer, tag = ctx.attrs["peer"], ctx.attrs["tag"]
    buffer = np.empty(ctx.in_shapes[0], dtype=ctx.node.inputs[0].dtype)

    def run(ins, outs):
        comm = current()
        comm.finish_send(tag)           # the previous step's send of this buffer has left it
        np.copyto(buffer, ins[0])
        comm.send(peer, tag, buffer)
        outs[0][...] = tag
    return run


@register_kernel("recv", "cpu")
def recv_cpu(ctx):
    peer, tag = ctx.attrs["peer"], ctx.attrs["tag"]
    buffer = np.empty(ctx.out_shapes[0], dtype=ctx.node.outputs[0].dtype)

    def run(ins, outs):
        np.copyto(outs[0], current().recv(peer, tag, buffer))
    return run

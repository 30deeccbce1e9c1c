"""The collective ops on the GPU, staged through host memory: each all-reduce copies the device
arrays to the host, sums them over the ranks with MPI, and copies the result back. Correct on
any MPI, at the cost of the two copies; reducing device memory directly (NCCL through CuPy, or
a CUDA-aware MPI) is not done. Data-parallel training itself is offered on the CPU only for now
(train/trainer.py), so these kernels serve graphs compiled for a GPU, and tests."""
from __future__ import annotations

from ...backend.devices import gpu_module, to_host
from ...backend.registry import register_kernel
from ...distributed.comm import current
from ...ops.collective import pack, unpack

cp = gpu_module()


STAGED = "stages its values through host memory"


@register_kernel("allreduce_sum", "gpu", host_sync=STAGED)
def allreduce_sum_gpu(ctx):
    def run(ins, outs):
        outs[0][...] = cp.asarray(current().allreduce(to_host(ins[0])))
    return run


@register_kernel("allreduce_start", "gpu", host_sync=STAGED)
def allreduce_start_gpu(ctx):
    bucket = ctx.attrs["bucket"]

    def run(ins, outs):
        current().start_allreduce(bucket, pack([to_host(g) for g in ins]))
        outs[0].fill(bucket)
    return run


@register_kernel("allreduce_wait", "gpu", host_sync=STAGED)
def allreduce_wait_gpu(ctx):
    bucket = ctx.attrs["bucket"]
    shapes = ctx.out_shapes

    def run(ins, outs):
        for out, part in zip(outs, unpack(current().wait_allreduce(bucket), shapes)):
            out[...] = cp.asarray(part)
    return run

"""The collective ops on the GPU. Where the job's communicator carries NCCL sums
(distributed/nccl.py: one GPU per rank), every sum stays in device memory: a gradient bucket is
packed into a buffer of its own (one per kernel, kept for the plan's life so that a captured
graph replays into the same memory), summed in place by ncclAllReduce on the NCCL stream, and
unpacked once the compute stream has waited for it. Such a plan can be captured whole.

Else (NCCL cannot run here: the one line at the job's start says why) each all-reduce copies
the device arrays to the host, sums them over the ranks with MPI and copies the result back:
correct on any MPI, at the cost of the two copies and of capture."""
from __future__ import annotations

from ...backend.devices import gpu_module, to_host
from ...backend.registry import register_kernel
from ...distributed.comm import current
from ...ops.collective import pack, unpack

cp = gpu_module()


STAGED = "stages its values through host memory"


def _device_sums():
    """The NCCL sums of the job this plan is built in, or None (host-staged)."""
    return current().device_sums


def _host_sync(node) -> str | None:
    sums = _device_sums()
    return STAGED if sums is None else sums.capturable


@register_kernel("allreduce_sum", "gpu", host_sync=_host_sync)
def allreduce_sum_gpu(ctx):
    sums = _device_sums()
    if sums is None:
        def run(ins, outs):
            outs[0][...] = cp.asarray(current().allreduce(to_host(ins[0])))
        return run

    def run_nccl(ins, outs):
        source = ins[0] if ins[0].flags.c_contiguous else cp.ascontiguousarray(ins[0])
        sums.allreduce(source, outs[0])
    return run_nccl


@register_kernel("allreduce_start", "gpu", host_sync=_host_sync)
def allreduce_start_gpu(ctx):
    bucket = ctx.attrs["bucket"]
    sums = _device_sums()
    if sums is None:
        def run(ins, outs):
            current().start_allreduce(bucket, pack([to_host(g) for g in ins]))
            outs[0].fill(bucket)
        return run
    kept: list = []                       # the bucket's buffer, made on the first run

    def run_nccl(ins, outs):
        sizes = [int(g.size) for g in ins]
        if not kept:
            kept.append(cp.empty(sum(sizes), dtype=ins[0].dtype))
        buffer = kept[0]
        offset = 0
        for g, n in zip(ins, sizes):          # device copies on the compute stream
            buffer[offset: offset + n] = g.reshape(-1)
            offset += n
        sums.start(bucket, buffer)
        outs[0].fill(bucket)
    return run_nccl


@register_kernel("allreduce_wait", "gpu", host_sync=_host_sync)
def allreduce_wait_gpu(ctx):
    bucket = ctx.attrs["bucket"]
    shapes = ctx.out_shapes
    sums = _device_sums()
    if sums is None:
        def run(ins, outs):
            for out, part in zip(outs, unpack(current().wait_allreduce(bucket), shapes)):
                out[...] = cp.asarray(part)
        return run

    def run_nccl(ins, outs):
        for out, part in zip(outs, unpack(sums.wait(bucket), shapes)):
            out[...] = part
    return run_nccl

"""The CPU's fused_reduce: the program's reference evaluation, then numpy's sum or mean. It
exists so that every op runs on the CPU (a graph fused for a GPU, the tests); it is no faster than
the ops it stands for, so the fuse_reductions pass never makes the op for the CPU."""
from __future__ import annotations

from ...backend.registry import KernelContext, register_kernel
from ...ops.base import get_op


@register_kernel("fused_reduce", "cpu", fusion_pays=False)
def fused_reduce_cpu(ctx: KernelContext):
    reference = get_op("fused_reduce").reference
    attrs = {k: ctx.attrs[k] for k in ("program", "outputs", "means", "axes", "keepdims", "compute", "in_dtypes")
             if k in ctx.attrs}

    def run(ins, outs):
        results = reference(*ins, **attrs)
        for out, result in zip(outs, results if len(outs) > 1 else (results,)):
            out[...] = result
    return run

"""The generated kernel of a fused_epilogue: the GEMM's (elementwise.py), the blocked
convolution's (blocked.py) or the convolution's (conv.py), by the group's head. The GEMM's takes
its sizes at run time; the convolutions' keep every size compiled in (their loops are tiled by
the numbers)."""
from __future__ import annotations

import dataclasses

from ...backend.registry import register_native
from ...codegen.loops import unsized
from ...ops.fused import head_parts
from .blocked import blocked_convolution
from .conv import conv_epilogue_native
from .elementwise import matmul_epilogue_native


@register_native("fused_epilogue", "cpu", run_time_sizes=True)
def fused_epilogue_native(ctx, ins, outs):
    head, _head_attrs, _k = head_parts(ctx.attrs)
    if head == "matmul":
        return matmul_epilogue_native(ctx, ins, outs)
    ctx = dataclasses.replace(ctx, attrs=unsized(ctx.attrs), in_shapes=unsized(ctx.in_shapes),
                              out_shapes=unsized(ctx.out_shapes))
    if head == "conv2d_blocked":
        return blocked_convolution(ctx, ins, outs, (ctx.attrs["program"], ctx.attrs["outputs"]))
    return conv_epilogue_native(ctx, ins, outs)

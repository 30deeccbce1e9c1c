"""The generated kernel of a fused_epilogue: the GEMM's (elementwise.py), the blocked
convolution's (blocked.py) or the convolution's (conv.py), by the group's head."""
from __future__ import annotations

from ...backend.registry import register_native
from ...ops.fused import head_parts
from .blocked import blocked_convolution
from .conv import conv_epilogue_native
from .elementwise import matmul_epilogue_native


@register_native("fused_epilogue", "cpu")
def fused_epilogue_native(ctx, ins, outs):
    head, _head_attrs, _k = head_parts(ctx.attrs)
    if head == "matmul":
        return matmul_epilogue_native(ctx, ins, outs)
    if head == "conv2d_blocked":
        return blocked_convolution(ctx, ins, outs, (ctx.attrs["program"], ctx.attrs["outputs"]))
    return conv_epilogue_native(ctx, ins, outs)

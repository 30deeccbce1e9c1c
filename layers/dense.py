"""InnerProduct (fully connected) layer: PyTorch's Linear layout, weight [O, I]."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.base import Bool, ParamLayerBase, PositiveInt
from toolkit.ir.dims import product

from .registry import layer, layer_axis, static_dim


class InnerProductParams(ParamLayerBase):
    """y = x W^T + b on the input flattened from ``axis``; W is [num_output, in] (PyTorch's and
    Caffe's layout), or [in, num_output] with ``transpose`` (Caffe's transpose: y = x W + b)."""
    type: Literal["InnerProduct"]
    num_output: PositiveInt = Field(description="outputs per input row")
    bias_term: Bool = Field(True, description="add a learned bias to each output")
    axis: int = Field(1, description="the input is flattened from this axis on; the axes before it are kept")
    transpose: Bool = Field(False, description="the weight is stored [in, num_output] (Caffe's transpose: y = x W + b)")


@layer(InnerProductParams)
def lower_inner_product(p: InnerProductParams, ctx, bottoms):
    x, = bottoms
    axis = layer_axis(p.axis, x, ctx)
    features = static_dim(product(x.shape[axis:]), f"the input's size from axis {axis}", "bottom")
    b = ctx.b
    shape = (features, p.num_output) if p.transpose else (p.num_output, features)
    w = ctx.param("weight", shape, fan_in=features, fan_out=p.num_output)
    rows = product(x.shape[:axis])
    y = b.op("matmul", b.reshape(x, (rows, features)), w, trans_a=False, trans_b=not p.transpose)
    if p.bias_term:
        bias = ctx.param("bias", (p.num_output,), default_filler={"type": "constant", "value": 0.0})
        y = b.add(y, bias)
    return [b.reshape(y, tuple(x.shape[:axis]) + (p.num_output,))]

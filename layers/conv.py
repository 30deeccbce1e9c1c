"""Convolution and Pooling layers."""
from __future__ import annotations

from typing import Literal, Optional

from schemas.base import Bool, LayerBase, PadPair, Pair, ParamLayerBase, PositiveInt

from .registry import LayerError, layer, pair, static_dim


class ConvolutionParams(ParamLayerBase):
    type: Literal["Convolution"]
    num_output: PositiveInt
    kernel_size: Pair
    stride: Pair = 1
    pad: PadPair = 0
    dilation: Pair = 1
    group: PositiveInt = 1
    bias_term: Bool = True


@layer(ConvolutionParams)
def lower_convolution(p: ConvolutionParams, ctx, bottoms):
    x, = bottoms
    if x.rank != 4:
        raise LayerError(f"Convolution needs a 4-d input [N, C, H, W], got {ctx.fmt(x)}", "bottom")
    channels = static_dim(x.shape[1], "the input's channel dimension", "bottom")
    if channels % p.group:
        raise LayerError(f"the input's {channels} channels are not divisible by group {p.group}", "group")
    if p.num_output % p.group:
        raise LayerError(f"num_output {p.num_output} is not divisible by group {p.group}", "num_output")
    kh, kw = pair(p.kernel_size)
    shape = (p.num_output, channels // p.group, kh, kw)
    w = ctx.param("weight", shape, fan_in=channels // p.group * kh * kw, fan_out=p.num_output * kh * kw)
    inputs = [x, w]
    if p.bias_term:
        inputs.append(ctx.param("bias", (p.num_output,), default_filler={"type": "constant", "value": 0.0}))
    return [ctx.b.op("conv2d", *inputs, stride=pair(p.stride), pad=pair(p.pad), dilation=pair(p.dilation),
                     group=p.group)]


class PoolingParams(LayerBase):
    type: Literal["Pooling"]
    pool: Literal["max", "ave"] = "max"
    kernel_size: Optional[Pair] = None
    stride: Pair = 1
    pad: PadPair = 0
    global_pooling: Bool = False
    ceil_mode: Bool = False
    count_include_pad: Bool = True


@layer(PoolingParams)
def lower_pooling(p: PoolingParams, ctx, bottoms):
    x, = bottoms
    if x.rank != 4:
        raise LayerError(f"Pooling needs a 4-d input [N, C, H, W], got {ctx.fmt(x)}", "bottom")
    b = ctx.b
    if p.global_pooling:
        if p.pool == "ave":
            return [b.op("reduce_mean", x, axes=(2, 3), keepdims=True)]
        kernel = (static_dim(x.shape[2], "height for global max pooling"),
                  static_dim(x.shape[3], "width for global max pooling"))
        return [b.op("max_pool2d", x, kernel=kernel, stride=(1, 1), pad=(0, 0), ceil_mode=False)]
    if p.kernel_size is None:
        raise LayerError("Pooling needs kernel_size (or global_pooling: true)", None)
    attrs = dict(kernel=pair(p.kernel_size), stride=pair(p.stride), pad=pair(p.pad), ceil_mode=p.ceil_mode)
    if p.pool == "max":
        return [b.op("max_pool2d", x, **attrs)]
    return [b.op("avg_pool2d", x, count_include_pad=p.count_include_pad, **attrs)]

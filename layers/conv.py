"""Convolution and Pooling layers."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from schemas.base import Bool, LayerBase, PadPair, Pair, ParamLayerBase, PositiveInt
from toolkit.ir.dims import product

from .registry import LayerError, layer, layer_axis, pair, static_dim


class ConvolutionParams(ParamLayerBase):
    type: Literal["Convolution"]
    num_output: PositiveInt = Field(description="output channels (filters)")
    kernel_size: Pair = Field(description="the filter's height and width: one number for both, or [h, w]")
    stride: Pair = Field(1, description="the step between filter positions: one number for both axes, or [h, w]")
    pad: PadPair = Field(0, description="zeros added on each side of the image: one number for both axes, or [h, w]")
    dilation: Pair = Field(1, description="the spacing between the filter's taps (1: adjacent)")
    group: PositiveInt = Field(1, description="channel groups: input and output channels split into this many "
                                              "independent convolutions (both must divide by it)")
    bias_term: Bool = Field(True, description="add a learned bias to each output channel")
    # Caffe's channel axis: the axes before it are all batch ([A, B, C, H, W] with axis 2), the
    # two after it the image's
    axis: int = Field(1, description="the channel axis: the axes before it are batch axes, the two after it "
                                     "the image's")


def _with_channel_axis(lower):
    """Run a 4-d convolution lowering on an input whose channel axis is ``p.axis``: the leading
    axes are merged into one batch axis before, and split back after."""
    def lowered(p, ctx, bottoms):
        x, = bottoms
        if p.axis == 1:
            return lower(p, ctx, bottoms)
        axis = layer_axis(p.axis, x, ctx)
        if x.rank != axis + 3:
            raise LayerError(f"with axis {p.axis} the input must be [batch axes..., C, H, W] with {axis} batch "
                             f"axes, got {ctx.fmt(x)}", "axis")
        lead = tuple(x.shape[:axis])
        merged = ctx.b.reshape(x, (product(lead),) + tuple(x.shape[axis:]))
        y, = lower(p, ctx, [merged])
        return [ctx.b.reshape(y, lead + tuple(y.shape[1:]))]
    lowered.__doc__ = lower.__doc__
    return lowered


def _grouped_channels(p: ConvolutionParams, x, ctx) -> int:
    """The input's channel count, checked against the layer's groups (a 4-d input)."""
    if x.rank != 4:
        raise LayerError(f"{p.type} needs a 4-d input [N, C, H, W], got {ctx.fmt(x)}", "bottom")
    channels = static_dim(x.shape[1], "the input's channel dimension", "bottom")
    if channels % p.group:
        raise LayerError(f"the input's {channels} channels are not divisible by group {p.group}", "group")
    if p.num_output % p.group:
        raise LayerError(f"num_output {p.num_output} is not divisible by group {p.group}", "num_output")
    return channels


@layer(ConvolutionParams)
@_with_channel_axis
def lower_convolution(p: ConvolutionParams, ctx, bottoms):
    x, = bottoms
    channels = _grouped_channels(p, x, ctx)
    kh, kw = pair(p.kernel_size)
    shape = (p.num_output, channels // p.group, kh, kw)
    w = ctx.param("weight", shape, fan_in=channels // p.group * kh * kw, fan_out=p.num_output * kh * kw)
    inputs = [x, w]
    if p.bias_term:
        inputs.append(ctx.param("bias", (p.num_output,), default_filler={"type": "constant", "value": 0.0}))
    return [ctx.b.op("conv2d", *inputs, stride=pair(p.stride), pad=pair(p.pad), dilation=pair(p.dilation),
                     group=p.group)]


class DeconvolutionParams(ConvolutionParams):
    type: Literal["Deconvolution"]


@layer(DeconvolutionParams)
@_with_channel_axis
def lower_deconvolution(p: DeconvolutionParams, ctx, bottoms):
    """The transposed convolution (PyTorch's ConvTranspose2d, Caffe's Deconvolution): the
    gradient of a convolution for its input, run forward. Output size (H - 1) * stride - 2 pad
    + dilation (k - 1) + 1; weight [I, O/group, kH, kW]."""
    x, = bottoms
    channels = _grouped_channels(p, x, ctx)
    kh, kw = pair(p.kernel_size)
    (sh, sw), (ph, pw), (dh, dw) = pair(p.stride), pair(p.pad), pair(p.dilation)
    out_hw = []
    for axis, size, k, s, pd, d in ((2, x.shape[2], kh, sh, ph, dh), (3, x.shape[3], kw, sw, pw, dw)):
        size = static_dim(size, f"axis {axis} of the input {ctx.fmt(x)}", "bottom")
        out = (size - 1) * s - 2 * pd + d * (k - 1) + 1
        if out <= 0:
            raise LayerError(f"the output would have {out} positions on axis {axis}: pad {pd} is too large for "
                             f"kernel {k} and stride {s} on {size} inputs", "pad")
        out_hw.append(out)
    og = p.num_output // p.group
    w = ctx.param("weight", (channels, og, kh, kw), fan_in=og * kh * kw, fan_out=channels * kh * kw)
    b = ctx.b
    y = b.op("conv2d_grad_input", x, w, stride=(sh, sw), pad=(ph, pw), dilation=(dh, dw), group=p.group,
             input_hw=tuple(out_hw))
    if p.bias_term:
        bias = ctx.param("bias", (p.num_output,), default_filler={"type": "constant", "value": 0.0})
        y = b.add(y, b.reshape(bias, (p.num_output, 1, 1)))
    return [y]

class PoolingParams(LayerBase):
    type: Literal["Pooling"]
    pool: Literal["max", "ave"] = Field("max", description="the window's maximum, or its average")
    kernel_size: Optional[Pair] = Field(None, description="the window's height and width: one number for both, "
                                                          "or [h, w]; required unless global_pooling")
    stride: Pair = Field(1, description="the step between windows: one number for both axes, or [h, w]")
    pad: PadPair = Field(0, description="padding on each side of the image: one number for both axes, or [h, w]")
    global_pooling: Bool = Field(False, description="one window over the whole height and width")
    ceil_mode: Bool = Field(False, description="round the output size up, keeping a last partial window "
                                               "(Caffe's rule); off rounds it down")
    count_include_pad: Bool = Field(True, description="ave: padded positions count in each window's divisor")


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

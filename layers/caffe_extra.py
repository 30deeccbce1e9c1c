"""Caffe's remaining elementwise and normalisation layers: PReLU, Bias, Threshold, Clip, Swish and
MVN, each lowered to primitives (their gradients come from the primitives' rules; Threshold's
step has none, as in Caffe, whose Threshold layer has no backward)."""
from __future__ import annotations

from typing import ClassVar, Literal

from schemas.base import Bool, LayerBase, Number, ParamLayerBase

from .registry import LayerError, layer, layer_axis, need_float_input, static_dim
from .scale import ZERO, _scaled_axes


class PReLUParams(ParamLayerBase):
    """y = max(0, x) + a * min(0, x), a learned per channel (axis 1), or one for all with
    channel_shared; Caffe's and PyTorch's default a is 0.25."""
    type: Literal["PReLU"]
    channel_shared: Bool = False


@layer(PReLUParams)
def lower_prelu(p: PReLUParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "PReLU")
    b = ctx.b
    channels = 1 if p.channel_shared or x.rank < 2 else static_dim(x.shape[1], "the input's channels", "bottom")
    a = ctx.param("weight", (channels,), default_filler={"type": "constant", "value": 0.25},
                  filler_key="weight_filler")
    if x.rank >= 2 and not p.channel_shared:
        a = b.reshape(a, (channels,) + (1,) * (x.rank - 2))
    positive = b.op("relu", x)
    return [b.add(positive, b.mul(b.sub(x, positive), a))]


class BiasParams(ParamLayerBase):
    """y = x + bias, the bias spanning the input's axes [axis, axis + num_axes) (learned, Caffe's
    default filler 0) or the second bottom, broadcast over the others (Caffe's BiasLayer)."""
    type: Literal["Bias"]
    axis: int = 1
    num_axes: int = 1
    BOTTOMS: ClassVar = (1, 2)


@layer(BiasParams)
def lower_bias(p: BiasParams, ctx, bottoms):
    x = bottoms[0]
    need_float_input(x, "Bias")
    b = ctx.b
    if len(bottoms) == 2:
        bias = bottoms[1]
        axis = layer_axis(p.axis, x, ctx) if bias.rank else x.rank
        if tuple(x.shape[axis: axis + bias.rank]) != tuple(bias.shape):
            raise LayerError(f"the bias bottom {ctx.fmt(bias)} must have the shape of the input {ctx.fmt(x)}'s "
                             f"axes from axis {p.axis}", "bottom")
        shape = tuple(bias.shape)
    else:
        axis, count = _scaled_axes(p, x, ctx)
        shape = tuple(static_dim(d, f"axis {i} of the input {ctx.fmt(x)} (given a learned bias)", "axis")
                      for i, d in enumerate(x.shape[axis: axis + count], start=axis))
        bias = ctx.param("bias", shape, default_filler=ZERO, filler_key="bias_filler")
    trailing = (1,) * (x.rank - axis - len(shape))
    return [b.add(x, b.reshape(bias, shape + trailing) if shape else bias)]


class ThresholdParams(LayerBase):
    """y = 1 where x > threshold, else 0."""
    type: Literal["Threshold"]
    threshold: Number = 0.0


@layer(ThresholdParams)
def lower_threshold(p: ThresholdParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "Threshold")
    b = ctx.b
    # x > t is 1 - (t >= x)
    return [b.sub(b.scalar(1.0, x.dtype), b.op("ge_mask", b.scalar(float(p.threshold), x.dtype), x))]


class ClipParams(LayerBase):
    """y = min(max(x, min), max)."""
    type: Literal["Clip"]
    min: Number
    max: Number


@layer(ClipParams)
def lower_clip(p: ClipParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "Clip")
    if p.min > p.max:
        raise LayerError(f"min {p.min} is above max {p.max}", "min")
    b = ctx.b
    low = b.op("maximum", x, b.scalar(float(p.min), x.dtype))
    return [b.op("neg", b.op("maximum", b.op("neg", low), b.scalar(-float(p.max), x.dtype)))]


class SwishParams(LayerBase):
    """y = x * sigmoid(beta * x)."""
    type: Literal["Swish"]
    beta: Number = 1.0


@layer(SwishParams)
def lower_swish(p: SwishParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "Swish")
    b = ctx.b
    inner = x if p.beta == 1.0 else b.mul(x, b.scalar(float(p.beta), x.dtype))
    return [b.mul(x, b.op("sigmoid", inner))]


class MVNParams(LayerBase):
    """Caffe's mean-variance normalisation of each example: x minus its mean over the spatial
    axes (and the channels with across_channels), divided by (its standard deviation + eps) with
    normalize_variance, the deviation the biased one (Caffe divides by the count)."""
    type: Literal["MVN"]
    normalize_variance: Bool = True
    across_channels: Bool = False
    eps: Number = 1e-9


@layer(MVNParams)
def lower_mvn(p: MVNParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "MVN")
    if x.rank < 2:
        raise LayerError(f"MVN needs an input [N, C, ...], got {ctx.fmt(x)}", "bottom")
    b = ctx.b
    axes = tuple(range(1 if p.across_channels else 2, x.rank))
    if not axes:
        raise LayerError(f"MVN over the spatial axes needs some, the input is {ctx.fmt(x)}", "bottom")
    centred = b.sub(x, b.op("reduce_mean", x, axes=axes, keepdims=True))
    if not p.normalize_variance:
        return [centred]
    deviation = b.op("sqrt", b.op("reduce_mean", b.op("square", centred), axes=axes, keepdims=True))
    return [b.div(centred, b.add(deviation, b.scalar(float(p.eps), x.dtype)))]

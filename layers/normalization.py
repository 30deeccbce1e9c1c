"""BatchNorm (PyTorch semantics: biased batch variance to normalise, unbiased variance into the
running estimate, running = (1 - momentum) running + momentum batch), Dropout (inverted),
LayerNorm, and LRN (PyTorch's LocalResponseNorm)."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from schemas.base import Bool, LayerBase, Number, ParamLayerBase, PositiveInt
from toolkit.ir.dims import format_dim
from toolkit.ops.collective import row_mask
from toolkit.ops.reduce import reduced_count

from .registry import LayerError, layer, layer_axis, need_float_input, static_dim


class BatchNormParams(ParamLayerBase):
    type: Literal["BatchNorm"]
    eps: Annotated[float, Field(gt=0)] = Field(1e-5, description="added to the variance before its square root")
    momentum: Annotated[float, Field(ge=0, le=1)] = Field(
        0.1, description="the weight of each training batch's statistics in the running mean and variance")
    affine: Bool = Field(True, description="follow the normalisation by a learned scale and bias per channel")
    use_global_stats: Optional[Bool] = Field(
        None, description="normalise by the running mean and variance (default: in test and infer, not in train)")


@layer(BatchNormParams)
def lower_batch_norm(p: BatchNormParams, ctx, bottoms):
    x, = bottoms
    if x.rank < 2:
        raise LayerError(f"BatchNorm needs an input [N, C, ...], got {ctx.fmt(x)}", "bottom")
    b = ctx.b
    channels = static_dim(x.shape[1], "the channel dimension", "bottom")
    axes = tuple(i for i in range(x.rank) if i != 1)
    bshape = (1, channels) + (1,) * (x.rank - 2)          # broadcasts a [C] vector over x
    running_mean = ctx.state("running_mean", (channels,), 0.0)
    running_var = ctx.state("running_var", (channels,), 1.0)
    use_global = p.use_global_stats if p.use_global_stats is not None else ctx.phase != "train"

    if use_global:
        xc = b.sub(x, b.reshape(running_mean, bshape))
        inv_std = b.op("rsqrt", b.add(b.reshape(running_var, bshape), b.scalar(p.eps, x.dtype)))
    elif ctx.phase == "train" and ctx.sync_batchnorm:
        mean, xc, var, unbiased = _global_statistics(ctx, x, axes, channels)
        inv_std = b.op("rsqrt", b.add(var, b.scalar(p.eps, x.dtype)))
    else:
        mean = b.op("reduce_mean", x, axes=axes, keepdims=True)
        xc = b.sub(x, mean)
        var = b.op("reduce_mean", b.op("square", xc), axes=axes, keepdims=True)
        inv_std = b.op("rsqrt", b.add(var, b.scalar(p.eps, x.dtype)))
        if ctx.phase == "train":
            unbiased = b.op("bessel_correct", b.reshape(var, (channels,)), count=reduced_count(x.shape, axes))
    if ctx.phase == "train" and not use_global:
        m = p.momentum
        keep = b.scalar(1.0 - m, x.dtype)
        new_mean = b.add(b.mul(running_mean, keep), b.scale(b.reshape(mean, (channels,)), m))
        new_var = b.add(b.mul(running_var, keep), b.scale(unbiased, m))
        ctx.update("running_mean", new_mean)
        ctx.update("running_var", new_var)
    y = b.mul(xc, inv_std)
    if p.affine:
        one = {"type": "constant", "value": 1.0}
        zero = {"type": "constant", "value": 0.0}
        weight = ctx.param("weight", (channels,), default_filler=one, filler_key="weight_filler")
        bias = ctx.param("bias", (channels,), default_filler=zero, filler_key="bias_filler")
        y = b.add(b.mul(y, b.reshape(weight, bshape)), b.reshape(bias, bshape))
    return [y]


class DropoutParams(LayerBase):
    type: Literal["Dropout"]
    dropout_ratio: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.5, description="the probability that a value is zeroed in training (the others scaled by 1 / (1 - it))")


@layer(DropoutParams)
def lower_dropout(p: DropoutParams, ctx, bottoms):
    x, = bottoms
    if ctx.phase != "train" or p.dropout_ratio == 0:
        return [x]
    mask = ctx.b.op("dropout_mask", x, ratio=float(p.dropout_ratio))
    return [ctx.b.mul(x, mask)]


class LayerNormParams(ParamLayerBase):
    type: Literal["LayerNorm"]
    axis: int = -1
    eps: Number = 1e-5
    affine: Bool = True


@layer(LayerNormParams)
def lower_layer_norm(p: LayerNormParams, ctx, bottoms):
    """(x - mean) / sqrt(var + eps) over the axes from ``axis`` to the last (variance biased, as
    PyTorch), then weight and bias of those axes' shape."""
    x, = bottoms
    need_float_input(x, "LayerNorm")
    axis = layer_axis(p.axis, x, ctx)
    if p.eps < 0:
        raise LayerError(f"eps {p.eps} must not be negative", "eps")
    axes = tuple(range(axis, x.rank))
    shape = tuple(static_dim(d, f"axis {i} of the input {ctx.fmt(x)} (normalised, with weights)", "axis")
                  for i, d in enumerate(x.shape[axis:], start=axis))
    b = ctx.b
    mean = b.op("reduce_mean", x, axes=axes, keepdims=True)
    centred = b.sub(x, mean)
    var = b.op("reduce_mean", b.op("square", centred), axes=axes, keepdims=True)
    y = b.mul(centred, b.op("rsqrt", b.add(var, b.scalar(float(p.eps), x.dtype))))
    if p.affine:
        weight = ctx.param("weight", shape, default_filler={"type": "constant", "value": 1.0})
        bias = ctx.param("bias", shape, default_filler={"type": "constant", "value": 0.0})
        y = b.add(b.mul(y, weight), bias)
    return [y]


class LRNParams(LayerBase):
    type: Literal["LRN"]
    local_size: PositiveInt = 5
    alpha: Number = 1e-4
    beta: Number = 0.75
    k: Number = 1.0
    norm_region: Literal["across_channels", "within_channel"] = "across_channels"


@layer(LRNParams)
def lower_lrn(p: LRNParams, ctx, bottoms):
    """Across channels: x / (k + alpha/n * sum of x^2 over n neighbouring channels)^beta, the
    window centred with local_size//2 channels before and (local_size-1)//2 after (zeros past the
    ends), as PyTorch's LocalResponseNorm and Caffe's ACROSS_CHANNELS. A window reaching past the
    ends reads zeros there, so only the C - 1 channels on each side count: the slices summed are
    bounded by the channels, not by local_size (a local_size of 1e9 is the sum over all channels)."""
    x, = bottoms
    need_float_input(x, "LRN")
    if x.rank < 3:
        raise LayerError(f"LRN needs an input [N, C, ...] with at least one more axis, got {ctx.fmt(x)}", "bottom")
    if p.norm_region == "within_channel":
        return [_lrn_within_channel(p, ctx, x)]
    channels = static_dim(x.shape[1], "the input's channel dimension", "bottom")
    n = p.local_size
    b = ctx.b
    before, after = min(n // 2, channels - 1), min((n - 1) // 2, channels - 1)
    padded = b.op("pad_axis", b.op("square", x), axis=1, before=before, after=after)
    window = b.add_all([b.op("slice", padded, axis=1, start=j, stop=j + channels)
                        for j in range(before + after + 1)])
    base = b.add(b.mul(window, b.scalar(float(p.alpha) / n, x.dtype)), b.scalar(float(p.k), x.dtype))
    return [b.mul(x, b.op("power", base, exponent=-float(p.beta)))]


def _lrn_within_channel(p: LRNParams, ctx, x):
    """Caffe's WITHIN_CHANNEL: x / (k + alpha/n^2 * sum of x^2 over the n x n spatial window
    centred on each position)^beta, zeros past the edges (Caffe's average pooling of x^2 with pad
    (n-1)/2, which always divides by n^2). As across channels, the window is cut to what lies
    within the input: at most H - 1 rows and W - 1 columns on each side."""
    if x.rank != 4:
        raise LayerError(f"LRN within_channel needs an input [N, C, H, W], got {ctx.fmt(x)}", "bottom")
    n = p.local_size
    if n % 2 == 0:
        raise LayerError(f"LRN within_channel needs an odd local_size (Caffe's), got {n}", "local_size")
    b = ctx.b
    h = static_dim(x.shape[2], "the input's height", "bottom")
    w = static_dim(x.shape[3], "the input's width", "bottom")
    half = (n - 1) // 2
    padded = b.op("square", x)
    reach = {2: min(half, h - 1), 3: min(half, w - 1)}
    for axis in (2, 3):
        padded = b.op("pad_axis", padded, axis=axis, before=reach[axis], after=reach[axis])
    rows = b.add_all([b.op("slice", padded, axis=2, start=i, stop=i + h) for i in range(2 * reach[2] + 1)])
    window = b.add_all([b.op("slice", rows, axis=3, start=j, stop=j + w) for j in range(2 * reach[3] + 1)])
    base = b.add(b.mul(window, b.scalar(float(p.alpha) / (n * n), x.dtype)), b.scalar(float(p.k), x.dtype))
    return b.mul(x, b.op("power", base, exponent=-float(p.beta)))


def _global_statistics(ctx, x, axes, channels):
    """BatchNorm's batch mean and variance over every rank of a data-parallel job: sums of the
    rows (masked: a rank with no rows of its own runs a placeholder row of mask 0) and of the
    counts, all-reduced. Gradients flow through the all-reduce (its gradient is all-reduced too),
    so the backward pass is the global batch's as well. Returns (mean, x - mean, variance,
    unbiased variance as a [C] vector)."""
    b = ctx.b
    dtype = x.dtype
    mask = row_mask(ctx.graph, x)
    if mask.shape[0] != x.shape[0]:
        raise LayerError(f"sync_batchnorm needs the batch as the first axis of every BatchNorm input, "
                         f"as the first one has it ({format_dim(mask.shape[0])}); got {ctx.fmt(x)}", "bottom")
    per_row = 1
    for axis in axes[1:]:
        per_row *= static_dim(x.shape[axis], "a BatchNorm dimension under sync_batchnorm", "bottom")
    mshape = (x.shape[0],) + (1,) * (x.rank - 1)
    m = b.reshape(mask, mshape)
    count = b.op("allreduce_sum", b.scale(b.reduce_sum(mask, (0,)), float(per_row)))
    total = b.op("allreduce_sum", b.reduce_sum(b.mul(x, m), axes, keepdims=True))
    mean = b.div(total, count)
    xc = b.sub(x, mean)
    squares = b.op("allreduce_sum", b.reduce_sum(b.mul(b.op("square", xc), m), axes, keepdims=True))
    var = b.div(squares, count)
    one = b.scalar(1.0, dtype)
    unbiased = b.reshape(b.div(b.mul(var, count), b.sub(count, one)), (channels,))
    return mean, xc, var, unbiased

"""BatchNorm (PyTorch semantics: biased batch variance to normalise, unbiased variance into the
running estimate, running = (1 - momentum) running + momentum batch) and Dropout (inverted)."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from schemas.base import Bool, LayerBase, ParamLayerBase

from toolkit.ops.reduce import reduced_count

from .registry import LayerError, layer, static_dim


class BatchNormParams(ParamLayerBase):
    type: Literal["BatchNorm"]
    eps: Annotated[float, Field(gt=0)] = 1e-5
    momentum: Annotated[float, Field(ge=0, le=1)] = 0.1
    affine: Bool = True
    use_global_stats: Optional[Bool] = None


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
    else:
        mean = b.op("reduce_mean", x, axes=axes, keepdims=True)
        xc = b.sub(x, mean)
        var = b.op("reduce_mean", b.op("square", xc), axes=axes, keepdims=True)
        inv_std = b.op("rsqrt", b.add(var, b.scalar(p.eps, x.dtype)))
        if ctx.phase == "train":
            m = p.momentum
            keep = b.scalar(1.0 - m, x.dtype)
            new_mean = b.add(b.mul(running_mean, keep), b.scale(b.reshape(mean, (channels,)), m))
            unbiased = b.op("bessel_correct", b.reshape(var, (channels,)), count=reduced_count(x.shape, axes))
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
    dropout_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.5


@layer(DropoutParams)
def lower_dropout(p: DropoutParams, ctx, bottoms):
    x, = bottoms
    if ctx.phase != "train" or p.dropout_ratio == 0:
        return [x]
    mask = ctx.b.op("dropout_mask", x, ratio=float(p.dropout_ratio))
    return [ctx.b.mul(x, mask)]

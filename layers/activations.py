"""Elementwise activation layers and Softmax / LogSoftmax."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.base import LayerBase, Number

from .registry import layer, layer_axis


class ReLUParams(LayerBase):
    type: Literal["ReLU"]
    negative_slope: Number = Field(0.0, description="the slope below zero (leaky ReLU); 0: max(x, 0)")


@layer(ReLUParams)
def lower_relu(p: ReLUParams, ctx, bottoms):
    if p.negative_slope == 0:
        return [ctx.b.op("relu", bottoms[0])]
    return [ctx.b.op("leaky_relu", bottoms[0], alpha=float(p.negative_slope))]


class ELUParams(LayerBase):
    type: Literal["ELU"]
    alpha: Number = Field(1.0, description="the scale of the part below zero: alpha (exp(x) - 1) for x < 0")


@layer(ELUParams)
def lower_elu(p: ELUParams, ctx, bottoms):
    return [ctx.b.op("elu", bottoms[0], alpha=float(p.alpha))]


class GELUParams(LayerBase):
    type: Literal["GELU"]
    approximate: Literal["none", "tanh"] = "none"


@layer(GELUParams)
def lower_gelu(p: GELUParams, ctx, bottoms):
    return [ctx.b.op("gelu", bottoms[0], approximate=p.approximate)]


def _simple(type_name: str, op: str, doc: str):
    """A parameterless layer that is exactly one elementwise op."""
    model = type(f"{type_name}Params", (LayerBase,), {
        "__annotations__": {"type": Literal[type_name]}, "__doc__": doc, "__module__": __name__})

    def lower(p, ctx, bottoms):
        return [ctx.b.op(op, bottoms[0])]
    layer(model)(lower)
    return model


SigmoidParams = _simple("Sigmoid", "sigmoid", "1 / (1 + exp(-x))")
TanHParams = _simple("TanH", "tanh", "tanh(x)")
SoftplusParams = _simple("Softplus", "softplus", "log(1 + exp(x)), linear above 20 as PyTorch")
AbsValParams = _simple("AbsVal", "abs", "|x|")
class ExpParams(LayerBase):
    """base^(shift + scale * x), as Caffe's Exp; base -1 is e."""
    type: Literal["Exp"]
    base: Number = -1.0
    scale: Number = 1.0
    shift: Number = 0.0


class LogParams(LayerBase):
    """log_base(shift + scale * x), as Caffe's Log; base -1 is e."""
    type: Literal["Log"]
    base: Number = -1.0
    scale: Number = 1.0
    shift: Number = 0.0


def _ln_base(p) -> float:
    from .registry import LayerError
    if p.base == -1.0:
        return 1.0
    if p.base <= 0:
        raise LayerError(f"base must be positive, or -1 for e, got {p.base}", "base")
    import math
    return math.log(p.base)


def _affine(b, x, scale: float, shift: float):
    if scale != 1.0:
        x = b.mul(x, b.scalar(scale, x.dtype))
    if shift != 0.0:
        x = b.add(x, b.scalar(shift, x.dtype))
    return x


@layer(ExpParams)
def lower_exp(p: ExpParams, ctx, bottoms):
    ln = _ln_base(p)
    b = ctx.b
    return [b.op("exp", _affine(b, bottoms[0], float(p.scale) * ln, float(p.shift) * ln))]


@layer(LogParams)
def lower_log(p: LogParams, ctx, bottoms):
    ln = _ln_base(p)
    b = ctx.b
    y = b.op("log", _affine(b, bottoms[0], float(p.scale), float(p.shift)))
    return [y if ln == 1.0 else b.mul(y, b.scalar(1.0 / ln, y.dtype))]


class SoftmaxParams(LayerBase):
    type: Literal["Softmax"]
    axis: int = Field(1, description="the axis whose values are made to sum to 1")


class LogSoftmaxParams(LayerBase):
    type: Literal["LogSoftmax"]
    axis: int = Field(1, description="the axis over which the softmax is taken")


def _axis_of(p, x, ctx) -> int:
    return layer_axis(p.axis, x, ctx)


@layer(SoftmaxParams)
def lower_softmax(p: SoftmaxParams, ctx, bottoms):
    return [ctx.b.op("softmax", bottoms[0], axis=_axis_of(p, bottoms[0], ctx))]


@layer(LogSoftmaxParams)
def lower_log_softmax(p: LogSoftmaxParams, ctx, bottoms):
    return [ctx.b.op("log_softmax", bottoms[0], axis=_axis_of(p, bottoms[0], ctx))]

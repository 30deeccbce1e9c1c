"""Elementwise activation layers and Softmax / LogSoftmax."""
from __future__ import annotations

from typing import Literal

from schemas.base import LayerBase, Number

from .registry import layer, layer_axis


class ReLUParams(LayerBase):
    type: Literal["ReLU"]
    negative_slope: Number = 0.0


@layer(ReLUParams)
def lower_relu(p: ReLUParams, ctx, bottoms):
    if p.negative_slope == 0:
        return [ctx.b.op("relu", bottoms[0])]
    return [ctx.b.op("leaky_relu", bottoms[0], alpha=float(p.negative_slope))]


class ELUParams(LayerBase):
    type: Literal["ELU"]
    alpha: Number = 1.0


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
ExpParams = _simple("Exp", "exp", "exp(x)")
LogParams = _simple("Log", "log", "natural log")


class SoftmaxParams(LayerBase):
    type: Literal["Softmax"]
    axis: int = 1


class LogSoftmaxParams(LayerBase):
    type: Literal["LogSoftmax"]
    axis: int = 1


def _axis_of(p, x, ctx) -> int:
    return layer_axis(p.axis, x, ctx)


@layer(SoftmaxParams)
def lower_softmax(p: SoftmaxParams, ctx, bottoms):
    return [ctx.b.op("softmax", bottoms[0], axis=_axis_of(p, bottoms[0], ctx))]


@layer(LogSoftmaxParams)
def lower_log_softmax(p: LogSoftmaxParams, ctx, bottoms):
    return [ctx.b.op("log_softmax", bottoms[0], axis=_axis_of(p, bottoms[0], ctx))]

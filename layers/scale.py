"""Scale (Caffe's ScaleLayer): y = x * scale (+ bias), the scale spanning the input's axes
[axis, axis + k) and broadcast over the others.

With one bottom the scale is a learned ``weight`` of the input's axes [axis, axis + num_axes);
with two the second bottom is the scale and its shape decides k. ``bias_term`` adds a learned
``bias`` of the scale's shape. Lowered to reshape / mul / add, so the gradients (the scale's
summed over the broadcast axes) come from those ops' rules.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from schemas.base import Bool, ParamLayerBase
from toolkit.ir.dims import format_dim

from .registry import LayerError, layer, layer_axis, need_float_input, static_dim


class ScaleParams(ParamLayerBase):
    type: Literal["Scale"]
    axis: int = 1
    num_axes: int = 1          # -1: every axis from axis on; 0: a scalar scale (as Caffe)
    bias_term: Bool = False
    BOTTOMS: ClassVar = (1, 2)


# Caffe fills an unset scale with 1 (the identity) and an unset bias with 0.
ONE = {"type": "constant", "value": 1.0}
ZERO = {"type": "constant", "value": 0.0}


def _scaled_axes(p: ScaleParams, x, ctx) -> tuple[int, int]:
    """The first scaled axis and how many there are, for a learned scale (one bottom)."""
    axis = layer_axis(p.axis, x, ctx)
    if p.num_axes < -1:
        raise LayerError(f"num_axes {p.num_axes} must be -1 (every axis from axis on) or at least 0",
                         "num_axes")
    count = x.rank - axis if p.num_axes == -1 else p.num_axes
    if axis + count > x.rank:
        raise LayerError(f"num_axes {p.num_axes} from axis {p.axis} runs past the input {ctx.fmt(x)}, "
                         f"which has {x.rank} axes", "num_axes")
    return axis, count


def _given_scale_axis(p: ScaleParams, x, s, ctx) -> int:
    """Where the second bottom's axes sit in the first's; its shape must match them exactly."""
    if s.dtype != x.dtype:
        raise LayerError(f"the scale bottom is {s.dtype}, the input {x.dtype}: they must be the same "
                         "float type", "bottom")
    if s.rank == 0:
        return x.rank            # a scalar scale: Caffe ignores axis, the scale covers no axis
    axis = layer_axis(p.axis, x, ctx)
    if axis + s.rank > x.rank:
        raise LayerError(f"the scale bottom {ctx.fmt(s)} has {s.rank} axes, but the input {ctx.fmt(x)} has "
                         f"only {x.rank - axis} from axis {p.axis}", "bottom")
    if tuple(x.shape[axis: axis + s.rank]) != tuple(s.shape):
        covered = "[" + ", ".join(format_dim(d) for d in x.shape[axis: axis + s.rank]) + "]"
        raise LayerError(f"the scale bottom {ctx.fmt(s)} must have the shape of the input {ctx.fmt(x)}'s "
                         f"axes from axis {p.axis}, which are {covered}", "bottom")
    return axis


def _fans(shape: tuple) -> tuple[int, int]:
    """Caffe's fans of a blob, for a xavier or msra weight_filler: count / shape[0] in,
    count / shape[1] out (count itself for fewer than two axes)."""
    count = 1
    for d in shape:
        count *= d
    fan_in = count // shape[0] if shape else 1
    fan_out = count // shape[1] if len(shape) > 1 else count
    return fan_in, fan_out


@layer(ScaleParams)
def lower_scale(p: ScaleParams, ctx, bottoms):
    x = bottoms[0]
    need_float_input(x, "Scale")
    b = ctx.b
    if len(bottoms) == 2:
        scale = bottoms[1]
        axis = _given_scale_axis(p, x, scale, ctx)
        shape = tuple(scale.shape)
    else:
        axis, count = _scaled_axes(p, x, ctx)
        shape = tuple(static_dim(d, f"axis {i} of the input {ctx.fmt(x)} (scaled by a learned weight)",
                                 "axis")
                      for i, d in enumerate(x.shape[axis: axis + count], start=axis))
        scale = ctx.param("weight", shape, *_fans(shape), default_filler=ONE, filler_key="weight_filler")
    # trailing 1s line the scale up with axis; numpy broadcasting covers the leading axes
    trailing = (1,) * (x.rank - axis - len(shape))
    y = b.mul(x, b.reshape(scale, shape + trailing) if shape else scale)
    if p.bias_term:
        # only a second bottom can make the scale's shape symbolic; a learned bias cannot follow it
        bias_shape = tuple(static_dim(d, f"dimension {i} of the bias (shaped like the scale "
                                         f"{ctx.fmt(scale)})", "bias_term")
                           for i, d in enumerate(shape))
        bias = ctx.param("bias", bias_shape, default_filler=ZERO, filler_key="bias_filler")
        y = b.add(y, b.reshape(bias, bias_shape + trailing) if bias_shape else bias)
    return [y]

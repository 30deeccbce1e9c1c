"""Layers that move data: Concat, Slice, Eltwise, Flatten, Reshape."""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field

from schemas.base import LayerBase, Number
from toolkit.ir.dims import DimError, product

from .registry import LayerError, layer, layer_axis


class ConcatParams(LayerBase):
    type: Literal["Concat"]
    axis: int = Field(1, description="the axis the bottoms are joined along (their other axes must match)")
    BOTTOMS: ClassVar = (1, None)


@layer(ConcatParams)
def lower_concat(p: ConcatParams, ctx, bottoms):
    if len(bottoms) == 1:
        return [bottoms[0]]
    return [ctx.b.op("concat", *bottoms, axis=layer_axis(p.axis, bottoms[0], ctx))]


class SliceParams(LayerBase):
    type: Literal["Slice"]
    axis: int = Field(1, description="the axis cut into pieces, one per top")
    slice_point: Optional[list[int]] = Field(None, description="the increasing positions where each piece after "
                                                               "the first starts (one fewer than the tops); "
                                                               "without it, equal pieces")
    TOPS: ClassVar = (1, None)


@layer(SliceParams)
def lower_slice(p: SliceParams, ctx, bottoms):
    x, = bottoms
    axis = layer_axis(p.axis, x, ctx)
    size = x.shape[axis]
    n_tops = len(p.tops)
    if p.slice_point is not None:
        points = list(p.slice_point)
        if len(points) != n_tops - 1:
            raise LayerError(f"{len(points)} slice_point values make {len(points) + 1} pieces, "
                             f"but the layer has {n_tops} tops", "slice_point")
        bounds = [0] + points + [size]
        for lo, hi in zip(bounds, bounds[1:]):
            try:
                if not lo < hi:
                    raise LayerError(f"slice_point must increase within the axis size {size}: {points}",
                                     "slice_point")
            except DimError:
                raise LayerError(f"slice_point needs a fixed size of axis {axis}, got {size}", "slice_point")
    else:
        try:
            piece = size // n_tops
        except DimError:
            raise LayerError(f"axis {axis} of size {size} does not split into {n_tops} equal parts", "top")
        if isinstance(size, int) and size % n_tops:
            raise LayerError(f"axis {axis} of size {size} does not split into {n_tops} equal parts", "top")
        bounds = [piece * i for i in range(n_tops)] + [size]
    return [ctx.b.op("slice", x, axis=axis, start=lo, stop=hi) for lo, hi in zip(bounds, bounds[1:])]


class EltwiseParams(LayerBase):
    type: Literal["Eltwise"]
    operation: Literal["sum", "prod", "max"] = Field("sum", description="how the bottoms, all of one shape, "
                                                                        "are combined element by element")
    coeff: Optional[list[Number]] = Field(None, description="sum only: one factor per bottom (default all 1)")
    BOTTOMS: ClassVar = (2, None)


@layer(EltwiseParams)
def lower_eltwise(p: EltwiseParams, ctx, bottoms):
    b = ctx.b
    for x in bottoms[1:]:
        if tuple(x.shape) != tuple(bottoms[0].shape):
            raise LayerError("Eltwise needs bottoms of one shape, got "
                             + ", ".join(ctx.fmt(v) for v in bottoms), "bottom")
    if p.coeff is not None and p.operation != "sum":
        raise LayerError("coeff applies only to operation: sum", "coeff")
    if p.coeff is not None and len(p.coeff) != len(bottoms):
        raise LayerError(f"{len(p.coeff)} coeff values for {len(bottoms)} bottoms", "coeff")
    if p.operation == "sum":
        coeff = p.coeff or [1.0] * len(bottoms)
        return [b.add_all([b.scale(x, float(c)) for x, c in zip(bottoms, coeff)])]
    op = "mul" if p.operation == "prod" else "maximum"
    out = bottoms[0]
    for x in bottoms[1:]:
        out = b.op(op, out, x)
    return [out]


class FlattenParams(LayerBase):
    type: Literal["Flatten"]
    axis: int = Field(1, description="the first axis merged into one")
    end_axis: int = Field(-1, description="the last axis merged (negative: counted from the end)")


@layer(FlattenParams)
def lower_flatten(p: FlattenParams, ctx, bottoms):
    x, = bottoms
    start = layer_axis(p.axis, x, ctx)
    end = layer_axis(p.end_axis, x, ctx, "end_axis")
    if end < start:
        raise LayerError(f"end_axis {p.end_axis} comes before axis {p.axis}", "end_axis")
    shape = tuple(x.shape[:start]) + (product(x.shape[start: end + 1]),) + tuple(x.shape[end + 1:])
    return [ctx.b.reshape(x, shape)]


class ReshapeParams(LayerBase):
    """Caffe's Reshape: ``shape`` replaces the input's axes [axis, axis + num_axes) (num_axes -1:
    every axis from axis on), 0 copying the replaced axis at its place, -1 inferred."""
    type: Literal["Reshape"]
    shape: list[int] = Field(description="the new sizes of the axes replaced: 0 keeps that axis's size, -1 "
                                         "(at most once) is inferred")
    axis: int = Field(0, description="the first axis replaced")
    num_axes: int = Field(-1, description="how many axes are replaced (-1: every axis from axis on)")


@layer(ReshapeParams)
def lower_reshape(p: ReshapeParams, ctx, bottoms):
    x, = bottoms
    dims = list(p.shape)
    if dims.count(-1) > 1:
        raise LayerError("at most one -1 in shape", "shape")
    # axis may be rank (the new axes go at the end); negative counts from rank + 1, as Caffe
    start = p.axis if p.axis >= 0 else x.rank + 1 + p.axis
    if not 0 <= start <= x.rank:
        raise LayerError(f"axis {p.axis} is out of range for the input {ctx.fmt(x)}", "axis")
    if p.num_axes < -1:
        raise LayerError(f"num_axes {p.num_axes} must be -1 (every axis from axis on) or at least 0", "num_axes")
    end = x.rank if p.num_axes == -1 else start + p.num_axes
    if end > x.rank:
        raise LayerError(f"num_axes {p.num_axes} from axis {p.axis} runs past the input {ctx.fmt(x)}", "num_axes")
    block = tuple(x.shape[start:end])
    out = []
    for i, d in enumerate(dims):
        if d == 0:
            if i >= len(block):
                raise LayerError(f"shape[{i}] is 0 (copy) but the input {ctx.fmt(x)} has no axis {start + i} "
                                 "to copy", "shape")
            out.append(block[i])
        elif d < -1:
            raise LayerError(f"shape[{i}] = {d}: dimensions are positive, 0 (copy) or -1 (infer)", "shape")
        else:
            out.append(d)
    count = product(block) if block else 1
    if -1 in dims:
        known = product(d for d in out if not (isinstance(d, int) and d == -1))
        try:
            inferred = count // known
            if isinstance(inferred, int) and inferred * known != count:
                raise DimError("not divisible")
        except DimError:
            raise LayerError(f"cannot reshape {ctx.fmt(x)} to {dims}: the size does not divide", "shape")
        out[dims.index(-1)] = inferred
    if product(out) != count:
        raise LayerError(f"cannot reshape {ctx.fmt(x)} to {dims}: the element counts differ", "shape")
    return [ctx.b.reshape(x, tuple(x.shape[:start]) + tuple(out) + tuple(x.shape[end:]))]

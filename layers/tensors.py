"""Layers that move, combine or reduce tensors without weights: MatMul, Permute, Tile, Crop, Pad,
Reduction, ArgMax and Power. Each is lowered to primitive ops (matmul, transpose, concat, slice,
pad_axis, reductions, topk, power), so their gradients come from those ops' rules.
"""
from __future__ import annotations

from typing import ClassVar, Literal, Union

from pydantic import Field
from typing_extensions import Annotated

from schemas.base import Bool, LayerBase, NonNegInt, Number, PositiveInt

from .registry import LayerError, layer, layer_axis, need_float_input, static_dim


# -- MatMul, Permute ---------------------------------------------------------------------------
class MatMulParams(LayerBase):
    type: Literal["MatMul"]
    transpose_a: Bool = False
    transpose_b: Bool = False
    BOTTOMS: ClassVar = (2, 2)


@layer(MatMulParams)
def lower_matmul(p: MatMulParams, ctx, bottoms):
    a, b_ = bottoms
    for v in (a, b_):
        need_float_input(v, "MatMul")
        if v.rank < 2:
            raise LayerError(f"MatMul needs matrices (2 or more axes), got {ctx.fmt(v)}", "bottom")
    if a.dtype != b_.dtype:
        raise LayerError(f"MatMul's bottoms are {a.dtype} and {b_.dtype}: they must be the same type", "bottom")
    return [ctx.b.op("matmul", a, b_, trans_a=p.transpose_a, trans_b=p.transpose_b)]


class PermuteParams(LayerBase):
    type: Literal["Permute"]
    order: list[int]


@layer(PermuteParams)
def lower_permute(p: PermuteParams, ctx, bottoms):
    x, = bottoms
    if sorted(p.order) != list(range(x.rank)):
        raise LayerError(f"order {p.order} is not a permutation of the input {ctx.fmt(x)}'s {x.rank} axes "
                         f"(0 to {x.rank - 1}, each once)", "order")
    return [ctx.b.op("transpose", x, perm=tuple(p.order))]


# -- Tile, Crop, Pad ---------------------------------------------------------------------------
class TileParams(LayerBase):
    type: Literal["Tile"]
    axis: int = 1
    tiles: PositiveInt


@layer(TileParams)
def lower_tile(p: TileParams, ctx, bottoms):
    """Caffe's Tile: the block from ``axis`` on, repeated ``tiles`` times along ``axis``: a new
    axis before it broadcast to ``tiles`` and merged into it, so the graph is three nodes however
    many the tiles (a concat of ``tiles`` copies built a billion inputs for tiles: 1e9)."""
    x, = bottoms
    axis = layer_axis(p.axis, x, ctx)
    if p.tiles == 1:
        return [x]
    b, shape = ctx.b, list(x.shape)
    spread = b.op("broadcast_to", b.reshape(x, shape[:axis] + [1] + shape[axis:]),
                  shape=tuple(shape[:axis] + [p.tiles] + shape[axis:]))
    return [b.reshape(spread, shape[:axis] + [shape[axis] * p.tiles] + shape[axis + 1:])]


class CropParams(LayerBase):
    type: Literal["Crop"]
    axis: int = 2
    offset: Union[NonNegInt, list[NonNegInt]] = 0
    BOTTOMS: ClassVar = (2, 2)


@layer(CropParams)
def lower_crop(p: CropParams, ctx, bottoms):
    """Caffe's Crop: every axis from ``axis`` on cut to the reference's size, from ``offset``
    (one for all, or one per cropped axis)."""
    x, ref = bottoms
    if ref.rank != x.rank:
        raise LayerError(f"Crop's reference {ctx.fmt(ref)} must have the input {ctx.fmt(x)}'s {x.rank} axes",
                         "bottom")
    axis = layer_axis(p.axis, x, ctx)
    axes = list(range(axis, x.rank))
    offsets = [p.offset] * len(axes) if isinstance(p.offset, int) else list(p.offset)
    if len(offsets) != len(axes):
        raise LayerError(f"{len(offsets)} offsets given for the {len(axes)} axes cropped (from axis {axis})",
                         "offset")
    y = x
    for a, off in zip(axes, offsets):
        size = static_dim(x.shape[a], f"axis {a} of the input {ctx.fmt(x)}", "bottom")
        want = static_dim(ref.shape[a], f"axis {a} of the reference {ctx.fmt(ref)}", "bottom")
        if off + want > size:
            raise LayerError(f"axis {a}: offset {off} + the reference's {want} is past the input's {size}",
                             "offset")
        if want != size:
            y = ctx.b.op("slice", y, axis=a, start=off, stop=off + want)
    return [y]


class PadParams(LayerBase):
    type: Literal["Pad"]
    pads: list[Annotated[list[NonNegInt], Field(min_length=2, max_length=2)]]
    mode: Literal["constant", "reflect", "replicate"] = "constant"
    value: Number = 0.0


@layer(PadParams)
def lower_pad(p: PadParams, ctx, bottoms):
    """[before, after] per spatial axis (every axis after N and C, in order), as F.pad with the
    pairs given first-axis first. Reflect mirrors without repeating the edge (PyTorch's rule);
    replicate repeats the edge."""
    x, = bottoms
    need_float_input(x, "Pad")
    spatial = x.rank - 2
    if len(p.pads) != spatial:
        raise LayerError(f"{len(p.pads)} [before, after] pairs given, but the input {ctx.fmt(x)} has "
                         f"{spatial} spatial axes (after N and C)", "pads")
    b = ctx.b
    y = x
    for a, (before, after) in enumerate(p.pads, start=2):
        if not before and not after:
            continue
        size = static_dim(y.shape[a], f"axis {a} of the input", "bottom")
        if p.mode == "reflect" and max(before, after) >= size:
            raise LayerError(f"reflect padding of {max(before, after)} needs more than {size} entries on axis {a}",
                             "pads")
        if p.mode == "constant" and p.value == 0:
            y = b.op("pad_axis", y, axis=a, before=before, after=after)
            continue

        def one(i):
            return b.op("slice", y, axis=a, start=i, stop=i + 1)
        if p.mode == "constant":
            def strip(n):
                shape = list(y.shape)
                shape[a] = n
                return b.op("broadcast_to", b.scalar(float(p.value), y.dtype), shape=tuple(shape))
            left, right = ([strip(before)] if before else []), ([strip(after)] if after else [])
        elif p.mode == "reflect":
            left = [one(i) for i in range(before, 0, -1)]
            right = [one(size - 2 - i) for i in range(after)]
        else:
            left, right = [one(0)] * before, [one(size - 1)] * after
        y = b.op("concat", *left, y, *right, axis=a)
    return [y]


# -- Reduction, ArgMax, Power ------------------------------------------------------------------
class ReductionParams(LayerBase):
    type: Literal["Reduction"]
    operation: Literal["sum", "asum", "sumsq", "mean"] = "sum"
    axis: int = 0
    coeff: float = 1.0            # the result scaled by it (Caffe's)


@layer(ReductionParams)
def lower_reduction(p: ReductionParams, ctx, bottoms):
    """Caffe's Reduction: every axis from ``axis`` on reduced; the top is [d0 .. d(axis-1)]."""
    x, = bottoms
    need_float_input(x, "Reduction")
    axis = layer_axis(p.axis, x, ctx) if x.rank else 0
    axes = tuple(range(axis, x.rank))
    b = ctx.b
    valid = ctx.real_mask(x, axes)
    if valid is not None:
        # a padded dimension (buckets over T): the padding adds nothing, and a mean divides by the
        # number of real positions
        x = b.op("select", valid, x, b.scalar(0.0, x.dtype))
        if p.operation == "mean":
            count = b.reduce_sum(b.op("broadcast_to", valid, shape=tuple(x.shape)), axes)
            out = b.op("div", b.reduce_sum(x, axes), count)
            return [out if p.coeff == 1.0 else b.scale(out, p.coeff)]
    if p.operation == "mean":
        out = b.op("reduce_mean", x, axes=axes, keepdims=False)
    else:
        source = {"sum": x, "asum": b.op("abs", x), "sumsq": b.op("square", x)}[p.operation]
        out = b.reduce_sum(source, axes)
    return [out if p.coeff == 1.0 else b.scale(out, p.coeff)]


class ArgMaxParams(LayerBase):
    type: Literal["ArgMax"]
    axis: int = 1
    top_k: PositiveInt = 1
    out_max_val: Bool = False


@layer(ArgMaxParams)
def lower_argmax(p: ArgMaxParams, ctx, bottoms):
    """The top_k indices along ``axis`` (largest first, as floats: Caffe's ArgMax), or their
    values with out_max_val. No gradient flows through it (Caffe defines none)."""
    x, = bottoms
    need_float_input(x, "ArgMax")
    axis = layer_axis(p.axis, x, ctx)
    size = x.shape[axis]
    if isinstance(size, int) and p.top_k > size:
        raise LayerError(f"top_k {p.top_k} is more than the {size} entries along axis {axis} of {ctx.fmt(x)}",
                         "top_k")
    return [ctx.b.op("topk", x, axis=axis, k=p.top_k, values=p.out_max_val)]


class PowerParams(LayerBase):
    type: Literal["Power"]
    power: Number = 1.0
    scale: Number = 1.0
    shift: Number = 0.0


@layer(PowerParams)
def lower_power(p: PowerParams, ctx, bottoms):
    """(shift + scale * x) ** power, each step only where it changes something."""
    x, = bottoms
    need_float_input(x, "Power")
    b = ctx.b
    y = x
    if p.scale != 1:
        y = b.mul(y, b.scalar(float(p.scale), x.dtype))
    if p.shift != 0:
        y = b.add(y, b.scalar(float(p.shift), x.dtype))
    if p.power != 1:
        y = b.op("power", y, exponent=float(p.power))
    return [y]

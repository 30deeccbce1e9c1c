"""Caffe's layers that rearrange or combine values: Concat, Eltwise, Reshape, Flatten, Slice,
Crop, Tile, ArgMax and Reduction."""
from __future__ import annotations

from .base import converts, converts_by_copying, copy_set, enum_name, sub_message


@converts("Concat")
def _concat(layer, out, ctx):
    p = sub_message(layer, "concat_param")
    axis = p.value("axis", p.value("concat_dim", 1))
    if axis != 1:
        out["axis"] = axis
    return [out]


@converts("Eltwise")
def _eltwise(layer, out, ctx):
    p = sub_message(layer, "eltwise_param")
    out["operation"] = enum_name(p.value("operation", "SUM")).lower()
    coeff = p.values("coeff")
    if coeff:
        out["coeff"] = coeff
    return [out]


@converts("Reshape")
def _reshape(layer, out, ctx):
    p = sub_message(layer, "reshape_param")
    shape = p.get("shape")
    out["shape"] = shape.value.values("dim") if shape is not None else []
    copy_set(p, out, (("axis", 0), ("num_axes", -1)))
    return [out]


@converts("Slice")
def _slice(layer, out, ctx):
    p = sub_message(layer, "slice_param")
    axis = p.value("axis", p.value("slice_dim", 1))
    if axis != 1:
        out["axis"] = axis
    points = p.values("slice_point")
    if points:
        out["slice_point"] = points
    return [out]


@converts("Crop")
def _crop(layer, out, ctx):
    p = sub_message(layer, "crop_param")
    out["axis"] = p.value("axis", 2)
    offsets = p.values("offset")
    if offsets:
        out["offset"] = offsets if len(offsets) > 1 else offsets[0]
    return [out]


@converts("ArgMax")
def _argmax(layer, out, ctx):
    p = sub_message(layer, "argmax_param")
    for key, default in (("top_k", 1), ("out_max_val", "false")):
        if str(p.value(key, default)) != str(default):
            out[key] = p.value(key) if key == "top_k" else True
    if p.get("axis") is not None:
        out["axis"] = p.value("axis")
    return [out]


@converts("Reduction")
def _reduction(layer, out, ctx):
    p = sub_message(layer, "reduction_param")
    out["operation"] = enum_name(p.value("operation", "SUM")).lower()
    if p.value("axis", 0) != 0:
        out["axis"] = p.value("axis")
    if p.value("coeff", 1.0) != 1.0:
        out["coeff"] = p.value("coeff")
    return [out]


@converts("Tile")
def _tile(layer, out, ctx):
    p = sub_message(layer, "tile_param")
    out["axis"] = p.value("axis", 1)
    out["tiles"] = p.value("tiles", 1)
    return [out]


converts_by_copying("Flatten", "flatten_param", (("axis", 1), ("end_axis", -1)))

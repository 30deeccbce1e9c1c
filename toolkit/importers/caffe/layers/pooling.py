"""Caffe's pooling: Pooling (max or average, global or windowed) and SPP."""
from __future__ import annotations

from .base import converts, enum_name, size_pair, sub_message


@converts("Pooling")
def _pooling(layer, out, ctx):
    p = sub_message(layer, "pooling_param")
    pool = enum_name(p.value("pool", "MAX"))
    if pool not in ("MAX", "AVE"):
        ctx.error(f"pooling_param.pool {pool} has no counterpart here (MAX, AVE)", p.get("pool").loc)
    out["pool"] = "ave" if pool == "AVE" else "max"
    if str(p.value("global_pooling", "false")) == "true":
        out["global_pooling"] = True
    else:
        out["kernel_size"] = size_pair(p, "kernel_size", "kernel_h", "kernel_w", None)
        stride = size_pair(p, "stride", "stride_h", "stride_w", 1)
        pad = size_pair(p, "pad", "pad_h", "pad_w", 0)
        if stride != 1:
            out["stride"] = stride
        if pad != 0:
            out["pad"] = pad
        # Caffe rounds the output size up unless round_mode is FLOOR; its average divides by
        # the window within the padded input, as count_include_pad does
        out["ceil_mode"] = enum_name(p.value("round_mode", "CEIL")) == "CEIL"
    return [out]


@converts("SPP")
def _spp(layer, out, ctx):
    p = sub_message(layer, "spp_param")
    out["pyramid_height"] = p.value("pyramid_height")
    pool = enum_name(p.value("pool", "MAX"))
    if pool not in ("MAX", "AVE"):
        ctx.error(f"spp_param.pool {pool} has no counterpart here (MAX, AVE)", p.get("pool").loc)
    elif pool == "AVE":
        out["pool"] = "ave"
    return [out]

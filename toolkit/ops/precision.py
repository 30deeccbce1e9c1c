"""Ops of mixed-precision training: the finiteness check of the gradients, and the rounding
that stands in for a half-precision type where values are stored as float32 (the CPU).

- ``all_finite(x, y, ...)``: a 0-d float32, 1 when every element of every input is finite.
  The loss-scaled train step keeps its old weights (``select``) when it is 0.
- ``round_precision(x, dtype=float16|bfloat16)``: x rounded to the nearest value of ``dtype``
  (ties to even; beyond its range, inf), still stored in x's dtype. A CPU plan casts to and from
  a half type through it, so that it overflows and loses precision exactly where a device with
  real half-precision storage would.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import LOW_PRECISION, TensorType
from .base import OpDef, ShapeError, register
from .rules import need_float


def _all_finite_infer(types, attrs):
    if not types:
        raise ShapeError("all_finite needs at least one input")
    for t in types:
        need_float(t)
    return [TensorType((), "float32")]


def all_finite(*arrays, out=None):
    """Written against numpy's dispatch, so that it runs on CuPy arrays without a host read."""
    flag = np.isfinite(arrays[0]).all()
    for x in arrays[1:]:
        flag = np.logical_and(flag, np.isfinite(x).all())
    if out is None:
        return np.asarray(flag, dtype=np.float32)
    out[...] = flag
    return out


register(OpDef("all_finite", _all_finite_infer, all_finite, flops=lambda i, o, a: sum(t.numel for t in i),
               doc="1.0 when every input element is finite, else 0.0"))


def _round_infer(types, attrs):
    need_float(types[0])
    if attrs["dtype"] not in LOW_PRECISION:
        raise ShapeError(f"round_precision rounds to {' or '.join(LOW_PRECISION)}, not {attrs['dtype']}")
    return [types[0]]


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (its top 16 bits), ties to even, as float32; nan stays nan."""
    x = x.astype(np.float32)                     # a copy, numpy's or CuPy's: the view needs its own
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))
    return np.where(np.isnan(x), x, rounded.view(np.float32))


def round_precision(x, dtype: str, out=None):
    # x may be a CuPy array (the GPU runs this kernel through numpy's dispatch): no np.asarray
    if not hasattr(x, "astype"):
        x = np.asarray(x)
    if dtype == "float16":
        with np.errstate(over="ignore"):          # beyond float16's range is inf, as on a device
            rounded = x.astype(np.float16).astype(x.dtype)
    else:
        rounded = round_to_bfloat16(x).astype(x.dtype)
    if out is None:
        return rounded
    np.copyto(out, rounded)
    return out


# no gradient rule: the op is made after the backward pass exists (passes/precision.py)
register(OpDef("round_precision", _round_infer, round_precision, None, flops=lambda i, o, a: o[0].numel,
               batch_rows=True, doc="round to float16 or bfloat16, stored in the input's dtype"))

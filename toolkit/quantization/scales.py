"""A tensor's scale and zero point from its calibrated range, as ONNX Runtime's
``compute_scale_zp`` makes them (onnxruntime/quantization/quant_utils.py), so that a model
quantized here and one quantized by ``quantize_static`` from the same ranges hold the same
numbers: uint8 asymmetric (the activations' default) and int8 symmetric.

The range is widened to hold 0 (zero must be exact: padding and ReLU's floor), and the step
is computed in float64 then stored as float32, which is what QuantizeLinear reads."""
from __future__ import annotations

import math

import numpy as np

from ..errors import UserError

# (dtype, symmetric) -> (qmin, qmax): ONNX Runtime's ONNX_INT_TYPE_RANGE, with int8's symmetric
# range -127..127 (ONNX_INT_TYPE_SYMMETRIC_RANGE), so that -x quantizes to -q
QRANGES = {
    ("uint8", False): (0, 255),
    ("uint8", True): (0, 255),
    ("int8", False): (-128, 127),
    ("int8", True): (-127, 127),
}
QUANT_DTYPES = ("uint8", "int8")


def default_symmetric(dtype: str) -> bool:
    """The activations' default: uint8 asymmetric, int8 symmetric (zero point 0)."""
    return dtype == "int8"


def qrange(dtype: str, symmetric: bool | None = None) -> tuple[int, int]:
    """(qmin, qmax) of ``dtype`` quantized symmetrically or not (None: ``default_symmetric``)."""
    if dtype not in QUANT_DTYPES:
        raise UserError(f"quantized dtype '{dtype}' is not one of {', '.join(QUANT_DTYPES)}")
    return QRANGES[dtype, default_symmetric(dtype) if symmetric is None else bool(symmetric)]


def scale_zero_point(rmin: float, rmax: float, dtype: str = "uint8",
                     symmetric: bool | None = None) -> tuple[float, int]:
    """(scale, zero_point) for values in [``rmin``, ``rmax``] quantized to ``dtype``: the scale a
    float32 value (returned as the Python float equal to it), the zero point an int in the
    dtype's range. ``symmetric`` None: uint8 asymmetric, int8 symmetric. Exactly ONNX Runtime's
    ``compute_scale_zp(rmin, rmax, qmin, qmax, symmetric)`` on float32 ranges: a scale below
    float32's smallest normal number (an all-zero range) is 1.0 with zero point 0; a symmetric
    zero point is the middle of the range (0 for int8, 128 for uint8)."""
    symmetric = default_symmetric(dtype) if symmetric is None else bool(symmetric)
    qmin, qmax = qrange(dtype, symmetric)
    lo, hi = np.float32(rmin), np.float32(rmax)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise UserError(f"cannot quantize a tensor whose range [{rmin}, {rmax}] is not finite")
    if lo > hi:
        raise UserError(f"a range's minimum {rmin} is above its maximum {rmax}")
    # zero inside the range: the zero point is then a representable value
    lo, hi = min(lo, np.float32(0)), max(hi, np.float32(0))
    if symmetric:
        hi = max(abs(lo), abs(hi))
        lo = -hi
    # promoted before the subtraction, as ORT does: float32's range could overflow
    scale = (np.float64(hi) - np.float64(lo)) / (np.float64(qmax) - np.float64(qmin))
    if scale < np.finfo(np.float32).tiny:
        return 1.0, 0
    if symmetric:
        zero_point = int(np.round((qmin + qmax) / np.float64(2.0)))
    else:
        # the float64 scale, before it is stored as float32: ORT's order
        zero_point = int(np.round(np.float64(qmin) - np.float64(lo) / scale))
    return float(np.float32(scale)), min(max(zero_point, qmin), qmax)


def scales_of(ranges: dict[str, tuple[float, float]], dtype: str = "uint8",
              symmetric: bool | None = None) -> dict[str, tuple[float, int]]:
    """``scale_zero_point`` of each named range (what ``collect_ranges`` returns)."""
    return {name: scale_zero_point(lo, hi, dtype, symmetric) for name, (lo, hi) in ranges.items()}


def quantization_section(ranges: dict[str, tuple[float, float]], dtype: str = "uint8", symmetric: bool | None = None,
                         calibration: dict | None = None) -> dict:
    """The net file's ``quantization`` section (docs/spec.md, schemas/quantization.py) for
    ``ranges``: each top's scale, zero point and dtype, and ``calibration`` (method, examples,
    data[, percentile]) for the record when given. Each scale is the Python float equal to the
    float32 scale, so that YAML's repr of it reads back to exactly that float32."""
    activations = {}
    for name, (scale, zero_point) in scales_of(ranges, dtype, symmetric).items():
        activations[name] = {"scale": scale, "zero_point": zero_point, "dtype": dtype}
    section: dict = {"activations": activations}
    if calibration is not None:
        section["calibration"] = dict(calibration)
    return section

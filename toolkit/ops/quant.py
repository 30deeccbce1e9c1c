"""int8 post-training quantization's ops: quantize_linear, dequantize_linear, qconv2d and qgemm,
and the helpers that quantize a layer's weights and bias (per output channel, symmetric).

The definitions follow ONNX's QuantizeLinear / DequantizeLinear / QLinearConv, written so that a
kernel in C reproduces them bit for bit (docs/spec.md, int8 quantization):

* quantize_linear: q = clamp(round_half_even(float32(x) / float32(scale)) + zero_point), in the
  range of ``dtype`` (uint8 or int8);
* dequantize_linear: y = float32(int32(q) - zero_point) * float32(scale);
* qconv2d / qgemm: acc = sum of int32(x - x_zero_point) * int32(w) + bias (int32; a convolution's
  padding is x_zero_point, so it contributes 0). A float32 output is float32(acc) *
  float32(x_scale * w_scales[o]) (the product in float64, then rounded to float32), max 0 under
  ``relu``; a quantized one is round_half_even(float32(acc) * m[o]) + y_zero_point with
  m[o] = float32(x_scale * w_scales[o] / y_scale), at least y_zero_point under ``relu``, clamped
  to the output dtype's range. Each float32 operation is one rounding: no fused multiply-add.

The references sum in int64 and check that every sum fits int32, the accumulator the kernels
use: a sum that does not is an error, not a silent wrap. None of these ops is differentiable:
quantization happens after training.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.graph import FLOAT_DTYPES, QUANT_DTYPES, TensorType
from .base import OpDef, ShapeError, register
from .conv import _groups, _windows, conv_out_size, conv_output_shape
from .rules import fmt_shape, need_rank

QRANGE = {"uint8": (0, 255), "int8": (-128, 127)}
OUT_DTYPES = ("float32",) + QUANT_DTYPES
WEIGHT_MAX = 127          # symmetric weights use [-127, 127]: -128 has no positive twin


# -- attribute checks ------------------------------------------------------------------------------
def _scale(value, what: str) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ShapeError(f"{what} must be a positive finite number, got {value!r}")
    return float(value)


def _zero_point(value, dtype: str, what: str) -> int:
    lo, hi = QRANGE[dtype]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ShapeError(f"{what} must be an integer in [{lo}, {hi}] for {dtype}, got {value!r}")
    return value


def _quant_input(t: TensorType, what: str) -> None:
    if t.dtype not in QUANT_DTYPES:
        raise ShapeError(f"{what} must be {' or '.join(QUANT_DTYPES)}, got {t.dtype}")


def _out_attrs(attrs) -> str:
    """Checks the output attributes of qconv2d / qgemm; returns the output dtype."""
    out = attrs.get("out_dtype", "float32")
    if out not in OUT_DTYPES:
        raise ShapeError(f"out_dtype must be one of {', '.join(OUT_DTYPES)}, got {out!r}")
    if out != "float32":
        _scale(attrs.get("y_scale"), "y_scale")
        _zero_point(attrs.get("y_zero_point"), out, "y_zero_point")
    if not isinstance(attrs.get("relu", False), bool):
        raise ShapeError(f"relu must be true or false, got {attrs.get('relu')!r}")
    return out


def _weight_and_bias(types, channels: int, what: str) -> None:
    w = types[1]
    if w.dtype != "int8":
        raise ShapeError(f"{what} weight must be int8 (symmetric, per output channel), got {w.dtype}")
    if len(types) == 3:
        b = types[2]
        if b.dtype != "int32":
            raise ShapeError(f"{what} bias must be int32, got {b.dtype}")
        if tuple(b.shape) != (channels,):
            raise ShapeError(f"{what} bias has shape {fmt_shape(b.shape)}, expected [{channels}]")


def _w_scales(value, channels, what: str) -> None:
    if not isinstance(value, tuple) or (isinstance(channels, int) and len(value) != channels):
        n = len(value) if isinstance(value, tuple) else value
        raise ShapeError(f"{what} must hold one scale per output channel ({channels}), got {n}")
    for s in value:
        _scale(s, what)


# -- quantize_linear / dequantize_linear ------------------------------------------------------------
def _quantize_infer(types, attrs):
    if len(types) != 1:
        raise ShapeError(f"quantize_linear takes one input, got {len(types)}")
    x, = types
    if x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"quantize_linear input must be a float type, got {x.dtype}")
    dtype = attrs.get("dtype")
    if dtype not in QUANT_DTYPES:
        raise ShapeError(f"quantize_linear dtype must be {' or '.join(QUANT_DTYPES)}, got {dtype!r}")
    _scale(attrs.get("scale"), "quantize_linear scale")
    _zero_point(attrs.get("zero_point"), dtype, "quantize_linear zero_point")
    return [TensorType(tuple(x.shape), dtype)]


def quantize_linear_reference(x, scale, zero_point, dtype):
    lo, hi = QRANGE[dtype]
    q = np.rint(x.astype(np.float32) / np.float32(scale)).astype(np.float64) + zero_point
    return np.clip(q, lo, hi).astype(dtype)


def _dequantize_infer(types, attrs):
    if len(types) != 1:
        raise ShapeError(f"dequantize_linear takes one input, got {len(types)}")
    q, = types
    _quant_input(q, "dequantize_linear input")
    _scale(attrs.get("scale"), "dequantize_linear scale")
    _zero_point(attrs.get("zero_point"), q.dtype, "dequantize_linear zero_point")
    return [TensorType(tuple(q.shape), "float32")]


def dequantize_linear_reference(q, scale, zero_point):
    return (q.astype(np.int32) - np.int32(zero_point)).astype(np.float32) * np.float32(scale)


def _elementwise_flops(ins, outs, attrs):
    return outs[0].numel


# -- the requantizing store, shared by qconv2d and qgemm ---------------------------------------------
def check_int32(acc: np.ndarray, what: str) -> np.ndarray:
    """``acc`` (int64) as int32, refused where a sum leaves int32 (the kernels' accumulator)."""
    if acc.size and (acc.max() > np.iinfo(np.int32).max or acc.min() < np.iinfo(np.int32).min):
        raise ValueError(f"{what}: an int32 accumulator overflows (sum in [{acc.min()}, {acc.max()}])")
    return acc.astype(np.int32)


def output_multipliers(x_scale, w_scales, out_dtype, y_scale=None) -> np.ndarray:
    """Per output channel, the float32 factor the int32 sum is multiplied by: x_scale * w_scale
    (a float output) or x_scale * w_scale / y_scale (a quantized one), in float64, then rounded."""
    m = np.float64(x_scale) * np.asarray(w_scales, dtype=np.float64)
    if out_dtype != "float32":
        m = m / np.float64(y_scale)
    return m.astype(np.float32)


def requantize_reference(acc, channel_axis, x_scale, w_scales, relu, out_dtype, y_scale=None, y_zero_point=None):
    """The definition, literally: the int32 sums ``acc`` to the output, channel on ``channel_axis``."""
    shape = [1] * acc.ndim
    shape[channel_axis] = -1
    m = output_multipliers(x_scale, w_scales, out_dtype, y_scale).reshape(shape)
    v = acc.astype(np.float32) * m                      # float32 * float32: one rounding
    if out_dtype == "float32":
        return np.maximum(v, np.float32(0)) if relu else v
    q = np.rint(v).astype(np.float64) + y_zero_point   # exact: |rint(v)| < 2**31 * m, an integer
    if relu:
        q = np.maximum(q, y_zero_point)
    lo, hi = QRANGE[out_dtype]
    return np.clip(q, lo, hi).astype(out_dtype)


# -- qconv2d ------------------------------------------------------------------------------------------
def _qconv_infer(types, attrs):
    if len(types) not in (2, 3):
        raise ShapeError(f"qconv2d takes (input, weight[, bias]), got {len(types)} inputs")
    x, w = types[:2]
    _quant_input(x, "qconv2d input")
    need_rank(x, 4, "qconv2d input")
    need_rank(w, 4, "qconv2d weight")
    o = w.shape[0]
    _weight_and_bias(types, o, "qconv2d")
    _scale(attrs.get("x_scale"), "qconv2d x_scale")
    _zero_point(attrs.get("x_zero_point"), x.dtype, "qconv2d x_zero_point")
    _w_scales(attrs.get("w_scales"), o, "qconv2d w_scales")
    out = _out_attrs(attrs)
    return [TensorType(conv_output_shape(x.shape, w.shape, attrs, "qconv2d "), out)]


def qconv2d_accumulate(x, w, bias, stride, pad, dilation, group, x_zero_point) -> np.ndarray:
    """The int32 sums of a quantized convolution, summed in int64 and checked to fit int32."""
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    oh = conv_out_size(x.shape[2], kh, stride[0], pad[0], dilation[0])
    ow = conv_out_size(x.shape[3], kw, stride[1], pad[1], dilation[1])
    xs = x.astype(np.int64) - x_zero_point
    # the padded input equals x_zero_point, so its shifted value is 0
    xp = np.pad(xs, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    attrs = dict(stride=stride, dilation=dilation)
    acc = np.zeros((n, o, oh, ow), dtype=np.int64)
    w64 = w.astype(np.int64)
    for cs, os in _groups(c, o, group):
        for i in range(kh):
            for j in range(kw):
                acc[:, os] += np.einsum("nchw,oc->nohw", _windows(xp, i, j, oh, ow, attrs)[:, cs], w64[os, :, i, j])
    if bias is not None:
        acc += bias.astype(np.int64).reshape(1, -1, 1, 1)
    return check_int32(acc, "qconv2d")


def qconv2d_reference(x, w, *bias, stride, pad, dilation, group, x_scale, x_zero_point, w_scales,
                      relu=False, out_dtype="float32", y_scale=None, y_zero_point=None):
    acc = qconv2d_accumulate(x, w, bias[0] if bias else None, stride, pad, dilation, group, x_zero_point)
    return requantize_reference(acc, 1, x_scale, w_scales, relu, out_dtype, y_scale, y_zero_point)


def _qconv_flops(ins, outs, attrs):
    _, cg, kh, kw = ins[1].shape
    return 2 * outs[0].numel * cg * kh * kw


# -- qgemm --------------------------------------------------------------------------------------------
def _qgemm_infer(types, attrs):
    if len(types) not in (2, 3):
        raise ShapeError(f"qgemm takes (a, b[, bias]), got {len(types)} inputs")
    a, b = types[:2]
    _quant_input(a, "qgemm a")
    need_rank(a, 2, "qgemm a")
    need_rank(b, 2, "qgemm b ([N, K], InnerProduct's weight layout)")
    n = b.shape[0]
    _weight_and_bias(types, n, "qgemm")
    if a.shape[1] != b.shape[1]:
        raise ShapeError(f"qgemm inner dimensions differ: a {fmt_shape(a.shape)} x b {fmt_shape(b.shape)} "
                         "(b is [N, K])")
    _scale(attrs.get("a_scale"), "qgemm a_scale")
    _zero_point(attrs.get("a_zero_point"), a.dtype, "qgemm a_zero_point")
    _w_scales(attrs.get("b_scales"), n, "qgemm b_scales")
    return [TensorType((a.shape[0], n), _out_attrs(attrs))]


def qgemm_accumulate(a, b, bias, a_zero_point) -> np.ndarray:
    acc = (a.astype(np.int64) - a_zero_point) @ b.astype(np.int64).T
    if bias is not None:
        acc += bias.astype(np.int64)
    return check_int32(acc, "qgemm")


def qgemm_reference(a, b, *bias, a_scale, a_zero_point, b_scales, relu=False, out_dtype="float32",
                    y_scale=None, y_zero_point=None):
    acc = qgemm_accumulate(a, b, bias[0] if bias else None, a_zero_point)
    return requantize_reference(acc, 1, a_scale, b_scales, relu, out_dtype, y_scale, y_zero_point)


def _qgemm_flops(ins, outs, attrs):
    return 2 * outs[0].numel * ins[0].shape[1]


# -- weights and bias -----------------------------------------------------------------------------------
def quantize_weights(w) -> tuple[np.ndarray, tuple[float, ...]]:
    """Per output channel (axis 0) symmetric int8: scale[o] = max|w[o]| / 127 (1.0 for a row of
    zeros), wq = clamp(round_half_even(w / scale[o]), -127, 127), the division in float64."""
    w = np.asarray(w, dtype=np.float64)
    rows = w.reshape(w.shape[0], -1)
    peak = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(w.shape[0])
    scales = np.where(peak > 0, peak / WEIGHT_MAX, 1.0)
    wq = np.clip(np.rint(rows / scales[:, None]), -WEIGHT_MAX, WEIGHT_MAX).astype(np.int8).reshape(w.shape)
    return wq, tuple(float(s) for s in scales)


def quantize_bias(b, x_scale, w_scales) -> np.ndarray:
    """bias / (x_scale * w_scale[o]), rounded half to even, as int32 (float64 arithmetic);
    a bias that leaves int32 is an error."""
    scale = np.float64(x_scale) * np.asarray(w_scales, dtype=np.float64)
    q = np.rint(np.asarray(b, dtype=np.float64) / scale)
    if q.size and (np.abs(q).max() > np.iinfo(np.int32).max):
        raise ValueError(f"a quantized bias leaves int32 (largest {np.abs(q).max():g}): the input scale "
                         f"{x_scale:g} is too small for this layer's bias")
    return q.astype(np.int32)


register(OpDef("quantize_linear", _quantize_infer, quantize_linear_reference, flops=_elementwise_flops,
               batch_rows=True, doc="float to uint8/int8: clamp(round_half_even(x / scale) + zero_point)"))
register(OpDef("dequantize_linear", _dequantize_infer, dequantize_linear_reference, flops=_elementwise_flops,
               batch_rows=True, doc="uint8/int8 to float32: (q - zero_point) * scale"))
register(OpDef("qconv2d", _qconv_infer, qconv2d_reference, flops=_qconv_flops, batch_rows=True,
               doc="quantized convolution (NCHW, int8 weights per output channel, int32 bias and sums), "
                   "requantized to float32 or uint8/int8 with an optional ReLU"))
register(OpDef("qgemm", _qgemm_infer, qgemm_reference, flops=_qgemm_flops, batch_rows=True,
               doc="quantized a[M, K] x b[N, K]^T (int8 weights per row of b, int32 bias and sums), "
                   "requantized to float32 or uint8/int8 with an optional ReLU"))

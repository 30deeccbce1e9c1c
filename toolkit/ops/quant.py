"""int8 post-training quantization's ops: quantize_linear, dequantize_linear, qconv2d and qgemm,
qadd, qconcat, qavg_pool2d and qglobal_avg_pool (int8 kept through residual adds, concatenations
and average pooling), and the helpers that quantize a layer's weights and bias (per output channel, symmetric).

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
from .base import OpDef, ShapeError, get_op, register
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
    # NaN quantizes to 0, said here rather than left to the float-to-integer cast (undefined in C,
    # 0 on x86 with a warning in numpy); the native kernel does the same
    q = np.where(np.isnan(q), 0.0, q)
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


# -- qadd, qconcat, qavg_pool2d, qglobal_avg_pool: int8 between the quantized layers -------------------
def _requantized(v, y_zero_point, out_dtype, relu=False):
    """A float32 value in output steps (v = real / y_scale) to the output dtype: clamped to the
    range less the zero point (integer bounds, so clamping before rounding is clamping after),
    rounded half to even, the zero point added; under ``relu`` nothing below the zero point."""
    lo, hi = QRANGE[out_dtype]
    lo = max(lo, y_zero_point) if relu else lo
    v = np.clip(v, np.float32(lo - y_zero_point), np.float32(hi - y_zero_point))
    return (np.rint(v) + np.float32(y_zero_point)).astype(out_dtype)


def scale_ratio(scale, y_scale) -> np.float32:
    """float32(scale) / float32(y_scale), one float32 division (as ONNX Runtime's QLinearAdd)."""
    return np.float32(scale) / np.float32(y_scale)


def _out_quant(attrs, what: str) -> str:
    out = attrs.get("out_dtype")
    if out not in QUANT_DTYPES:
        raise ShapeError(f"{what} out_dtype must be {' or '.join(QUANT_DTYPES)}, got {out!r}")
    _scale(attrs.get("y_scale"), f"{what} y_scale")
    _zero_point(attrs.get("y_zero_point"), out, f"{what} y_zero_point")
    return out


def _qadd_infer(types, attrs):
    if len(types) != 2:
        raise ShapeError(f"qadd takes two inputs, got {len(types)}")
    a, b = types
    for t, name in ((a, "a"), (b, "b")):
        _quant_input(t, f"qadd {name}")
        _scale(attrs.get(f"{name}_scale"), f"qadd {name}_scale")
        _zero_point(attrs.get(f"{name}_zero_point"), t.dtype, f"qadd {name}_zero_point")
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeError(f"qadd inputs differ in shape: {fmt_shape(a.shape)} and {fmt_shape(b.shape)} "
                         "(no broadcasting)")
    if not isinstance(attrs.get("relu", False), bool):
        raise ShapeError(f"relu must be true or false, got {attrs.get('relu')!r}")
    return [TensorType(tuple(a.shape), _out_quant(attrs, "qadd"))]


def qadd_reference(a, b, *, a_scale, a_zero_point, b_scale, b_zero_point, y_scale, y_zero_point, out_dtype,
                   relu=False):
    """ONNX Runtime's QLinearAdd: (a - za) * (sa / sy) + (b - zb) * (sb / sy) in float32 (each
    operation one rounding, no fused multiply-add), then the requantizing store."""
    va = (a.astype(np.int32) - np.int32(a_zero_point)).astype(np.float32) * scale_ratio(a_scale, y_scale)
    vb = (b.astype(np.int32) - np.int32(b_zero_point)).astype(np.float32) * scale_ratio(b_scale, y_scale)
    return _requantized(va + vb, y_zero_point, out_dtype, relu)


def _qconcat_infer(types, attrs):
    if not types:
        raise ShapeError("qconcat takes at least one input")
    for t in types:
        _quant_input(t, "qconcat input")
    scales, zero_points = attrs.get("x_scales"), attrs.get("x_zero_points")
    if not (isinstance(scales, tuple) and isinstance(zero_points, tuple)
            and len(scales) == len(zero_points) == len(types)):
        raise ShapeError(f"qconcat needs one x_scale and one x_zero_point per input ({len(types)})")
    for t, s, z in zip(types, scales, zero_points):
        _scale(s, "qconcat x_scale")
        _zero_point(z, t.dtype, "qconcat x_zero_point")
    out = _out_quant(attrs, "qconcat")
    float_types = [TensorType(tuple(t.shape), "float32") for t in types]
    shape = get_op("concat").infer(float_types, {"axis": attrs.get("axis")})[0].shape
    return [TensorType(tuple(shape), out)]


def requantize_values(x, x_scale, x_zero_point, y_scale, y_zero_point, out_dtype):
    """x at another scale: quantize_linear(dequantize_linear(x)) (ONNX Runtime's QLinearConcat),
    or x itself where the parameters are the same."""
    if (float(x_scale), int(x_zero_point), str(x.dtype)) == (float(y_scale), int(y_zero_point), out_dtype):
        return x
    return quantize_linear_reference(dequantize_linear_reference(x, x_scale, x_zero_point), y_scale, y_zero_point,
                                     out_dtype)


def qconcat_reference(*xs, axis, x_scales, x_zero_points, y_scale, y_zero_point, out_dtype):
    return np.concatenate([requantize_values(x, s, z, y_scale, y_zero_point, out_dtype)
                           for x, s, z in zip(xs, x_scales, x_zero_points)], axis=axis)


def _pool_quant_attrs(x, attrs, what):
    _quant_input(x, f"{what} input")
    need_rank(x, 4, f"{what} input")
    _scale(attrs.get("x_scale"), f"{what} x_scale")
    _zero_point(attrs.get("x_zero_point"), x.dtype, f"{what} x_zero_point")
    return _out_quant(attrs, what)


def _qavg_infer(types, attrs):
    if len(types) != 1:
        raise ShapeError(f"qavg_pool2d takes one input, got {len(types)}")
    x, = types
    out = _pool_quant_attrs(x, attrs, "qavg_pool2d")
    float_attrs = {k: attrs[k] for k in ("kernel", "stride", "pad", "ceil_mode")}
    shape = get_op("max_pool2d").infer([TensorType(tuple(x.shape), "float32")], float_attrs)[0].shape
    return [TensorType(tuple(shape), out)]


def average_multipliers(x_scale, y_scale, counts) -> np.ndarray:
    """Per window, the float32 factor its int32 sum is multiplied by: x_scale / (y_scale * count),
    in float64, then rounded."""
    return (np.float64(x_scale) / (np.float64(y_scale) * np.asarray(counts, dtype=np.float64))).astype(np.float32)


def qavg_pool2d_accumulate(x, kernel, stride, pad, ceil_mode, x_zero_point) -> np.ndarray:
    """Each window's int32 sum of x - x_zero_point (padding contributes 0: it is the zero point)."""
    from .pool import padded_input, window
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode)
    xp, oh, ow = padded_input(x.astype(np.int32) - np.int32(x_zero_point), attrs, 0)
    acc = np.zeros(x.shape[:2] + (oh, ow), dtype=np.int64)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            acc += window(xp, i, j, oh, ow, attrs)
    return check_int32(acc, "qavg_pool2d")


def qavg_pool2d_reference(x, *, kernel, stride, pad, ceil_mode, count_include_pad, x_scale, x_zero_point, y_scale,
                          y_zero_point, out_dtype):
    """Average pooling on quantized values: int32 sums, one rounding at the end,
    round_half_even(float32(sum) * float32(x_scale / (y_scale * count))) + y_zero_point, with
    count_include_pad and ceil_mode as float average pooling (ops/pool.py)."""
    from .pool import avg_divisor
    acc = qavg_pool2d_accumulate(x, kernel, stride, pad, ceil_mode, x_zero_point)
    counts = avg_divisor(x.shape[2], x.shape[3], acc.shape[2], acc.shape[3],
                         dict(kernel=kernel, stride=stride, pad=pad, count_include_pad=count_include_pad))
    return _requantized(acc.astype(np.float32) * average_multipliers(x_scale, y_scale, counts), y_zero_point,
                        out_dtype)


def _qglobal_infer(types, attrs):
    if len(types) != 1:
        raise ShapeError(f"qglobal_avg_pool takes one input, got {len(types)}")
    x, = types
    out = _pool_quant_attrs(x, attrs, "qglobal_avg_pool")
    n, c = x.shape[:2]
    return [TensorType((n, c, 1, 1) if attrs.get("keepdims", True) else (n, c), out)]


def qglobal_avg_pool_reference(x, *, x_scale, x_zero_point, y_scale, y_zero_point, out_dtype, keepdims=True):
    """The mean over each channel's H x W as qavg_pool2d computes it (ONNX Runtime's
    QLinearGlobalAveragePool): an int32 sum, one rounding."""
    n, c, h, w = x.shape
    acc = check_int32(x.astype(np.int64).reshape(n, c, h * w).sum(axis=2) - np.int64(x_zero_point) * h * w,
                      "qglobal_avg_pool")
    m = average_multipliers(x_scale, y_scale, h * w)
    y = _requantized(acc.astype(np.float32) * m, y_zero_point, out_dtype)
    return y.reshape(n, c, 1, 1) if keepdims else y


def _qpool_flops(ins, outs, attrs):
    return ins[0].numel


register(OpDef("qadd", _qadd_infer, qadd_reference, flops=_elementwise_flops, batch_rows=True,
               doc="quantized a + b (ONNX Runtime's QLinearAdd) requantized to y_scale, with an optional ReLU"))
register(OpDef("qconcat", _qconcat_infer, qconcat_reference, flops=_elementwise_flops, batch_rows=True,
               doc="quantized concatenation: each input requantized to the output's scale, copied where equal"))
register(OpDef("qavg_pool2d", _qavg_infer, qavg_pool2d_reference, flops=_qpool_flops, batch_rows=True,
               doc="average pooling of uint8/int8 values: int32 sums, one rounding to the output's scale"))
register(OpDef("qglobal_avg_pool", _qglobal_infer, qglobal_avg_pool_reference, flops=_qpool_flops,
               batch_rows=True, doc="the mean of each channel of uint8/int8 values: int32 sums, one rounding"))
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

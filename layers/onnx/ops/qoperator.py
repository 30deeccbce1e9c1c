"""ONNX's QOperator format onto the toolkit's int8 ops (toolkit/ops/quant.py): QLinearConv,
QLinearMatMul, ConvInteger and MatMulInteger, and ONNX Runtime's QGemm, QLinearAdd, QLinearConcat,
QLinearAveragePool and QLinearGlobalAveragePool (its ``quantize_static`` with QuantFormat.QOperator).
Where the int8 ops take the weights (int8, zero points 0) the op is one qconv2d / qgemm; ConvInteger,
MatMulInteger and the ops whose weights they do not take (uint8, or zero points other than 0) sum
the integers in float64, which is exact."""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import QUANT_DTYPES, Value

from ..convert import DOMAIN_OPS, NodeError
from .base import converts
from .quantized import channel_scales, conv_geometry, known_array, per_tensor

DOMAIN_OPS.update(("com.microsoft", op) for op in ("QGemm", "QLinearAdd", "QLinearConcat", "QLinearAveragePool",
                                                   "QLinearGlobalAveragePool"))


# -- values and weights -----------------------------------------------------------------------------
def _quantized_value(imp, name: str) -> Value:
    x = imp.value(name)
    if x.dtype not in QUANT_DTYPES:
        imp.fail(f"input '{name}' is {x.dtype}, where a uint8 or int8 value is read")
    return x


def _const_int8(imp, name: str, what: str) -> np.ndarray:
    w = imp.const(name, what)
    if w.dtype != np.int8:
        imp.fail(f"{what} ('{name}') is {w.dtype}: only int8 weights have a counterpart here")
    return w


def _symmetric(imp, node, scale_index: int, zp_index: int, channels: int) -> tuple[float, ...]:
    scales = channel_scales(imp, node.input[scale_index], imp.optional(node, zp_index), channels, "weight")
    if scales is None:
        imp.fail("a weight with zero points other than 0 (asymmetric) has no counterpart here: quantize the "
                 "weights symmetrically (ONNX Runtime's default for int8 weights)")
    return scales


def _int32_const(imp, name: str | None, channels: int):
    if name is None:
        return None
    b = imp.const(name, "the bias")
    if b.dtype != np.int32 or b.size != channels:
        imp.fail(f"the bias ('{name}') is {b.dtype} of {b.size} values, where int32 of {channels} is read")
    return imp.b.op("constant", value=np.asarray(b, np.int32).reshape(-1))


# -- integer sums in float64 ----------------------------------------------------------------------------
# Where the int8 ops do not fit (uint8 or asymmetric weights, products of more than two axes,
# unequal padding), the integers are summed in float64: every product is below 2**16 and every sum
# below 2**53, so the sums are exact, and the requantization follows ONNX's reference (the factor
# x_scale * w_scale / y_scale in float32, the zero point added before rounding).
def _shifted(imp, x: Value, zero_point: int) -> Value:
    xf = imp.b.op("cast", x, dtype="float64")
    return imp.b.sub(xf, imp.b.scalar(float(zero_point), "float64")) if zero_point else xf


def _weight_minus_zero(imp, w: np.ndarray, zp_name: str | None, channel_axis: int) -> np.ndarray:
    wf = w.astype(np.float64)
    if zp_name is not None:
        zp = np.asarray(known_array(imp, zp_name, "the weight zero point"), np.float64)
        if zp.size > 1:
            shape = [1] * w.ndim
            shape[channel_axis] = -1
            zp = zp.reshape(shape)
        wf = wf - zp
    return wf


def _float64_conv(imp, node, x: Value, x_zp: int, w: np.ndarray, w_zp: str | None, bias: np.ndarray | None):
    from ..windows import pad_explicit, spatial_pads
    if x.rank != 4 or w.ndim != 4:
        imp.fail("a quantized convolution of 2-d images only ([N, C, H, W])")
    kernel = [int(k) for k in w.shape[2:]]
    strides = [int(v) for v in imp.attr(node, "strides", [1, 1])]
    dilations = [int(v) for v in imp.attr(node, "dilations", [1, 1])]
    xf = _shifted(imp, x, x_zp)
    begin, end = spatial_pads(imp, node, x, kernel, strides, dilations)
    symmetric = [lo if lo == hi else 0 for lo, hi in zip(begin, end)]
    # the padding is the zero point, 0 once shifted
    xf = pad_explicit(imp, xf, [lo - s for lo, s in zip(begin, symmetric)], [hi - s for hi, s in zip(end, symmetric)])
    inputs = [xf, imp.b.op("constant", value=_weight_minus_zero(imp, w, w_zp, 0))]
    if bias is not None:
        inputs.append(imp.b.op("constant", value=np.asarray(bias, np.float64).reshape(-1)))
    return imp.b.op("conv2d", *inputs, stride=tuple(strides), pad=tuple(symmetric), dilation=tuple(dilations),
                    group=int(imp.attr(node, "group", 1)))


def _float64_matmul(imp, a: Value, a_zp: int, b: np.ndarray, b_zp: str | None) -> Value:
    if a.rank < 2 or b.ndim < 2:
        imp.fail("a quantized product of vectors has no counterpart here (A and B of rank 2 or more)")
    wf = _weight_minus_zero(imp, b, b_zp, b.ndim - 1)
    return imp.b.op("matmul", _shifted(imp, a, a_zp), imp.b.op("constant", value=wf),
                    trans_a=False, trans_b=False)


def _requantized_sums(imp, node, acc: Value, x_scale: float, scale_index: int, channel_axis: int, y_index: int):
    """ONNX's reference requantization of float64 sums: rint(acc * (x_scale * w_scale / y_scale)
    + y_zero_point), saturated."""
    w_scales = np.asarray(known_array(imp, node.input[scale_index], "the weight scale"), np.float32).reshape(-1)
    y_scale, y_zp, y_dtype = per_tensor(imp, node, y_index, y_index + 1, "output")
    factor = (np.float32(x_scale) * w_scales / np.float32(y_scale)).astype(np.float32).astype(np.float64)
    if factor.size > 1:
        shape = [1] * acc.rank
        shape[channel_axis] = -1
        v = imp.b.mul(acc, imp.b.op("constant", value=factor.reshape(shape)))
    else:
        v = imp.b.scale(acc, float(factor[0]))
    if y_zp:
        v = imp.b.add(v, imp.b.scalar(float(y_zp), "float64"))
    return imp.b.op("quantize_linear", v, scale=1.0, zero_point=0, dtype=y_dtype)


def _int8_fits(imp, w: np.ndarray, zp_name: str | None) -> bool:
    return w.dtype == np.int8 and (zp_name is None or not np.any(known_array(imp, zp_name, "the weight zero point")))


@converts("QLinearConv")
def _qlinear_conv(imp, node):
    x = _quantized_value(imp, node.input[0])
    x_scale, x_zp, x_dtype = per_tensor(imp, node, 1, 2, "input")
    w = imp.const(node.input[3], "the weight")
    bias_name = imp.optional(node, 8)
    if w.ndim == 4 and x.rank == 4 and _int8_fits(imp, w, node.input[5]):
        geometry = None
        try:
            geometry = conv_geometry(imp, node, x, w.shape)
        except NodeError:           # unequal padding: the float64 sums below
            geometry = None
        if geometry is not None:
            w_scales = _symmetric(imp, node, 4, 5, w.shape[0])
            y_scale, y_zp, y_dtype = per_tensor(imp, node, 6, 7, "output")
            inputs = [x, imp.b.op("constant", value=np.ascontiguousarray(w))]
            bias = _int32_const(imp, bias_name, w.shape[0])
            if bias is not None:
                inputs.append(bias)
            return [imp.b.op("qconv2d", *inputs, **geometry, x_scale=x_scale, x_zero_point=x_zp,
                             w_scales=w_scales, relu=False, out_dtype=y_dtype, y_scale=y_scale, y_zero_point=y_zp)]
    bias = imp.const(bias_name, "the bias") if bias_name is not None else None
    acc = _float64_conv(imp, node, x, x_zp, w, imp.optional(node, 5), bias)
    return [_requantized_sums(imp, node, acc, x_scale, 4, 1, 6)]


def _matrix(imp, x: Value, what: str) -> Value:
    if x.rank != 2:
        imp.fail(f"{what} has rank {x.rank}: quantized products of 2-d matrices only")
    return x


@converts("QLinearMatMul")
def _qlinear_matmul(imp, node):
    a = _quantized_value(imp, node.input[0])
    a_scale, a_zp, _ = per_tensor(imp, node, 1, 2, "input")
    b = imp.const(node.input[3], "B")
    if a.rank == 2 and b.ndim == 2 and _int8_fits(imp, b, node.input[5]):
        b_scales = _symmetric(imp, node, 4, 5, b.shape[1])
        y_scale, y_zp, y_dtype = per_tensor(imp, node, 6, 7, "output")
        return [imp.b.op("qgemm", a, imp.b.op("constant", value=np.ascontiguousarray(b.T)), a_scale=a_scale,
                         a_zero_point=a_zp, b_scales=b_scales, relu=False, out_dtype=y_dtype, y_scale=y_scale,
                         y_zero_point=y_zp)]
    acc = _float64_matmul(imp, a, a_zp, b, imp.optional(node, 5))
    return [_requantized_sums(imp, node, acc, a_scale, 4, acc.rank - 1, 6)]


@converts("QGemm")
def _qgemm(imp, node):
    """ONNX Runtime's QGemm (com.microsoft): A x B (+ int32 C), quantized where y_scale is given."""
    if imp.attr(node, "transA", 0) or float(imp.attr(node, "alpha", 1.0)) != 1.0:
        imp.fail("QGemm with transA or an alpha other than 1 has no counterpart here")
    a = _matrix(imp, _quantized_value(imp, node.input[0]), "A")
    a_scale, a_zp, _ = per_tensor(imp, node, 1, 2, "input")
    b = _const_int8(imp, node.input[3], "B")
    rows = b if imp.attr(node, "transB", 0) else b.T
    b_scales = _symmetric(imp, node, 4, 5, rows.shape[0])
    inputs = [a, imp.b.op("constant", value=np.ascontiguousarray(rows))]
    bias = _int32_const(imp, imp.optional(node, 6), rows.shape[0])
    if bias is not None:
        inputs.append(bias)
    out = {"out_dtype": "float32"}
    if imp.optional(node, 7) is not None:
        y_scale, y_zp, y_dtype = per_tensor(imp, node, 7, 8, "output")
        out = {"out_dtype": y_dtype, "y_scale": y_scale, "y_zero_point": y_zp}
    return [imp.b.op("qgemm", *inputs, a_scale=a_scale, a_zero_point=a_zp, b_scales=b_scales, relu=False, **out)]


def _integer_sums(imp, y: Value) -> Value:
    """float sums as the int32 the op gives."""
    return imp.b.op("cast", y, dtype="int32")


def _input_zero_point(imp, node, x: Value) -> int:
    name = imp.optional(node, 2)
    if name is None:
        return 0
    zp = known_array(imp, name, "the input zero point")
    if zp.size != 1:
        imp.fail("an input zero point per axis has no counterpart here")
    if str(zp.dtype) != x.dtype:
        imp.fail(f"the input zero point is {zp.dtype}, the input is {x.dtype}")
    return int(zp.reshape(()))


@converts("ConvInteger")
def _conv_integer(imp, node):
    x = _quantized_value(imp, node.input[0])
    w = imp.const(node.input[1], "the weight")
    x_zp = _input_zero_point(imp, node, x)
    return [_integer_sums(imp, _float64_conv(imp, node, x, x_zp, w, imp.optional(node, 3), None))]


@converts("MatMulInteger")
def _matmul_integer(imp, node):
    a = _quantized_value(imp, node.input[0])
    b = imp.const(node.input[1], "B")
    return [_integer_sums(imp, _float64_matmul(imp, a, _input_zero_point(imp, node, a), b, imp.optional(node, 3)))]


# -- ONNX Runtime's quantized ops of the com.microsoft domain (its QOperator format) ---------------------
def _output(imp, node, scale_index: int) -> dict:
    scale, zp, dtype = per_tensor(imp, node, scale_index, scale_index + 1, "output")
    return {"y_scale": scale, "y_zero_point": zp, "out_dtype": dtype}


@converts("QLinearAdd")
def _qlinear_add(imp, node):
    a, c = _quantized_value(imp, node.input[0]), _quantized_value(imp, node.input[3])
    sa, za, _ = per_tensor(imp, node, 1, 2, "A")
    sc, zc, _ = per_tensor(imp, node, 4, 5, "B")
    if tuple(a.shape) != tuple(c.shape):
        imp.fail(f"QLinearAdd of shapes {list(a.shape)} and {list(c.shape)}: broadcasting has no int8 form here")
    return [imp.b.op("qadd", a, c, a_scale=sa, a_zero_point=za, b_scale=sc, b_zero_point=zc, relu=False,
                     **_output(imp, node, 6))]


@converts("QLinearConcat")
def _qlinear_concat(imp, node):
    if (len(node.input) - 2) % 3 or len(node.input) < 5:
        imp.fail("QLinearConcat takes the output's scale and zero point, then a value, scale and zero point per input")
    values, scales, zero_points = [], [], []
    for i in range(2, len(node.input), 3):
        values.append(_quantized_value(imp, node.input[i]))
        s, z, _ = per_tensor(imp, node, i + 1, i + 2, "input")
        scales.append(s)
        zero_points.append(z)
    axis = int(imp.attr(node, "axis")) % values[0].rank
    return [imp.b.op("qconcat", *values, axis=axis, x_scales=tuple(scales), x_zero_points=tuple(zero_points),
                     **_output(imp, node, 0))]


def _channels_first(imp, node):
    if imp.attr(node, "channels_last", 0):
        imp.fail("channels_last has no counterpart here: the toolkit's images are [N, C, H, W]")


@converts("QLinearAveragePool")
def _qlinear_average_pool(imp, node):
    from ..windows import spatial_pads
    _channels_first(imp, node)
    x = _quantized_value(imp, node.input[0])
    if x.rank != 4:
        imp.fail("QLinearAveragePool of 2-d images only ([N, C, H, W])")
    kernel = [int(k) for k in imp.attr(node, "kernel_shape")]
    strides = [int(v) for v in imp.attr(node, "strides", [1, 1])]
    begin, end = spatial_pads(imp, node, x, kernel, strides, [1, 1])
    if begin != end or any(p > k // 2 for p, k in zip(begin, kernel)):
        imp.fail(f"QLinearAveragePool padded {begin} before and {end} after has no counterpart here")
    s, z, _ = per_tensor(imp, node, 1, 2, "input")
    return [imp.b.op("qavg_pool2d", x, kernel=tuple(kernel), stride=tuple(strides), pad=tuple(begin),
                     ceil_mode=bool(imp.attr(node, "ceil_mode", 0)),
                     count_include_pad=bool(imp.attr(node, "count_include_pad", 0)), x_scale=s, x_zero_point=z,
                     **_output(imp, node, 3))]


@converts("QLinearGlobalAveragePool")
def _qlinear_global_average_pool(imp, node):
    _channels_first(imp, node)
    x = _quantized_value(imp, node.input[0])
    if x.rank != 4:
        imp.fail("QLinearGlobalAveragePool of 2-d images only ([N, C, H, W])")
    s, z, _ = per_tensor(imp, node, 1, 2, "input")
    return [imp.b.op("qglobal_avg_pool", x, keepdims=True, x_scale=s, x_zero_point=z, **_output(imp, node, 3))]

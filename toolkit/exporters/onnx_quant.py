"""The int8 ops of a quantized graph (ops/quant.py) written in ONNX's QDQ format, the form ONNX
Runtime's ``quantize_static`` writes and its graph optimiser fuses into integer kernels:

    qconv2d(xq, Wq, bq)  ->  DequantizeLinear(xq) -> Conv(., DequantizeLinear(Wq, axis 0),
                             DequantizeLinear(bq, axis 0)) [-> Relu] [-> QuantizeLinear]
    qgemm(aq, Bq, bq)    ->  the same around Gemm (transB: the weight is [N, K])

The weights are int8 initializers with one scale per output channel (zero points 0), the bias is
int32 in the scale x_scale * w_scale (what the toolkit's int32 sums add), and a quantized output
ends in a QuantizeLinear of the toolkit's output scale and zero point. quantize_linear and
dequantize_linear are QuantizeLinear and DequantizeLinear (one definition); the int8 forms of a
residual add, a concatenation and average pooling are DequantizeLinear -> the float op ->
QuantizeLinear. Max pooling and reshapes of uint8/int8 values are ONNX's MaxPool and Reshape of
the integers, as the toolkit runs them.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .onnx_writer import CONVERT, Scope, converts


def _dequantized(s: Scope, q: str, scale: float, zero_point: int, dtype: str) -> str:
    return s.one("DequantizeLinear", [q, s.scalar(np.float32(scale), "float32"), s.scalar(zero_point, dtype)])


def _quantized(s: Scope, x: str, scale: float, zero_point: int, dtype: str) -> str:
    return s.one("QuantizeLinear", [x, s.scalar(np.float32(scale), "float32"), s.scalar(zero_point, dtype)])


def _per_channel(s: Scope, values: str, scales, dtype: str, hint: str) -> str:
    """DequantizeLinear of a constant per output channel (axis 0), zero points 0."""
    scales = np.asarray(scales, np.float32)
    return s.one("DequantizeLinear", [values, s.model.initializer(scales, f"{hint}_scale"),
                                      s.model.initializer(np.zeros(scales.shape, dtype), f"{hint}_zero_point")],
                 axis=0)


def _stored(s: Scope, node, y: str) -> list[str]:
    """The float result of a quantized op as the toolkit stores it: a ReLU, then quantized to the
    output's scale where the op's output is uint8/int8."""
    a = node.attrs
    if a.get("relu"):
        y = s.one("Relu", [y])
    out = a.get("out_dtype", "float32")
    if out == "float32":
        return [y]
    return [_quantized(s, y, a["y_scale"], a["y_zero_point"], out)]


def _linear_inputs(s: Scope, node, ins: list[str], x_scale: float, x_zero_point: int, w_scales) -> list[str]:
    x_dtype = node.inputs[0].dtype
    inputs = [_dequantized(s, ins[0], x_scale, x_zero_point, x_dtype), _per_channel(s, ins[1], w_scales, "int8",
                                                                                      "weight")]
    if len(ins) == 3:
        # the int32 bias is added to sums in the scale x_scale * w_scale (the product in float64,
        # as the toolkit's requantization forms it, then float32)
        bias_scales = (np.float64(x_scale) * np.asarray(w_scales, np.float64)).astype(np.float32)
        inputs.append(_per_channel(s, ins[2], bias_scales, "int32", "bias"))
    return inputs


@converts("quantize_linear")
def _quantize(s, node, ins):
    a = node.attrs
    return [_quantized(s, ins[0], a["scale"], a["zero_point"], a["dtype"])]


@converts("dequantize_linear")
def _dequantize(s, node, ins):
    a = node.attrs
    return [_dequantized(s, ins[0], a["scale"], a["zero_point"], node.inputs[0].dtype)]


@converts("qconv2d")
def _qconv(s, node, ins):
    a = node.attrs
    (ph, pw) = a["pad"]
    kh, kw = node.inputs[1].shape[2:]
    inputs = _linear_inputs(s, node, ins, a["x_scale"], a["x_zero_point"], a["w_scales"])
    y = s.one("Conv", inputs, kernel_shape=[kh, kw], strides=list(a["stride"]), pads=[ph, pw, ph, pw],
              dilations=list(a["dilation"]), group=int(a["group"]))
    return _stored(s, node, y)


@converts("qgemm")
def _qgemm(s, node, ins):
    a = node.attrs
    inputs = _linear_inputs(s, node, ins, a["a_scale"], a["a_zero_point"], a["b_scales"])
    return _stored(s, node, s.one("Gemm", inputs, transB=1))


@converts("qadd")
def _qadd(s, node, ins):
    a = node.attrs
    x = _dequantized(s, ins[0], a["a_scale"], a["a_zero_point"], node.inputs[0].dtype)
    y = _dequantized(s, ins[1], a["b_scale"], a["b_zero_point"], node.inputs[1].dtype)
    return _stored(s, node, s.one("Add", [x, y]))


@converts("qconcat")
def _qconcat(s, node, ins):
    a = node.attrs
    parts = [_dequantized(s, name, scale, zp, v.dtype)
             for name, scale, zp, v in zip(ins, a["x_scales"], a["x_zero_points"], node.inputs)]
    return _stored(s, node, s.one("Concat", parts, axis=int(a["axis"])))


@converts("qavg_pool2d")
def _qavg_pool(s, node, ins):
    a = node.attrs
    x = _dequantized(s, ins[0], a["x_scale"], a["x_zero_point"], node.inputs[0].dtype)
    # the float average pooling's own writer, on the dequantized input
    float_node = SimpleNamespace(op="avg_pool2d", attrs=a, inputs=node.inputs, outputs=node.outputs)
    y, = CONVERT["avg_pool2d"](s, float_node, [x])
    return _stored(s, node, y)


@converts("qglobal_avg_pool")
def _qglobal_avg_pool(s, node, ins):
    a = node.attrs
    y = s.one("GlobalAveragePool", [_dequantized(s, ins[0], a["x_scale"], a["x_zero_point"], node.inputs[0].dtype)])
    if not a.get("keepdims", True):
        y = s.one("Flatten", [y], axis=1)
    return _stored(s, node, y)

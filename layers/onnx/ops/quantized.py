"""ONNX's QuantizeLinear and DequantizeLinear, and the QDQ format (ONNX Runtime's
``quantize_static``'s default) onto the toolkit's int8 ops (toolkit/ops/quant.py):
DequantizeLinear -> Conv / Gemm / MatMul -> QuantizeLinear as one qconv2d or qgemm, and an Add, a
Concat, an AveragePool or a GlobalAveragePool between them as qadd, qconcat, qavg_pool2d or
qglobal_avg_pool. The QOperator format's ops are in ``qoperator.py``; what both read (scales and
zero points) is here.

QuantizeLinear and quantize_linear are one definition (float32 division, round half to even,
saturation), as are DequantizeLinear and dequantize_linear. A convolution or product whose input is
dequantized per tensor and whose weight is a dequantized int8 constant with zero points 0 (ONNX
Runtime's symmetric weights, per tensor or per output channel) runs as qconv2d / qgemm on the
integers: the sums are exact, and the output is quantized by the QuantizeLinear that reads it
(through a Relu, folded in) or left float. ONNX Runtime runs these patterns the same way (it fuses
them into QLinearConv / QGemm), so the results agree within one step of the output's scale: ONNX
Runtime forms the requantization factor in float32, the toolkit in float64 and then rounds. What
has no integer form here (a float op between a DequantizeLinear and a QuantizeLinear, asymmetric
weights in the QDQ format) stays float, which computes what the model says.
"""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import FLOAT_DTYPES, QUANT_DTYPES, Value

from ..convert import NodeError, is_const
from .base import converts

# ops that commute with per-tensor quantization (q(op(dq(x))) == op(x) on the integers), as the
# quantize pass (toolkit/passes/quantize.py) keeps them
COMMUTING = ("reshape", "max_pool2d")
# -- reading scales and zero points ------------------------------------------------------------------
def known_array(imp, name: str, what: str) -> np.ndarray:
    """The constant ``name`` (a scale or zero point), as folded or as the file holds it."""
    x = imp.env.get(name)
    if is_const(x):
        return x
    raw = getattr(imp, "arrays", {}).get(name)
    if raw is not None:
        return raw
    imp.fail(f"{what} ('{name}') must be known when the model is imported, not computed at run time")


def _qtype(imp, node, zp_index: int, default: str = "uint8") -> tuple[np.ndarray, str]:
    """The zero point (an array) and the quantized type it gives (uint8 where it is left out)."""
    name = imp.optional(node, zp_index)
    if name is None:
        return np.zeros((), default), default
    zp = known_array(imp, name, "the zero point")
    dtype = str(zp.dtype)
    if dtype not in QUANT_DTYPES:
        imp.fail(f"a zero point of type {dtype}: only uint8 and int8 quantization has a counterpart here")
    return zp, dtype


def per_tensor(imp, node, scale_index: int, zp_index: int, what: str) -> tuple[float, int, str]:
    """(scale, zero point, dtype) of a per-tensor quantization; refused where it is per axis."""
    scale = np.asarray(known_array(imp, node.input[scale_index], f"the {what} scale"), np.float32)
    zp, dtype = _qtype(imp, node, zp_index, _output_dtype(imp, node))
    if scale.size != 1 or zp.size != 1:
        imp.fail(f"the {what} is quantized per axis ({scale.size} scales); only weights are, here")
    s = float(scale.reshape(()))
    if not (np.isfinite(s) and s > 0):
        imp.fail(f"the {what} scale is {s}; a quantization scale must be positive and finite")
    return s, int(zp.reshape(())), dtype


def channel_scales(imp, scale_name: str, zp_name: str | None, channels: int, what: str) -> tuple[float, ...] | None:
    """One scale per output channel for a symmetric int8 weight (zero points all 0); None where
    the weight has other zero points."""
    scales = np.asarray(known_array(imp, scale_name, f"the {what} scale"), np.float32).reshape(-1)
    if zp_name is not None and np.any(known_array(imp, zp_name, f"the {what} zero point") != 0):
        return None
    if scales.size == 1:
        scales = np.repeat(scales, channels)
    if scales.size != channels:
        imp.fail(f"the {what} has {scales.size} scales for {channels} output channels")
    if not np.all(np.isfinite(scales) & (scales > 0)):
        imp.fail(f"the {what} has a scale that is not positive and finite")
    return tuple(float(s) for s in scales)


def _same(a: dict, scale: float, zp: int, dtype: str) -> bool:
    return a["scale"] == scale and a["zero_point"] == zp and a.get("dtype", dtype) == dtype


# -- QuantizeLinear / DequantizeLinear ----------------------------------------------------------------
def _per_axis(imp, node, x: Value, one):
    """A per-axis QuantizeLinear / DequantizeLinear of a computed value: ``one(slice, scale, zero
    point)`` for each index of the axis, concatenated (activations are quantized per tensor; this
    is for models that quantize a value per channel)."""
    if imp.attr(node, "block_size", 0):
        imp.fail("blocked quantization (block_size) has no counterpart here")
    axis = int(imp.attr(node, "axis", 1)) % x.rank
    scales = np.asarray(known_array(imp, node.input[1], "the scale"), np.float32).reshape(-1)
    zp, dtype = _qtype(imp, node, 2, _output_dtype(imp, node))
    zps = np.broadcast_to(zp.reshape(-1), scales.shape)
    if not isinstance(x.shape[axis], int) or x.shape[axis] != scales.size:
        imp.fail(f"{scales.size} scales for axis {axis} of a value of shape {list(x.shape)}")
    if not np.all(np.isfinite(scales) & (scales > 0)):
        imp.fail("a quantization scale that is not positive and finite")
    pieces = [one(imp.b.op("slice", x, axis=axis, start=i, stop=i + 1), float(scales[i]), int(zps[i]), dtype)
              for i in range(scales.size)]
    return pieces[0] if len(pieces) == 1 else imp.b.op("concat", *pieces, axis=axis)


def _output_dtype(imp, node) -> str:
    """QuantizeLinear's output_dtype attribute (opset 21), uint8 where neither it nor a zero point says."""
    number = imp.attr(node, "output_dtype", 0) if node.op_type == "QuantizeLinear" else 0
    if number in (0, None):
        return "uint8"
    from toolkit.onnxtypes import ONNX_ELEMENT_TYPES
    dtype = ONNX_ELEMENT_TYPES.get(number)
    if dtype not in QUANT_DTYPES:
        imp.fail("only uint8 and int8 quantization has a counterpart here")
    return dtype


@converts("QuantizeLinear")
def _quantize(imp, node):
    x = imp.value(node.input[0])
    if x.dtype not in FLOAT_DTYPES:
        imp.fail(f"input '{node.input[0]}' is {x.dtype}; QuantizeLinear quantizes floats")
    if np.size(known_array(imp, node.input[1], "the scale")) != 1:
        return [_per_axis(imp, node, x, lambda v, s, z, d: imp.b.op("quantize_linear", v, scale=s, zero_point=z,
                                                                    dtype=d))]
    scale, zp, dtype = per_tensor(imp, node, 1, 2, "value")
    quantized = _requantized(imp, x, scale, zp, dtype)
    if quantized is None:
        quantized = _int8_form(imp, x, {"y_scale": scale, "y_zero_point": zp, "out_dtype": dtype})
    if quantized is not None:
        return [quantized]
    return [imp.b.op("quantize_linear", x, scale=scale, zero_point=zp, dtype=dtype)]


def _dequantized_value(v: Value):
    """(the quantized value, scale, zero point) where ``v`` is a per-tensor dequantization."""
    node = v.producer
    if node is None or node.op != "dequantize_linear":
        return None
    return node.inputs[0], node.attrs["scale"], node.attrs["zero_point"]


def _int8_form(imp, x: Value, out: dict) -> Value | None:
    """A residual add (a ReLU after it folded in), a concatenation, average pooling or a global
    average pooling of dequantized values whose result is quantized, as the int8 op that computes
    it on the integers (qadd, qconcat, qavg_pool2d, qglobal_avg_pool: ONNX Runtime's QLinearAdd,
    QLinearConcat, QLinearAveragePool and QLinearGlobalAveragePool, which it fuses the same
    pattern into); else None."""
    node, relu = x.producer, False
    if node is not None and node.op == "relu":
        node, relu = node.inputs[0].producer, True
    if node is None:
        return None
    sources = [_dequantized_value(v) for v in node.inputs]
    if not sources or any(s is None for s in sources):
        return None
    b = imp.b
    if node.op == "add" and len(sources) == 2 and tuple(node.inputs[0].shape) == tuple(node.inputs[1].shape):
        (a, sa, za), (c, sc, zc) = sources
        return b.op("qadd", a, c, a_scale=sa, a_zero_point=za, b_scale=sc, b_zero_point=zc, relu=relu, **out)
    if relu:
        return None
    if node.op == "concat":
        return b.op("qconcat", *(q for q, _, _ in sources), axis=node.attrs["axis"],
                    x_scales=tuple(s for _, s, _ in sources), x_zero_points=tuple(z for _, _, z in sources), **out)
    (q, s, z), = sources[:1]
    a = node.attrs
    if node.op == "avg_pool2d":
        return b.op("qavg_pool2d", q, kernel=a["kernel"], stride=a["stride"], pad=a["pad"], ceil_mode=a["ceil_mode"],
                    count_include_pad=a["count_include_pad"], x_scale=s, x_zero_point=z, **out)
    if node.op == "reduce_mean" and q.rank == 4 and tuple(a["axes"]) == (2, 3):
        return b.op("qglobal_avg_pool", q, keepdims=bool(a.get("keepdims", True)), x_scale=s, x_zero_point=z, **out)
    return None


def _requantized(imp, x: Value, scale: float, zp: int, dtype: str) -> Value | None:
    """The quantized value that ``x`` is the dequantized form of, in the same scale and zero point
    (through reshapes, max pooling, and a ReLU the quantized op already applied), else None: a
    QuantizeLinear after a DequantizeLinear of the same parameters gives back its integers."""
    chain = []
    v = x
    while v.producer is not None and v.producer.op in COMMUTING + ("relu",):
        chain.append(v.producer)
        v = v.producer.inputs[0]
    node = v.producer
    if node is None or node.op != "dequantize_linear" or not _same(node.attrs, scale, zp, dtype):
        return None
    q = node.inputs[0]
    if q.dtype != dtype:
        return None
    for op_node in reversed(chain):
        if op_node.op == "relu":
            source = q.producer
            # max(q, zp) is q where the quantized op applied the ReLU itself
            if source is None or source.op not in ("qconv2d", "qgemm") or not source.attrs.get("relu"):
                return None
            continue
        q = imp.b.op(op_node.op, q, **op_node.attrs)
    return q


@converts("DequantizeLinear")
def _dequantize(imp, node):
    x = imp.value(node.input[0])
    if x.dtype not in QUANT_DTYPES:
        imp.fail(f"input '{node.input[0]}' is {x.dtype}, computed at run time: only uint8 and int8 values are "
                 "dequantized here")
    if np.size(known_array(imp, node.input[1], "the scale")) != 1:
        return [_per_axis(imp, node, x, lambda v, s, z, d: imp.b.op("dequantize_linear", v, scale=s,
                                                                    zero_point=z))]
    scale, zp, _dtype = per_tensor(imp, node, 1, 2, "value")
    if _dtype != x.dtype and imp.optional(node, 2) is not None:
        imp.fail(f"the zero point is {_dtype}, the input is {x.dtype}")
    return [imp.b.op("dequantize_linear", x, scale=scale, zero_point=zp)]


# -- the QDQ format: DequantizeLinear -> Conv / Gemm / MatMul -> QuantizeLinear -------------------------
def _dequantized_input(imp, name: str):
    """(the quantized value, scale, zero point) where ``name`` is a per-tensor dequantization."""
    v = imp.env.get(name)
    if not isinstance(v, Value) or v.producer is None or v.producer.op != "dequantize_linear":
        return None
    a = v.producer.attrs
    return v.producer.inputs[0], a["scale"], a["zero_point"]


def _int8_weight(imp, name: str, channel_axis: int):
    """(int8 weight, per-channel scales) where ``name`` is a DequantizeLinear of an int8 constant
    with zero points 0, per tensor or per ``channel_axis``; else None."""
    node = imp.producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or not is_const(imp.env.get(node.input[0])):
        return None
    w = imp.env[node.input[0]]
    if w.dtype != np.int8 or w.ndim < 2:
        return None
    scale = np.asarray(known_array(imp, node.input[1], "the weight scale"))
    axis = int(imp.attr(node, "axis", 1)) % w.ndim
    if scale.size != 1 and axis != channel_axis:
        return None
    scales = channel_scales(imp, node.input[1], imp.optional(node, 2), w.shape[channel_axis], "weight")
    return (w, scales) if scales is not None else None


def _int32_bias(imp, name: str | None, x_scale: float, w_scales: tuple, channels: int):
    """The bias as int32 sums in the scale x_scale * w_scale: a DequantizeLinear of int32 in that
    scale as it is (ONNX Runtime's), any other constant bias quantized; None where there is no
    bias, False where the bias is computed at run time."""
    if name is None:
        return None
    node = imp.producers.get(name)
    wanted = np.float64(x_scale) * np.asarray(w_scales, np.float64)
    if node is not None and node.op_type == "DequantizeLinear" and is_const(imp.env.get(node.input[0])):
        raw = imp.env[node.input[0]]
        scale = np.asarray(known_array(imp, node.input[1], "the bias scale"), np.float64).reshape(-1)
        zp = imp.optional(node, 2)
        zero = zp is None or not np.any(known_array(imp, zp, "the bias zero point"))
        if raw.dtype == np.int32 and raw.shape == (channels,) and zero and \
                np.allclose(scale, wanted, rtol=1e-6, atol=0):
            return raw
    bias = imp.env.get(name)
    if not is_const(bias) or bias.size != channels:
        return False
    from toolkit.ops.quant import quantize_bias
    try:
        return quantize_bias(np.asarray(bias, np.float64).reshape(-1), x_scale, w_scales)
    except ValueError:
        return False


def _output_form(imp, node) -> tuple[dict, bool]:
    """How a quantized op's output is stored: (out_dtype/y_scale/y_zero_point, relu), quantized
    where the node's one reader is a per-tensor QuantizeLinear, directly or through a Relu."""
    float_out = {"out_dtype": "float32"}, False
    if node.output[0] in imp.graph_outputs:      # the model gives the float value itself
        return float_out
    readers = imp.readers.get(node.output[0], [])
    relu = False
    if len(readers) == 1 and readers[0].op_type == "Relu":
        if readers[0].output[0] in imp.graph_outputs:
            return float_out
        relu = True
        readers = imp.readers.get(readers[0].output[0], [])
    if len(readers) != 1 or readers[0].op_type != "QuantizeLinear":
        return float_out
    try:
        scale, zp, dtype = per_tensor(imp, readers[0], 1, 2, "output")
    except NodeError:               # a scale computed at run time: the float output is quantized after
        return float_out
    return {"out_dtype": dtype, "y_scale": scale, "y_zero_point": zp}, relu


def _stored(imp, y: Value, out: dict) -> Value:
    """A quantized op's output as the float value the ONNX node gives (its QuantizeLinear then
    takes the integers back)."""
    if out["out_dtype"] == "float32":
        return y
    return imp.b.op("dequantize_linear", y, scale=out["y_scale"], zero_point=out["y_zero_point"])


def conv_geometry(imp, node, x: Value, w_shape) -> dict:
    """qconv2d's stride, pad, dilation and group from the node; unequal padding is refused (a
    quantized image is padded with its zero point on both sides alike)."""
    from ..windows import spatial_pads
    if x.rank != 4 or len(w_shape) != 4:
        imp.fail("a quantized convolution of 2-d images only ([N, C, H, W])")
    kernel = [int(k) for k in w_shape[2:]]
    strides = [int(s) for s in imp.attr(node, "strides", [1, 1])]
    dilations = [int(d) for d in imp.attr(node, "dilations", [1, 1])]
    begin, end = spatial_pads(imp, node, x, kernel, strides, dilations)
    if begin != end:
        imp.fail(f"a quantized convolution padded unequally ({begin} before, {end} after) has no counterpart here")
    return dict(stride=tuple(strides), pad=tuple(int(p) for p in begin), dilation=tuple(dilations),
                group=int(imp.attr(node, "group", 1)))


def qdq_conv(imp, node) -> list | None:
    """A Conv reading a dequantized input and a dequantized int8 weight as one qconv2d; None
    where the pattern does not hold (the float Conv then computes it)."""
    source = _dequantized_input(imp, node.input[0])
    if source is None:
        return None
    xq, x_scale, x_zp = source
    weight = _int8_weight(imp, node.input[1], 0)
    if weight is None or xq.rank != 4 or weight[0].ndim != 4:
        return None
    w, w_scales = weight
    bias = _int32_bias(imp, imp.optional(node, 2), x_scale, w_scales, w.shape[0])
    if bias is False:
        return None
    geometry = conv_geometry(imp, node, xq, w.shape)
    out, relu = _output_form(imp, node)
    inputs = [xq, imp.b.op("constant", value=np.ascontiguousarray(w))]
    if bias is not None:
        inputs.append(imp.b.op("constant", value=np.asarray(bias, np.int32)))
    y = imp.b.op("qconv2d", *inputs, **geometry, x_scale=x_scale, x_zero_point=x_zp, w_scales=w_scales,
                 relu=relu, **out)
    return [_stored(imp, y, out)]


def qdq_product(imp, node) -> list | None:
    """A Gemm (alpha 1, A not transposed) or a MatMul of a 2-d dequantized input by a dequantized
    int8 weight as one qgemm; None where the pattern does not hold."""
    source = _dequantized_input(imp, node.input[0])
    if source is None or source[0].rank != 2:
        return None
    xq, x_scale, x_zp = source
    gemm = node.op_type == "Gemm"
    if gemm and (imp.attr(node, "transA", 0) or float(imp.attr(node, "alpha", 1.0)) != 1.0):
        return None
    trans_b = bool(imp.attr(node, "transB", 0)) if gemm else False
    weight = _int8_weight(imp, node.input[1], 0 if trans_b else 1)
    if weight is None or weight[0].ndim != 2:
        return None
    w, w_scales = weight
    w_rows = w if trans_b else w.T                 # qgemm's b is [N, K]
    channels = w_rows.shape[0]
    bias_name = imp.optional(node, 2) if gemm else None
    if bias_name is not None and float(imp.attr(node, "beta", 1.0)) != 1.0:
        return None
    if bias_name is not None:
        b = imp.env.get(bias_name)
        if not (is_const(b) and b.size == channels) and imp.producers.get(bias_name) is None:
            return None
    bias = _int32_bias(imp, bias_name, x_scale, w_scales, channels)
    if bias is False:
        return None
    out, relu = _output_form(imp, node)
    inputs = [xq, imp.b.op("constant", value=np.ascontiguousarray(w_rows))]
    if bias is not None:
        inputs.append(imp.b.op("constant", value=np.asarray(bias, np.int32)))
    y = imp.b.op("qgemm", *inputs, a_scale=x_scale, a_zero_point=x_zp, b_scales=w_scales, relu=relu, **out)
    return [_stored(imp, y, out)]

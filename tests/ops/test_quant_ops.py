"""The int8 ops' references (toolkit/ops/quant.py) against ONNX Runtime on the same inputs:
QuantizeLinear and DequantizeLinear exactly; the integer sums of qconv2d and qgemm exactly
against ConvInteger and MatMulInteger (per output channel weights, uint8 and int8 activations,
padding with a nonzero zero point, groups, depthwise, stride, dilation); the requantized outputs
against QLinearConv and QLinearMatMul within one step (ONNX Runtime forms the output scale in
float32, the toolkit in float64 then rounds: a product can differ in its last bit); the weight
quantization against ONNX Runtime's own quantize_data; and the shape rules' messages.

The weights fed to ONNX Runtime's integer kernels are 7-bit (|w| <= 63): on an AVX2 processor
without VNNI its u8 x s8 kernels sum pairs of products with vpmaddubsw, which saturates at 32767
(255 * 127 * 2 does not fit), so full-range weights give it wrong results (measured on this
machine's AMD EPYC: MatMulInteger's sums off by up to 51311 in 70% of the outputs, QLinearConv's
outputs off by up to 8 steps; ConvInteger exact); its own quantizer's ``reduce_range`` exists for
that. The full range is checked against numpy's int64 sums in tests/kernels/test_quant_kernels.py."""
from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import quant_utils  # noqa: E402

from toolkit.ir.graph import Graph, TensorType, Value  # noqa: E402
from toolkit.ops import Builder, ShapeError  # noqa: E402
from toolkit.ops.interpreter import interpret  # noqa: E402
from toolkit.ops.quant import (  # noqa: E402
    dequantize_linear_reference,
    qconv2d_accumulate,
    qconv2d_reference,
    qgemm_accumulate,
    qgemm_reference,
    quantize_bias,
    quantize_linear_reference,
    quantize_weights,
)

ONNX_TYPES = {np.dtype("uint8"): TensorProto.UINT8, np.dtype("int8"): TensorProto.INT8,
              np.dtype("float32"): TensorProto.FLOAT, np.dtype("int32"): TensorProto.INT32}


def run_ort(op: str, feeds: list, constants: list, out_type: int, **attrs) -> np.ndarray:
    """One ONNX node run by ONNX Runtime: ``feeds`` and ``constants`` are (name, array) in the
    node's input order (the constants after the feeds); an empty name is an absent input."""
    names = [n for n, _ in feeds] + [n for n, _ in constants]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, ONNX_TYPES[a.dtype], a.shape) for n, a in feeds],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(a, n) for n, a in constants if n])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))[0]


def interpret_op(op: str, arrays, **attrs):
    """The op as a one-node graph, run by the reference interpreter (the type rule checked too)."""
    graph = Graph("test")
    values = []
    for i, a in enumerate(arrays):
        v = Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{i}")
        graph.inputs[f"x{i}"] = v
        values.append(v)
    y = Builder(graph, "q").op(op, *values, **attrs)
    graph.outputs["y"] = y
    out = interpret(graph, {f"x{i}": a for i, a in enumerate(arrays)}, {})[0]["y"]
    assert out.dtype == np.dtype(y.dtype) and out.shape == tuple(y.shape)
    return out


def _zp(dtype, value):
    return np.array(value, dtype=dtype)


# -- quantize / dequantize ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,zero_point", [("uint8", 0), ("uint8", 131), ("int8", 0), ("int8", -17)])
def test_quantize_linear_equals_onnx_runtime(dtype, zero_point):
    rng = np.random.default_rng(1)
    scale = 0.0371
    x = (rng.standard_normal(500) * 3).astype(np.float32)
    # ties at every half step (round half to even decides them), and values far outside the range
    ties = (np.arange(-8, 8) + 0.5).astype(np.float32) * np.float32(0.5)
    x = np.concatenate([x, ties / np.float32(0.5) * np.float32(scale), np.float32([-1e6, 1e6, 0.0])])
    scale = 0.5 if dtype == "uint8" else scale     # exact ties for one of each
    expected = run_ort("QuantizeLinear", [("x", x)], [("s", np.float32(scale)), ("z", _zp(dtype, zero_point))],
                       ONNX_TYPES[np.dtype(dtype)])
    got = interpret_op("quantize_linear", [x], scale=scale, zero_point=zero_point, dtype=dtype)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(quantize_linear_reference(x, scale, zero_point, dtype), expected)


def test_quantize_linear_rounds_half_to_even():
    x = np.float32([0.5, 1.5, 2.5, -0.5, -1.5, -2.5])
    got = quantize_linear_reference(x, 1.0, 10, "uint8")
    np.testing.assert_array_equal(got, [10, 12, 12, 10, 8, 8])


@pytest.mark.parametrize("dtype,zero_point", [("uint8", 0), ("uint8", 200), ("int8", -128), ("int8", 5)])
def test_dequantize_linear_equals_onnx_runtime(dtype, zero_point):
    info = np.iinfo(dtype)
    q = np.arange(info.min, info.max + 1).astype(dtype)
    scale = 0.0123
    expected = run_ort("DequantizeLinear", [("q", q)], [("s", np.float32(scale)), ("z", _zp(dtype, zero_point))],
                       TensorProto.FLOAT)
    got = interpret_op("dequantize_linear", [q], scale=scale, zero_point=zero_point)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(dequantize_linear_reference(q, scale, zero_point), expected)


# -- qconv2d ------------------------------------------------------------------------------------------
# (x dtype, x zero point, x shape, weight shape, group, stride, pad, dilation)
CONV_CASES = [
    ("uint8", 131, (2, 4, 7, 6), (6, 4, 3, 3), 1, (1, 1), (1, 1), (1, 1)),
    ("uint8", 255, (1, 3, 9, 9), (5, 3, 3, 3), 1, (2, 2), (2, 1), (1, 1)),       # pad > 1, zp at the top
    ("int8", -20, (2, 4, 8, 8), (8, 2, 3, 3), 2, (1, 2), (1, 1), (2, 1)),        # grouped, dilated
    ("uint8", 7, (1, 6, 6, 7), (6, 1, 3, 3), 6, (1, 1), (1, 1), (1, 1)),         # depthwise
    ("int8", 0, (1, 4, 5, 5), (12, 1, 3, 3), 4, (2, 2), (1, 1), (1, 1)),         # depthwise x3 multiplier
    ("uint8", 90, (3, 5, 4, 4), (7, 5, 1, 1), 1, (1, 1), (0, 0), (1, 1)),        # 1x1
    ("int8", 3, (1, 3, 1, 1), (2, 3, 1, 1), 1, (1, 1), (0, 0), (1, 1)),          # a 1x1 image
]


def _conv_inputs(case, seed=0):
    dtype, zp, xs, ws, group, stride, pad, dilation = case
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, xs).astype(dtype)
    w = rng.integers(-63, 64, ws).astype(np.int8)          # 7-bit: see the module's docstring
    bias = rng.integers(-20000, 20000, ws[0]).astype(np.int32)
    attrs = dict(stride=stride, pad=pad, dilation=dilation, group=group)
    return x, w, bias, attrs


def _onnx_conv_attrs(attrs):
    (ph, pw) = attrs["pad"]
    return dict(pads=[ph, pw, ph, pw], strides=list(attrs["stride"]), dilations=list(attrs["dilation"]),
                group=attrs["group"])


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}-{c[3]}-g{c[4]}")
def test_qconv2d_sums_equal_conv_integer(case):
    x, w, bias, attrs = _conv_inputs(case)
    zp = case[1]
    expected = run_ort("ConvInteger", [("x", x)], [("w", w), ("xz", _zp(x.dtype, zp))], TensorProto.INT32,
                       **_onnx_conv_attrs(attrs))
    acc = qconv2d_accumulate(x, w, None, attrs["stride"], attrs["pad"], attrs["dilation"], attrs["group"], zp)
    np.testing.assert_array_equal(acc, expected)
    with_bias = qconv2d_accumulate(x, w, bias, attrs["stride"], attrs["pad"], attrs["dilation"], attrs["group"], zp)
    np.testing.assert_array_equal(with_bias, expected + bias.reshape(1, -1, 1, 1))
    # ConvInteger is exact with full-range weights too (-128 included)
    w = np.random.default_rng(9).integers(-128, 128, w.shape).astype(np.int8)
    expected = run_ort("ConvInteger", [("x", x)], [("w", w), ("xz", _zp(x.dtype, zp))], TensorProto.INT32,
                       **_onnx_conv_attrs(attrs))
    acc = qconv2d_accumulate(x, w, None, attrs["stride"], attrs["pad"], attrs["dilation"], attrs["group"], zp)
    np.testing.assert_array_equal(acc, expected)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}-{c[3]}-g{c[4]}")
def test_qconv2d_equals_qlinearconv_within_one_step(case):
    x, w, bias, attrs = _conv_inputs(case, seed=1)
    out_dtype = case[0]               # ONNX Runtime's QLinearConv has no mixed input/output types
    zp, o = case[1], case[3][0]
    rng = np.random.default_rng(2)
    x_scale = 0.021
    w_scales = tuple(float(s) for s in rng.uniform(0.002, 0.02, o).astype(np.float32))
    y_zp = 40 if out_dtype == "uint8" else -9
    # an output scale that spreads the outputs over the range, clamping a few
    y_scale = float(np.abs(qconv2d_reference(x, w, bias, **attrs, x_scale=x_scale, x_zero_point=zp,
                                             w_scales=w_scales)).max()) / 150
    got = interpret_op("qconv2d", [x, w, bias], **attrs, x_scale=x_scale, x_zero_point=zp, w_scales=w_scales,
                       relu=False, out_dtype=out_dtype, y_scale=y_scale, y_zero_point=y_zp)
    expected = run_ort("QLinearConv", [("x", x)], [
        ("xs", np.float32(x_scale)), ("xz", _zp(x.dtype, zp)), ("w", w), ("ws", np.float32(w_scales)),
        ("wz", np.zeros(o, np.int8)), ("ys", np.float32(y_scale)), ("yz", _zp(out_dtype, y_zp)), ("b", bias)],
        ONNX_TYPES[np.dtype(out_dtype)], **_onnx_conv_attrs(attrs))
    diff = np.abs(got.astype(np.int32) - expected.astype(np.int32))
    assert diff.max() <= 1
    assert (diff == 0).mean() >= 0.99
    # not trivially so: the outputs span the range
    assert len(np.unique(got)) > min(20, got.size // 2)


def test_qconv2d_requantizes_as_defined():
    """The float32 steps, written out per element in Python floats rounded to float32."""
    x, w, bias, attrs = _conv_inputs(CONV_CASES[0], seed=3)
    acc = qconv2d_accumulate(x, w, bias, attrs["stride"], attrs["pad"], attrs["dilation"], attrs["group"], 131)
    w_scales = tuple(np.random.default_rng(4).uniform(0.001, 0.01, 6))
    common = dict(**attrs, x_scale=0.02, x_zero_point=131, w_scales=w_scales)
    f32 = np.float32
    for relu in (False, True):
        y = qconv2d_reference(x, w, bias, **common, relu=relu, out_dtype="float32")
        q = qconv2d_reference(x, w, bias, **common, relu=relu, out_dtype="uint8", y_scale=0.3, y_zero_point=100)
        for idx in [(0, 0, 0, 0), (1, 5, 6, 5), (0, 3, 2, 1), (1, 2, 3, 4)] + \
                [tuple(i) for i in np.argwhere(acc < 0)[:5]]:
            o = idx[1]
            v = f32(acc[idx]) * f32(0.02 * w_scales[o])
            assert y[idx] == (max(v, f32(0)) if relu else v)
            m = f32(0.02 * w_scales[o] / 0.3)
            qv = int(np.rint(f32(acc[idx]) * m)) + 100
            qv = max(qv, 100) if relu else qv
            assert q[idx] == min(max(qv, 0), 255)


# -- qgemm --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,zp,m,k,n", [("uint8", 128, 4, 37, 5), ("int8", -3, 1, 8, 1), ("uint8", 0, 9, 1, 3)])
def test_qgemm_sums_equal_matmul_integer(dtype, zp, m, k, n):
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(dtype)
    b = rng.integers(-63, 64, (n, k)).astype(np.int8)
    bias = rng.integers(-1000, 1000, n).astype(np.int32)
    expected = run_ort("MatMulInteger", [("a", a)], [("b", np.ascontiguousarray(b.T)), ("az", _zp(dtype, zp))],
                       TensorProto.INT32)
    np.testing.assert_array_equal(qgemm_accumulate(a, b, None, zp), expected)
    np.testing.assert_array_equal(qgemm_accumulate(a, b, bias, zp), expected + bias)


@pytest.mark.parametrize("dtype,out_dtype", [("uint8", "uint8"), ("int8", "int8")])   # ORT: same types only
def test_qgemm_equals_qlinearmatmul_within_one_step(dtype, out_dtype):
    rng = np.random.default_rng(6)
    info = np.iinfo(dtype)
    m, k, n = 7, 300, 11
    a = rng.integers(info.min, info.max + 1, (m, k)).astype(dtype)
    b = rng.integers(-63, 64, (n, k)).astype(np.int8)
    a_zp, y_zp = (100, 30) if dtype == "uint8" else (-5, -7)
    y_zp = 30 if out_dtype == "uint8" else -7
    b_scale = 0.0093
    got = interpret_op("qgemm", [a, b], a_scale=0.017, a_zero_point=a_zp, b_scales=(b_scale,) * n, relu=False,
                       out_dtype=out_dtype, y_scale=0.05, y_zero_point=y_zp)
    expected = run_ort("QLinearMatMul", [("a", a)], [
        ("as", np.float32(0.017)), ("az", _zp(dtype, a_zp)), ("b", np.ascontiguousarray(b.T)),
        ("bs", np.float32(b_scale)), ("bz", np.int8(0)), ("ys", np.float32(0.05)), ("yz", _zp(out_dtype, y_zp))],
        ONNX_TYPES[np.dtype(out_dtype)])
    diff = np.abs(got.astype(np.int32) - expected.astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.95
    assert len(np.unique(got)) > 20


def test_qgemm_float_output_and_relu():
    a = np.array([[1, 2], [3, 0]], np.uint8)
    b = np.array([[10, -20], [-1, 1]], np.int8)
    bias = np.array([5, -100], np.int32)
    y = qgemm_reference(a, b, bias, a_scale=0.5, a_zero_point=1, b_scales=(0.25, 1.0), relu=True)
    # acc = [[0*10 + 1*-20 + 5, 0*-1 + 1*1 - 100], [2*10 + -1*-20 + 5, 2*-1 + -1*1 - 100]]
    np.testing.assert_array_equal(y, np.float32([[0, 0], [45 * 0.125, 0]]))


def test_int32_overflow_is_an_error():
    a = np.full((1, 4), 255, np.uint8)
    b = np.full((1, 4), -128, np.int8)
    bias = np.array([-2 ** 31 + 1], np.int32)         # -130560 + bias < -2**31
    with pytest.raises(ValueError, match="int32 accumulator overflows"):
        qgemm_accumulate(a, b, bias, 0)


# -- weights and bias ----------------------------------------------------------------------------------
def test_quantize_weights_equals_onnx_runtime_per_channel():
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((6, 3, 3, 3)) * rng.uniform(0.01, 2, (6, 1, 1, 1))).astype(np.float32)
    w[4] = 0.0                                    # an all-zero channel: scale 1, zeros
    wq, scales = quantize_weights(w)
    assert wq.dtype == np.int8 and len(scales) == 6 and scales[4] == 1.0
    assert np.abs(wq).max() == 127 and wq.min() >= -127
    for o in range(6):
        if o == 4:
            assert not wq[4].any()
            continue
        _zp_o, scale, q = quant_utils.quantize_data(w[o].ravel(), TensorProto.INT8, symmetric=True)
        assert scales[o] == pytest.approx(float(scale), rel=1e-6)
        np.testing.assert_array_equal(wq[o].ravel(), q)
    # dequantized, each weight within half a step of itself
    back = wq.astype(np.float64) * np.asarray(scales).reshape(-1, 1, 1, 1)
    assert (np.abs(back - w) <= np.asarray(scales).reshape(-1, 1, 1, 1) / 2 + 1e-9).all()


def test_quantize_bias():
    got = quantize_bias(np.float32([1.0, -0.25, 0.0, 0.3]), 0.5, (0.1, 0.05, 1.0, 0.2))
    # 1 / 0.05 = 20, -0.25 / 0.025 = -10, 0, 0.3 / 0.1 = 3 (float32 0.3 is 0.30000001...)
    np.testing.assert_array_equal(got, np.int32([20, -10, 0, 3]))
    assert got.dtype == np.int32
    with pytest.raises(ValueError, match="leaves int32"):
        quantize_bias(np.float32([1e6]), 1e-5, (1e-5,))


# -- shape and attribute rules ----------------------------------------------------------------------
def _infer(op, types, **attrs):
    graph = Graph("t")
    values = [Value(TensorType(shape, dtype), name=f"x{i}") for i, (shape, dtype) in enumerate(types)]
    return Builder(graph, "q").op(op, *values, **attrs)


CONV = dict(stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1, x_scale=0.1, x_zero_point=3, w_scales=(0.1, 0.2))


@pytest.mark.parametrize("types,attrs,message", [
    ([((1, 3, 4, 4), "float32"), ((2, 3, 1, 1), "int8")], {}, "qconv2d input must be int8 or uint8, got float32"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "uint8")], {}, "weight must be int8"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "int8"), ((2,), "float32")], {}, "bias must be int32"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "int8"), ((3,), "int32")], {}, r"bias has shape \[3\], expected \[2\]"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "int8")], {"w_scales": (0.1,)}, "one scale per output channel"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "int8")], {"x_zero_point": 300}, r"in \[0, 255\] for uint8"),
    ([((1, 3, 4, 4), "int8"), ((2, 3, 1, 1), "int8")], {"x_zero_point": 200}, r"in \[-128, 127\] for int8"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "int8")], {"x_scale": 0.0}, "x_scale must be a positive"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "int8")], {"out_dtype": "int32"}, "out_dtype must be one of"),
    ([((1, 3, 4, 4), "uint8"), ((2, 3, 1, 1), "int8")], {"out_dtype": "uint8"}, "y_scale must be a positive"),
    ([((1, 4, 4, 4), "uint8"), ((2, 3, 1, 1), "int8")], {}, "input has 4 channels"),
])
def test_qconv2d_shape_rules(types, attrs, message):
    with pytest.raises(ShapeError, match=message):
        _infer("qconv2d", types, **{**CONV, **attrs})


def test_shape_rules_of_the_others():
    with pytest.raises(ShapeError, match="inner dimensions differ"):
        _infer("qgemm", [((2, 5), "uint8"), ((3, 4), "int8")], a_scale=0.1, a_zero_point=0, b_scales=(1.0,) * 3)
    with pytest.raises(ShapeError, match="quantize_linear input must be a float type"):
        _infer("quantize_linear", [((2,), "int32")], scale=0.1, zero_point=0, dtype="uint8")
    with pytest.raises(ShapeError, match="dtype must be int8 or uint8"):
        _infer("quantize_linear", [((2,), "float32")], scale=0.1, zero_point=0, dtype="int16")
    with pytest.raises(ShapeError, match="dequantize_linear input must be int8 or uint8"):
        _infer("dequantize_linear", [((2,), "float32")], scale=0.1, zero_point=0)
    y = _infer("qgemm", [((2, 5), "int8"), ((3, 5), "int8"), ((3,), "int32")], a_scale=0.1, a_zero_point=-4,
               b_scales=(1.0,) * 3, out_dtype="uint8", y_scale=0.5, y_zero_point=7, relu=True)
    assert (y.shape, y.dtype) == ((2, 3), "uint8")

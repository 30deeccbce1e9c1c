"""The int8 kernels (toolkit/kernels/cpu/quant.py, toolkit/kernels/native/quant.py and, on an AVX2
processor, the packed kernels of toolkit/kernels/native/quant_packed.py) bit for bit against an
independent integer reference: numpy int64 sums over explicit windows (no im2col, no float GEMM),
requantized element by element with numpy float32 scalars. Random shapes reach each edge of the
tiles (the portable 1 row x 4 columns, the packed 6 channels x 16 positions): M = 1, N = 1, odd
rows and columns, K = 1 and K not a multiple of 16, odd channel counts, 1x1, 3x3, depthwise,
grouped, stride, dilation, padding with a nonzero zero point, full-range weights (-128 included)
and activations; float32 and uint8/int8 outputs, with and without ReLU and bias; weights given at
run time and frozen (packed when the plan is built); one and two threads."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit import settings
from toolkit.codegen import toolchain
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.kernels.native import quant_packed
from toolkit.ops import Builder
from toolkit.runtime.plan import Plan, RuntimeState

HAVE_CC = toolchain.compiler() is not None
RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


@pytest.fixture(autouse=True)
def native_on():
    """The suite runs numpy kernels by default (tests/conftest.py); these tests run both."""
    with settings.use(native=True):
        yield


def run_plan(nodes, native, threads=1):
    """One plan over every (op, arrays, attrs) of ``nodes`` (one compiler run for all of them):
    their outputs, and the plan's kernel kinds."""
    graph = Graph("test")
    feeds = {}
    for j, (op, arrays, attrs) in enumerate(nodes):
        values = []
        for i, a in enumerate(arrays):
            v = Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{j}_{i}")
            graph.inputs[v.name] = v
            feeds[v.name] = a
            values.append(v)
        graph.outputs[f"y{j}"] = Builder(graph, f"q{j}").op(op, *values, **attrs)
    plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(0)), native=native, threads=threads)
    outs = plan.run(feeds)
    return [np.array(outs[f"y{j}"]) for j in range(len(nodes))], plan.impls


def check(nodes, expected, native):
    """The numpy kernels on one thread, the native ones on two (their tiles split between the
    threads), each output equal to its expected array, dtype included."""
    got, impls = run_plan(nodes, native, threads=2 if native else 1)
    assert set(impls) == ({"native"} if native else {"numpy"}), impls
    for (op, _, attrs), g, e in zip(nodes, got, expected):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(g, e, err_msg=f"{op} {attrs}")


# -- the independent reference ------------------------------------------------------------------------
def conv_sums(x, w, bias, stride, pad, dilation, group, zp):
    """int64 sums over each output's window, padding = the zero point (so contributes 0)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h + 2 * pad[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    xp = np.full((n, c, h + 2 * pad[0], wd + 2 * pad[1]), zp, dtype=np.int64)
    xp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd] = x
    xp -= zp
    acc = np.zeros((n, o, oh, ow), dtype=np.int64)
    og = o // group
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                r0, c0 = i * stride[0], j * stride[1]
                win = xp[:, g * cg:(g + 1) * cg, r0:r0 + dilation[0] * (kh - 1) + 1:dilation[0],
                         c0:c0 + dilation[1] * (kw - 1) + 1:dilation[1]]
                acc[:, oc, i, j] = (win * w[oc].astype(np.int64)).sum(axis=(1, 2, 3))
    if bias is not None:
        acc += bias.reshape(1, -1, 1, 1)
    assert np.abs(acc).max() < 2 ** 31
    return acc


def requantize(acc, x_scale, w_scales, relu, out_dtype, y_scale=None, y_zp=None):
    """Element by element with numpy float32 scalars: the interface's definition."""
    out = np.empty(acc.shape, dtype=out_dtype)
    f32 = np.float32
    for idx in np.ndindex(*acc.shape):
        o = idx[1]
        if out_dtype == "float32":
            v = f32(acc[idx]) * f32(x_scale * w_scales[o])
            out[idx] = max(v, f32(0)) if relu else v
        else:
            q = int(np.rint(f32(acc[idx]) * f32(x_scale * w_scales[o] / y_scale))) + y_zp
            q = max(q, y_zp) if relu else q
            lo, hi = RANGE[out_dtype]
            out[idx] = min(max(q, lo), hi)
    return out


# -- cases --------------------------------------------------------------------------------------------
# (x dtype, zp, x shape, w shape, group, stride, pad, dilation)
CONV_SHAPES = [
    ("uint8", 128, (2, 5, 7, 9), (7, 5, 3, 3), 1, (1, 1), (1, 1), (1, 1)),
    ("uint8", 255, (1, 3, 5, 5), (1, 3, 3, 3), 1, (2, 1), (2, 2), (1, 1)),       # N = 1 output channel
    ("int8", -9, (3, 6, 6, 5), (9, 2, 3, 3), 3, (1, 1), (1, 0), (2, 1)),         # grouped, dilated
    ("uint8", 3, (2, 8, 9, 9), (8, 1, 3, 3), 8, (2, 2), (1, 1), (1, 1)),         # depthwise
    ("int8", 127, (1, 4, 6, 6), (8, 1, 5, 5), 4, (1, 1), (2, 2), (1, 1)),        # depthwise x2, 5x5
    ("int8", 5, (2, 3, 7, 8), (3, 1, 3, 3), 3, (1, 2), (2, 1), (2, 2)),          # depthwise, dilated
    ("uint8", 17, (2, 13, 5, 3), (6, 13, 1, 1), 1, (1, 1), (0, 0), (1, 1)),      # 1x1, K = 13
    ("int8", 0, (1, 1, 1, 1), (3, 1, 1, 1), 1, (1, 1), (0, 0), (1, 1)),          # K = 1, one position
    ("uint8", 77, (1, 35, 4, 4), (5, 35, 2, 2), 1, (1, 1), (0, 1), (1, 1)),      # K = 140, 2x2
]
OUTS = [("float32", False), ("float32", True), ("uint8", True), ("int8", False), ("uint8", False)]


def conv_inputs(case, seed):
    dtype, zp, xs, ws, group, stride, pad, dilation = case
    rng = np.random.default_rng(seed)
    lo, hi = RANGE[dtype]
    x = rng.integers(lo, hi + 1, xs).astype(dtype)
    x.flat[:3] = (lo, hi, zp)
    w = rng.integers(-128, 128, ws).astype(np.int8)
    w.flat[:2] = (-128, 127)
    bias = rng.integers(-30000, 30000, ws[0]).astype(np.int32)
    w_scales = tuple(float(s) for s in rng.uniform(0.002, 0.02, ws[0]))
    return x, w, bias, w_scales, dict(stride=stride, pad=pad, dilation=dilation, group=group)


def out_attrs(acc, x_scale, w_scales, out_dtype, relu):
    if out_dtype == "float32":
        return dict(out_dtype="float32", relu=relu)
    # spread the outputs over the range, clamping some at both ends
    peak = float(np.abs(acc).max()) * x_scale * max(w_scales)
    return dict(out_dtype=out_dtype, relu=relu, y_scale=peak / 200 or 1.0,
                y_zero_point=10 if out_dtype == "uint8" else -3)


NATIVE = [False, pytest.param(True, marks=pytest.mark.skipif(not HAVE_CC, reason="no C compiler"))]


@pytest.mark.parametrize("native", NATIVE)
def test_qconv2d_kernels_equal_the_integer_reference(native):
    nodes, expected = [], []
    for c, case in enumerate(CONV_SHAPES):
        x, w, bias, w_scales, attrs = conv_inputs(case, seed=c)
        zp, x_scale = case[1], 0.0173
        for k, (out_dtype, relu) in enumerate(OUTS):
            with_bias = (k + c) % 2 == 0
            acc = conv_sums(x, w, bias if with_bias else None, attrs["stride"], attrs["pad"], attrs["dilation"],
                            attrs["group"], zp)
            oa = out_attrs(acc, x_scale, w_scales, out_dtype, relu)
            expected.append(requantize(acc, x_scale, w_scales, relu, out_dtype, oa.get("y_scale"),
                                       oa.get("y_zero_point")))
            if out_dtype != "float32":
                assert len(np.unique(expected[-1])) > min(5, expected[-1].size // 4)
            nodes.append(("qconv2d", [x, w, bias] if with_bias else [x, w],
                          dict(**attrs, x_scale=x_scale, x_zero_point=zp, w_scales=w_scales, **oa)))
    check(nodes, expected, native)


# (a dtype, zp, M, K, N)
GEMM_SHAPES = [("uint8", 128, 1, 64, 10), ("int8", -5, 7, 37, 1), ("uint8", 0, 5, 1, 6), ("int8", 127, 1, 1, 1),
               ("uint8", 201, 67, 130, 70), ("int8", 0, 2, 300, 4)]


@pytest.mark.parametrize("native", NATIVE)
def test_qgemm_kernels_equal_the_integer_reference(native):
    nodes, expected = [], []
    for c, (dtype, zp, m, k, n) in enumerate(GEMM_SHAPES):
        rng = np.random.default_rng(c)
        lo, hi = RANGE[dtype]
        a = rng.integers(lo, hi + 1, (m, k)).astype(dtype)
        b = rng.integers(-128, 128, (n, k)).astype(np.int8)
        bias = rng.integers(-30000, 30000, n).astype(np.int32)
        b_scales = tuple(float(s) for s in rng.uniform(0.002, 0.02, n))
        a_scale = 0.031
        for j, (out_dtype, relu) in enumerate(OUTS):
            with_bias = (j + c) % 2 == 1
            acc = (a.astype(np.int64) - zp) @ b.astype(np.int64).T + (bias if with_bias else 0)
            oa = out_attrs(acc, a_scale, b_scales, out_dtype, relu)
            expected.append(requantize(acc, a_scale, b_scales, relu, out_dtype, oa.get("y_scale"),
                                       oa.get("y_zero_point")))
            nodes.append(("qgemm", [a, b, bias] if with_bias else [a, b],
                          dict(a_scale=a_scale, a_zero_point=zp, b_scales=b_scales, **oa)))
    check(nodes, expected, native)


@pytest.mark.parametrize("native", NATIVE)
def test_quantize_dequantize_kernels_equal_the_references(native):
    from toolkit.ops.quant import dequantize_linear_reference, quantize_linear_reference
    rng = np.random.default_rng(3)
    # 40006 values: the native kernel's chunks of 16384 and a tail
    x = np.concatenate([(rng.standard_normal(40000) * 4).astype(np.float32),
                        np.float32([1e9, -1e9, 0.25, 0.75, -0.25, 2.5])]).reshape(2, -1)
    x[0, :4] = (np.nan, np.inf, -np.inf, 2.5e-9)         # NaN to 0 (numpy's cast), the infinities clamped
    nodes, expected = [], []
    for dtype, zp, scale in (("uint8", 0, 0.031), ("uint8", 140, 0.5), ("int8", -20, 0.031)):
        q = quantize_linear_reference(x, scale, zp, dtype)
        nodes += [("quantize_linear", [x], dict(scale=scale, zero_point=zp, dtype=dtype)),
                  ("dequantize_linear", [q], dict(scale=scale, zero_point=zp))]
        expected += [q, dequantize_linear_reference(q, scale, zp)]
    got, impls = run_plan(nodes, native)
    assert impls == ["native" if native else "numpy"] * 6
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


# -- the packed AVX2 kernels (kernels/native/quant_packed.py) with frozen weights ---------------------
PACKED = pytest.mark.skipif(not (HAVE_CC and quant_packed.available()), reason="no C compiler or no AVX2")
# (x dtype, zp, x shape, w shape, group, stride, pad, dilation): stride 1 reads the packed planes
# in place (positions on the padded width, in blocks of 256) unless that costs over a quarter
# more tiles (small images), other convolutions gather blocks of windows; output channels not a
# multiple of the tile's 6, odd channel counts (a pair's empty half), positions not a multiple
# of 16, depthwise in and out of its vector path
PACKED_CONV_SHAPES = [
    ("uint8", 3, (2, 6, 9, 21), (13, 6, 3, 3), 1, (1, 1), (1, 1), (1, 1)),
    ("int8", 100, (1, 4, 30, 30), (7, 4, 3, 3), 1, (1, 1), (1, 1), (1, 1)),      # 4 blocks of positions
    ("int8", -7, (1, 5, 10, 7), (8, 5, 3, 3), 1, (2, 2), (1, 1), (1, 1)),        # gathered, odd C
    ("uint8", 90, (1, 3, 40, 40), (6, 3, 3, 3), 1, (2, 1), (1, 0), (1, 1)),      # gathered, 2 blocks
    ("uint8", 200, (2, 9, 6, 20), (9, 3, 3, 3), 3, (1, 1), (2, 2), (2, 2)),      # grouped, dilated
    ("uint8", 1, (2, 6, 9, 11), (13, 6, 3, 3), 1, (1, 1), (1, 1), (1, 1)),       # rows of 11 in place
    ("int8", 4, (3, 6, 4, 4), (13, 6, 3, 3), 1, (1, 1), (1, 1), (1, 1)),         # 4 x 4: gathered
    ("uint8", 0, (1, 32, 17, 5), (20, 32, 1, 1), 1, (1, 1), (0, 0), (1, 1)),     # 1x1
    ("int8", 9, (1, 7, 9, 9), (5, 7, 1, 1), 1, (2, 2), (0, 0), (1, 1)),          # 1x1, stride 2
    ("uint8", 128, (1, 4, 20, 37), (4, 1, 3, 3), 4, (1, 1), (1, 1), (1, 1)),     # depthwise, vectors + tail
    ("int8", -128, (2, 3, 19, 23), (6, 1, 5, 5), 3, (2, 2), (2, 2), (1, 1)),     # depthwise x2, stride 2
]
# (a dtype, zp, M, K, N): from 4 rows on; odd K, blocks of 64 rows
PACKED_GEMM_SHAPES = [("uint8", 31, 37, 75, 23), ("int8", -1, 4, 2, 1), ("uint8", 255, 130, 33, 70)]


def frozen_plan(nodes, threads):
    """A plan of ``nodes`` (op, x, weight, bias or None, attrs) whose weights and biases are
    constants, as a quantized model's are: its outputs and the plan."""
    graph = Graph("frozen")
    feeds = {}
    for j, (op, x, w, bias, attrs) in enumerate(nodes):
        b = Builder(graph, f"q{j}")
        v = Value(TensorType(tuple(x.shape), str(x.dtype)), name=f"x{j}")
        graph.inputs[v.name], feeds[v.name] = v, x
        consts = [b.op("constant", value=w)] + ([b.op("constant", value=bias)] if bias is not None else [])
        graph.outputs[f"y{j}"] = b.op(op, v, *consts, **attrs)
    plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(0)), native=True, threads=threads)
    outs = plan.run(feeds)
    return [np.array(outs[f"y{j}"]) for j in range(len(nodes))], plan


@PACKED
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_kernels_with_frozen_weights_equal_the_integer_reference(threads):
    """The weights packed once as the plan is built (no packing step in the plan's C), every
    output equal to the integer reference."""
    nodes, expected = [], []
    for c, case in enumerate(PACKED_CONV_SHAPES):
        x, w, bias, w_scales, attrs = conv_inputs(case, seed=100 + c)
        zp, x_scale = case[1], 0.011
        out_dtype, relu = OUTS[c % len(OUTS)]
        with_bias = c % 3 != 1
        acc = conv_sums(x, w, bias if with_bias else None, attrs["stride"], attrs["pad"], attrs["dilation"],
                        attrs["group"], zp)
        oa = out_attrs(acc, x_scale, w_scales, out_dtype, relu)
        expected.append(requantize(acc, x_scale, w_scales, relu, out_dtype, oa.get("y_scale"), oa.get("y_zero_point")))
        nodes.append(("qconv2d", x, w, bias if with_bias else None,
                      dict(**attrs, x_scale=x_scale, x_zero_point=zp, w_scales=w_scales, **oa)))
    for c, (dtype, zp, m, k, n) in enumerate(PACKED_GEMM_SHAPES):
        rng = np.random.default_rng(200 + c)
        lo, hi = RANGE[dtype]
        a = rng.integers(lo, hi + 1, (m, k)).astype(dtype)
        b = rng.integers(-128, 128, (n, k)).astype(np.int8)
        b.flat[0] = -128
        bias = rng.integers(-30000, 30000, n).astype(np.int32)
        b_scales = tuple(float(s) for s in rng.uniform(0.002, 0.02, n))
        out_dtype, relu = OUTS[(c + 2) % len(OUTS)]
        acc = (a.astype(np.int64) - zp) @ b.astype(np.int64).T + (bias if c != 1 else 0)
        oa = out_attrs(acc, 0.02, b_scales, out_dtype, relu)
        expected.append(requantize(acc, 0.02, b_scales, relu, out_dtype, oa.get("y_scale"), oa.get("y_zero_point")))
        nodes.append(("qgemm", a, b, bias if c != 1 else None,
                      dict(a_scale=0.02, a_zero_point=zp, b_scales=b_scales, **oa)))
    got, plan = frozen_plan(nodes, threads)
    assert set(plan.impls) == {"native"}, plan.impls
    source = plan.native_source
    for fn in ("tk_q8_conv_direct", "tk_q8_conv_gather", "tk_q8_dw_plane", "tk_q8_qgemm_rows"):
        assert f"{fn}(wp" in source or f"{fn}(x" in source or f"{fn}(a" in source, fn
    assert source.count("tk_q8_pack_weight(") == 1       # its definition: no step packs a weight per run
    for (op, _, _, _, attrs), g, e in zip(nodes, got, expected):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(g, e, err_msg=f"{op} {attrs}")


@PACKED
def test_weights_given_at_run_time_are_packed_by_the_plan():
    """A weight fed at run time is packed by a step of the plan on every run (the frozen case's
    packing in numpy and this one in C give the same words)."""
    case = PACKED_CONV_SHAPES[2]
    x, w, bias, w_scales, attrs = conv_inputs(case, seed=7)
    attrs = dict(**attrs, x_scale=0.01, x_zero_point=case[1], w_scales=w_scales, out_dtype="float32")
    graph_nodes = [("qconv2d", [x, w, bias], attrs)]
    (got,), _ = run_plan(graph_nodes, True)
    (frozen,), plan = frozen_plan([("qconv2d", x, w, bias, attrs)], 1)
    acc = conv_sums(x, w, bias, attrs["stride"], attrs["pad"], attrs["dilation"], attrs["group"], case[1])
    want = requantize(acc, 0.01, w_scales, False, "float32")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(frozen, want)


@pytest.mark.parametrize("native", NATIVE)
def test_int8_max_pooling_kernels_equal_the_reference(native):
    """Max pooling of uint8 and int8 (a quantized net's pools): padding is the type's least value,
    so a window's maximum is its largest element inside the image; ragged edges (ceil mode)."""
    rng = np.random.default_rng(11)
    nodes, expected = [], []
    for dtype in ("uint8", "int8"):
        lo, hi = RANGE[dtype]
        x = rng.integers(lo, hi + 1, (2, 3, 9, 11)).astype(dtype)
        x[0, 0, :3, :3] = lo                                   # windows of the least value only
        for k, stride, pad, ceil in ((2, 2, 0, False), (3, 1, 1, False), (3, 2, 1, True), (2, 2, 0, True)):
            attrs = dict(kernel=(k, k), stride=(stride, stride), pad=(pad, pad), ceil_mode=ceil)
            oh = -(-(9 + 2 * pad - k) // stride) + 1 if ceil else (9 + 2 * pad - k) // stride + 1
            ow = -(-(11 + 2 * pad - k) // stride) + 1 if ceil else (11 + 2 * pad - k) // stride + 1
            want = np.empty((2, 3, oh, ow), dtype)
            for i in range(oh):
                for j in range(ow):
                    r0, c0 = max(i * stride - pad, 0), max(j * stride - pad, 0)
                    r1, c1 = min(i * stride - pad + k, 9), min(j * stride - pad + k, 11)
                    want[:, :, i, j] = x[:, :, r0:r1, c0:c1].max(axis=(2, 3))
            nodes.append(("max_pool2d", [x], attrs))
            expected.append(want)
    check(nodes, expected, native)


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
def test_resnet_sized_layer_native_equals_numpy():
    """A ResNet stage-1 3x3 layer at batch 1 (the size the native tiles are built for), native
    and numpy kernels equal (the numpy one is exact against the references above)."""
    rng = np.random.default_rng(9)
    x = rng.integers(0, 256, (1, 64, 56, 56)).astype(np.uint8)
    w = rng.integers(-127, 128, (64, 64, 3, 3)).astype(np.int8)
    bias = rng.integers(-5000, 5000, 64).astype(np.int32)
    attrs = dict(stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1, x_scale=0.02, x_zero_point=120,
                 w_scales=tuple(rng.uniform(0.0005, 0.001, 64)), relu=True, out_dtype="uint8", y_scale=0.2,
                 y_zero_point=0)
    (got,), impls = run_plan([("qconv2d", [x, w, bias], attrs)], True, 2)
    (want,), _ = run_plan([("qconv2d", [x, w, bias], attrs)], False, 1)
    assert impls == ["native"]
    np.testing.assert_array_equal(got, want)
    assert 0 < (got == 0).mean() < 0.9 and len(np.unique(got)) > 30


@pytest.mark.parametrize("native", NATIVE)
def test_ties_round_half_to_even(native):
    """Output multipliers of 0.5 and 0.25 make v = acc * m land on halves: the stores must round
    them to even (nearbyint), not away from zero."""
    a = np.arange(-100, 101, dtype=np.int64).astype(np.int8).reshape(-1, 1)     # acc = a * b
    b = np.array([[1], [3], [-1], [2], [1]], np.int8)
    b_scales = (0.5, 0.5, 0.5, 0.25, 0.25)
    x = a.reshape(1, 1, 1, -1)
    w = b.reshape(5, 1, 1, 1)
    nodes, expected = [], []
    for out_dtype, zp in (("int8", 0), ("uint8", 128), ("int8", -3)):
        oa = dict(out_dtype=out_dtype, relu=False, y_scale=1.0, y_zero_point=zp)
        acc = a.astype(np.int64) @ b.astype(np.int64).T
        expected.append(requantize(acc, 1.0, b_scales, False, out_dtype, 1.0, zp))
        nodes.append(("qgemm", [a, b], dict(a_scale=1.0, a_zero_point=0, b_scales=b_scales, **oa)))
        expected.append(expected[-1].T.reshape(1, 5, 1, -1))
        nodes.append(("qconv2d", [x, w], dict(stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1, x_scale=1.0,
                                              x_zero_point=0, w_scales=b_scales, **oa)))
    assert expected[0][1, 0] == -50 and expected[0][3, 0] == -48   # -48.5 -> -48, -97 * 0.5
    check(nodes, expected, native)


GPU_SCRIPT = """
import numpy as np
from toolkit.backend.registry import KERNELS, load_device
load_device("gpu")
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.kernels.native import quant_packed
from toolkit.ops import Builder
from toolkit.runtime.plan import Plan, RuntimeState
rng = np.random.default_rng(0)
g = Graph("q")
feeds = {"x": rng.standard_normal((2, 3, 6, 6)).astype(np.float32),
         "w": rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
         "b": rng.integers(-500, 500, 4).astype(np.int32)}
x, w, b = (Value(TensorType(a.shape, str(a.dtype)), name=k) for k, a in feeds.items())
g.inputs.update(x=x, w=w, b=b)
B = Builder(g, "q")
q = B.op("quantize_linear", x, scale=0.02, zero_point=128, dtype="uint8")
y = B.op("qconv2d", q, w, b, stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1, x_scale=0.02, x_zero_point=128,
         w_scales=(0.01, 0.02, 0.01, 0.03), relu=True, out_dtype="uint8", y_scale=0.05, y_zero_point=0)
g.outputs["y"] = B.op("dequantize_linear", y, scale=0.05, zero_point=0)
outs = {}
for device in ("cpu", "gpu"):
    plan = Plan(g, {}, {}, device, RuntimeState(np.random.default_rng(0)), native=False)
    outs[device] = np.asarray(plan.run(feeds)["y"])
    assert plan.capture_blocker is None or device == "gpu"
assert np.array_equal(outs["cpu"], outs["gpu"]) and outs["cpu"].max() > 0
print("ok")
"""


def test_a_gpu_plan_runs_the_int8_ops(tmp_path):
    """No int8 GPU kernels: the GPU's entries run the numpy kernels on host copies (here on the
    CuPy stand-in of tests/runtime), equal to the CPU plan."""
    from tests.runtime.gpu_stand_in import STAND_IN, run_stand_in
    result = run_stand_in(STAND_IN + GPU_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]

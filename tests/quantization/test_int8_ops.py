"""int8 through residual adds, concatenations and average pooling (toolkit/ops/quant.py: qadd,
qconcat, qavg_pool2d, qglobal_avg_pool; their numpy kernels in toolkit/kernels/cpu/quant.py).

Each plan kernel equals an independent integer reference written here (python int sums over explicit
windows, then the definition's float32 steps one element at a time, rounding half to even) bit for
bit, and ONNX Runtime's contrib ops (com.microsoft QLinearAdd, QLinearConcat, QLinearAveragePool,
QLinearGlobalAveragePool) run on one-node models built here: equal for the concatenation and the
global pooling, and for the add and the windowed pooling within one step on a few elements
(ONNX Runtime's AVX2 add uses fused multiply-adds, which round once where the definition rounds
twice; its windowed pooling rounds a float mean of dequantized values)."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.ops.base import ShapeError, get_op
from toolkit.runtime.plan import Plan, RuntimeState

RANGE = {"uint8": (0, 255), "int8": (-128, 127)}
f32 = np.float32


def run_kernel(op, arrays, **attrs):
    """``op`` on ``arrays`` through a plan (the numpy kernels), and the op's reference."""
    graph = Graph("test")
    values = []
    for i, a in enumerate(arrays):
        v = Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{i}")
        graph.inputs[v.name] = v
        values.append(v)
    graph.outputs["y"] = Builder(graph, "q").op(op, *values, **attrs)
    plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(0)), native=False)
    got = np.array(plan.run({f"x{i}": a for i, a in enumerate(arrays)})["y"])
    ref = get_op(op).reference(*arrays, **attrs)
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)
    return got


def store(v, zp, dtype, relu=False):
    """One float32 value in output steps to the output: round half to even, add zp, saturate."""
    lo, hi = RANGE[dtype]
    q = int(np.rint(v)) + zp
    return min(max(q, max(lo, zp) if relu else lo), hi)


def random_q(rng, shape, dtype):
    lo, hi = RANGE[dtype]
    return rng.integers(lo, hi + 1, shape).astype(dtype)


# -- ONNX Runtime's contrib ops, one node each --------------------------------------------------------
def ort_run(op, feeds, consts, inputs, **attrs):
    """``op`` (domain com.microsoft) with ``inputs`` in order: names of ``feeds`` (run-time arrays)
    or ``consts`` (initializers)."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    def info(name, a):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
    node = helper.make_node(op, inputs, ["y"], domain="com.microsoft", **attrs)
    out_dtype = consts[inputs[-1]].dtype if op != "QLinearConcat" else consts[inputs[1]].dtype
    graph = helper.make_graph([node], "one", [info(k, v) for k, v in feeds.items()],
                              [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(out_dtype), None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def q(dtype, value):
    return np.array(value, dtype=dtype)


# -- qadd ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("relu", [False, True])
def test_qadd_equals_the_integer_reference_and_onnxruntime(dtype, relu):
    rng = np.random.default_rng(3)
    a, b = random_q(rng, (2, 8, 9, 11), dtype), random_q(rng, (2, 8, 9, 11), dtype)
    za, zb, zy = (120, 100, 90) if dtype == "uint8" else (-3, 5, -10)
    params = dict(a_scale=0.037, a_zero_point=za, b_scale=0.021, b_zero_point=zb, y_scale=0.05, y_zero_point=zy,
                  out_dtype=dtype)
    got = run_kernel("qadd", [a, b], relu=relu, **params)
    ra, rb = f32(0.037) / f32(0.05), f32(0.021) / f32(0.05)
    want = np.array([store(f32(int(x) - za) * ra + f32(int(y) - zb) * rb, zy, dtype, relu)
                     for x, y in zip(a.ravel(), b.ravel())]).reshape(a.shape)
    np.testing.assert_array_equal(got, want)
    assert got.min() < zy < got.max() if not relu else got.min() == zy     # both sides of zero reached
    if relu:
        return
    ort = ort_run("QLinearAdd", {"a": a, "b": b},
                  {"sa": f32(0.037), "za": q(dtype, za), "sb": f32(0.021), "zb": q(dtype, zb), "sy": f32(0.05),
                   "zy": q(dtype, zy)}, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"])
    step = np.abs(ort.astype(int) - got.astype(int))
    assert step.max() <= 1 and (step > 0).mean() < 0.01, (step.max(), (step > 0).mean())


def test_qadd_saturates_and_rounds_ties_to_even():
    a = np.array([[0, 255, 1, 3, 5]], dtype=np.uint8)
    b = np.zeros_like(a)
    # ratio 0.5 exactly: 1 * 0.5 = 0.5 -> 0, 3 * 0.5 = 1.5 -> 2, 5 * 0.5 = 2.5 -> 2; 255 * 0.5 + 200 saturates
    got = run_kernel("qadd", [a, b], a_scale=0.5, a_zero_point=0, b_scale=1.0, b_zero_point=0, y_scale=1.0,
                     y_zero_point=200, out_dtype="uint8")
    np.testing.assert_array_equal(got, [[200, 255, 200, 202, 202]])


def test_qadd_refuses_broadcasting():
    t = TensorType((2, 3), "uint8")
    with pytest.raises(ShapeError, match="differ in shape"):
        get_op("qadd").infer([t, TensorType((1, 3), "uint8")],
                             dict(a_scale=1.0, a_zero_point=0, b_scale=1.0, b_zero_point=0, y_scale=1.0,
                                  y_zero_point=0, out_dtype="uint8"))


# -- qconcat -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qconcat_copies_equal_scales_requantizes_others_as_onnxruntime(dtype):
    rng = np.random.default_rng(4)
    x1, x2, x3 = (random_q(rng, (2, c, 5, 5), dtype) for c in (3, 4, 2))
    zy = 90 if dtype == "uint8" else -10
    scales, zps = (0.037, 0.05, 0.011), ((120 if dtype == "uint8" else -3), zy, 7)
    got = run_kernel("qconcat", [x1, x2, x3], axis=1, x_scales=scales, x_zero_points=zps, y_scale=0.05,
                     y_zero_point=zy, out_dtype=dtype)
    np.testing.assert_array_equal(got[:, 3:7], x2)                      # the same parameters: a copy

    def requant(x, s, z):
        return np.array([store(f32(f32(int(v) - z) * f32(s)) / f32(0.05), zy, dtype) for v in x.ravel()]
                        ).reshape(x.shape)
    np.testing.assert_array_equal(got[:, :3], requant(x1, scales[0], zps[0]))
    np.testing.assert_array_equal(got[:, 7:], requant(x3, scales[2], zps[2]))
    consts = {"sy": f32(0.05), "zy": q(dtype, zy)}
    names = ["sy", "zy"]
    for i, (s, z) in enumerate(zip(scales, zps)):
        consts |= {f"s{i}": f32(s), f"z{i}": q(dtype, z)}
        names += [f"x{i}", f"s{i}", f"z{i}"]
    ort = ort_run("QLinearConcat", {"x0": x1, "x1": x2, "x2": x3}, consts, names, axis=1)
    np.testing.assert_array_equal(ort, got)


# -- average pooling -----------------------------------------------------------------------------------
def window_sums(x, zp, kernel, stride, pad, oh, ow):
    """python int sums of x - zp over each window (padding contributes nothing), and the counts
    with and without the padding (within the padded input)."""
    n, c, h, w = x.shape
    sums = np.zeros((n, c, oh, ow), dtype=object)
    inside = np.zeros((oh, ow), dtype=int)
    padded = np.zeros((oh, ow), dtype=int)
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * stride[0] - pad[0], j * stride[1] - pad[1]
            rows = range(max(r0, 0), min(r0 + kernel[0], h))
            cols = range(max(c0, 0), min(c0 + kernel[1], w))
            inside[i, j] = len(rows) * len(cols)
            padded[i, j] = (min(r0 + kernel[0], h + pad[0]) - r0) * (min(c0 + kernel[1], w + pad[1]) - c0)
            for r in rows:
                for s in cols:
                    sums[:, :, i, j] += x[:, :, r, s].astype(int) - zp
    return sums, inside, padded


POOLS = [((3, 3), (2, 2), (1, 1), False), ((3, 3), (1, 1), (1, 1), True), ((2, 2), (2, 2), (0, 0), False),
         ((3, 2), (2, 1), (1, 0), True)]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("kernel,stride,pad,include_pad", POOLS)
def test_qavg_pool2d_equals_the_integer_reference_and_onnxruntime(dtype, kernel, stride, pad, include_pad):
    rng = np.random.default_rng(5)
    x = random_q(rng, (2, 3, 7, 8), dtype)
    zx, zy = (120, 90) if dtype == "uint8" else (-3, -10)
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=False, count_include_pad=include_pad, x_scale=0.037,
                 x_zero_point=zx, y_scale=0.021, y_zero_point=zy, out_dtype=dtype)
    got = run_kernel("qavg_pool2d", [x], **attrs)
    sums, inside, padded = window_sums(x, zx, kernel, stride, pad, *got.shape[2:])
    counts = padded if include_pad else inside
    want = np.empty(got.shape, dtype=int)
    for idx in np.ndindex(*got.shape):
        m = f32(0.037 / (0.021 * counts[idx[2:]]))
        want[idx] = store(f32(sums[idx]) * m, zy, dtype)
    np.testing.assert_array_equal(got, want)
    ort = ort_run("QLinearAveragePool", {"x": x},
                  {"sx": f32(0.037), "zx": q(dtype, zx), "sy": f32(0.021), "zy": q(dtype, zy)},
                  ["x", "sx", "zx", "sy", "zy"], kernel_shape=list(kernel), strides=list(stride),
                  pads=[pad[0], pad[1], pad[0], pad[1]], count_include_pad=int(include_pad))
    # ONNX Runtime averages dequantized floats and rounds their mean: a rare tie lands a step apart
    step = np.abs(ort.astype(int) - got.astype(int))
    assert step.max() <= 1 and (step > 0).mean() < 0.03, (step.max(), (step > 0).mean())


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("hw", [(4, 4), (7, 7), (1, 1), (3, 5)])
def test_qglobal_avg_pool_equals_the_integer_reference_and_onnxruntime(dtype, hw):
    rng = np.random.default_rng(6)
    x = random_q(rng, (3, 16) + hw, dtype)
    zx, zy = (120, 90) if dtype == "uint8" else (-3, -10)
    params = dict(x_scale=0.037, x_zero_point=zx, y_scale=0.021, y_zero_point=zy, out_dtype=dtype)
    got = run_kernel("qglobal_avg_pool", [x], keepdims=True, **params)
    assert got.shape == (3, 16, 1, 1)
    m = f32(0.037 / (0.021 * hw[0] * hw[1]))
    want = np.array([store(f32(sum(int(v) - zx for v in x[i, c].ravel())) * m, zy, dtype)
                     for i in range(3) for c in range(16)]).reshape(3, 16, 1, 1)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_kernel("qglobal_avg_pool", [x], keepdims=False, **params), want.reshape(3, 16))
    ort = ort_run("QLinearGlobalAveragePool", {"x": x},
                  {"sx": f32(0.037), "zx": q(dtype, zx), "sy": f32(0.021), "zy": q(dtype, zy)},
                  ["x", "sx", "zx", "sy", "zy"], channels_last=0)
    np.testing.assert_array_equal(ort, got)



def test_qglobal_avg_pool_over_a_large_image_equals_the_reference():
    """257 x 257 values: sums that may pass float32's exact integers (2**24) take the kernel's int64
    path, equal to the reference's int64 sums."""
    x = random_q(np.random.default_rng(7), (1, 3, 257, 257), "uint8")
    params = dict(x_scale=0.037, x_zero_point=3, y_scale=0.021, y_zero_point=5, out_dtype="uint8")
    got = run_kernel("qglobal_avg_pool", [x], keepdims=False, **params)
    sums = x.reshape(3, -1).astype(np.int64).sum(axis=1) - 3 * 257 * 257
    want = [store(f32(s) * f32(0.037 / (0.021 * 257 * 257)), 5, "uint8") for s in sums]
    np.testing.assert_array_equal(got, [want])


GPU_SCRIPT = """
import numpy as np
from toolkit.backend.registry import load_device
load_device("gpu")
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.runtime.plan import Plan, RuntimeState
rng = np.random.default_rng(0)
feeds = {k: rng.integers(0, 256, (2, 4, 6, 6)).astype(np.uint8) for k in ("a", "b")}
g = Graph("q")
a, b = (Value(TensorType((2, 4, 6, 6), "uint8"), name=k) for k in feeds)
g.inputs.update(a=a, b=b)
B = Builder(g, "q")
out = dict(y_scale=0.05, y_zero_point=10, out_dtype="uint8")
s = B.op("qadd", a, b, a_scale=0.03, a_zero_point=120, b_scale=0.02, b_zero_point=100, relu=True, **out)
c = B.op("qconcat", s, b, axis=1, x_scales=(0.05, 0.02), x_zero_points=(10, 100), **out)
p = B.op("qavg_pool2d", c, kernel=(3, 3), stride=(2, 2), pad=(1, 1), ceil_mode=False, count_include_pad=False,
         x_scale=0.05, x_zero_point=10, y_scale=0.04, y_zero_point=3, out_dtype="uint8")
g.outputs["y"] = B.op("qglobal_avg_pool", p, keepdims=True, x_scale=0.04, x_zero_point=3, **out)
outs = {}
for device in ("cpu", "gpu"):
    plan = Plan(g, {}, {}, device, RuntimeState(np.random.default_rng(0)), native=False)
    outs[device] = np.asarray(plan.run(feeds)["y"])
assert np.array_equal(outs["cpu"], outs["gpu"]) and outs["cpu"].max() > 10
print("ok")
"""


def test_a_gpu_plan_runs_them_on_the_host(tmp_path):
    """No int8 GPU kernels: a GPU plan's entries run the numpy kernels on host copies (here on the
    CuPy stand-in of tests/runtime), equal to the CPU plan."""
    from tests.runtime.gpu_stand_in import STAND_IN, run_stand_in
    result = run_stand_in(STAND_IN + GPU_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]

"""The native kernels of qadd, qconcat, qavg_pool2d, qglobal_avg_pool and dequantize_linear
(toolkit/kernels/native/quant_between.py) bit for bit against the ops' references and the numpy
kernels: odd shapes of more than one parallel chunk, nonzero zero points, uint8 and int8 in and
out (mixed too), ReLU on and off, one and two threads, and the plan running the native kernel.

qadd's inputs include the pairs of values whose result a fused multiply-add (one rounding of
(a - za) * ra + vb instead of two) would change, found here for the test's scales, so that a
build contracting the definition's float32 steps fails."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit import settings
from toolkit.codegen import toolchain
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.ops.base import get_op
from toolkit.ops.quant import scale_ratio
from toolkit.runtime.plan import Plan, RuntimeState

pytestmark = pytest.mark.skipif(toolchain.compiler() is None, reason="no C compiler")
RANGE = {"uint8": (0, 255), "int8": (-128, 127)}
THREADS = [1, 2]


@pytest.fixture(autouse=True)
def native_on():
    with settings.use(native=True):
        yield


def run(op, arrays, attrs, native, threads=1):
    """``op`` through a plan: its output and the kind of kernel the plan ran."""
    graph = Graph("test")
    values = []
    for i, a in enumerate(arrays):
        v = Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{i}")
        graph.inputs[v.name] = v
        values.append(v)
    graph.outputs["y"] = Builder(graph, "q").op(op, *values, **attrs)
    plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(0)), native=native, threads=threads)
    out = np.array(plan.run({f"x{i}": a for i, a in enumerate(arrays)})["y"])
    return out, plan.impls


def check(op, arrays, attrs, threads):
    """The native kernel runs, and equals the op's reference and the numpy kernel, dtype included."""
    want = get_op(op).reference(*arrays, **attrs)
    got, impls = run(op, arrays, attrs, native=True, threads=threads)
    assert impls == ["native"], impls
    numpy_out, numpy_impls = run(op, arrays, attrs, native=False)
    assert numpy_impls == ["numpy"]
    for out in (got, numpy_out):
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(out, want, err_msg=f"{op} {attrs}")


def random_q(rng, shape, dtype):
    lo, hi = RANGE[dtype]
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def fused_differs(ra, rb, a_range, b_range, y_range):
    """The (da, db) shifted pairs whose rounded sum changes if either product is fused with the
    add (the float64 product is exact, the float32 rounding of the sum is the fused one's)."""
    da = np.arange(*a_range)[:, None]
    db = np.arange(*b_range)[None, :]
    va, vb = da.astype(np.float32) * ra, db.astype(np.float32) * rb
    plain = np.rint(va + vb)
    fused_a = np.rint((da * np.float64(ra) + vb.astype(np.float64)).astype(np.float32))
    fused_b = np.rint((db * np.float64(rb) + va.astype(np.float64)).astype(np.float32))
    inside = (plain > y_range[0]) & (plain < y_range[1])
    i, j = np.nonzero(((plain != fused_a) | (plain != fused_b)) & inside)
    return da[i, 0], db[0, j]


# 3 x 5 x 37 x 41 = 22755 elements: two parallel chunks of 16384, the second ragged
QADD_CASES = [  # a dtype, a zp, b dtype, b zp, out dtype, out zp, scales (a, b, y)
    ("uint8", 128, "uint8", 128, "uint8", 128, (0.01931227, 0.016948191, 0.015073814)),
    ("int8", 0, "int8", 0, "int8", 0, (0.01931227, 0.016948191, 0.015073814)),
    ("uint8", 97, "int8", -11, "int8", 5, (0.017802944, 0.01411596, 0.019643353)),
    ("int8", 13, "uint8", 200, "uint8", 31, (0.5, 0.25, 1.0)),            # exact ratios: ties, halves to even
]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("case", QADD_CASES)
def test_native_qadd_equals_the_reference(case, relu, threads):
    a_dtype, za, b_dtype, zb, y_dtype, zy, (sa, sb, sy) = case
    rng = np.random.default_rng(7)
    a = random_q(rng, (3, 5, 37, 41), a_dtype)
    b = random_q(rng, (3, 5, 37, 41), b_dtype)
    (alo, ahi), (blo, bhi), (ylo, yhi) = RANGE[a_dtype], RANGE[b_dtype], RANGE[y_dtype]
    da, db = fused_differs(scale_ratio(sa, sy), scale_ratio(sb, sy), (alo - za, ahi - za + 1),
                           (blo - zb, bhi - zb + 1), (ylo - zy, yhi - zy))
    if case[-1] != (0.5, 0.25, 1.0):
        assert len(da) > 0, "these scales should have pairs that a fused multiply-add changes"
    a.reshape(-1)[:len(da)] = da + za
    b.reshape(-1)[:len(db)] = db + zb
    attrs = dict(a_scale=sa, a_zero_point=za, b_scale=sb, b_zero_point=zb, y_scale=sy, y_zero_point=zy,
                 out_dtype=y_dtype, relu=relu)
    check("qadd", [a, b], attrs, threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_native_qconcat_equals_the_reference(axis, threads):
    """Three inputs: one at the output's own scale, zero point and type (copied), one at another
    scale, one of the other type; along channels, the last axis and the batch."""
    rng = np.random.default_rng(8)
    shapes = {1: [(3, 2, 5, 7), (3, 7, 5, 7), (3, 1, 5, 7)], -1: [(3, 2, 5, 7), (3, 2, 5, 3), (3, 2, 5, 11)],
              0: [(1, 3, 5, 7), (2, 3, 5, 7), (4, 3, 5, 7)]}[axis]
    dtypes = ["uint8", "uint8", "int8"]
    xs = [random_q(rng, s, d) for s, d in zip(shapes, dtypes)]
    attrs = dict(axis=axis, x_scales=[0.05, 0.0371, 0.02], x_zero_points=[120, 3, -7], y_scale=0.05,
                 y_zero_point=120, out_dtype="uint8")
    check("qconcat", xs, attrs, threads)
    xs = [x.astype(np.int16) for x in xs]          # the same values as int8 out: other zero points
    xs = [np.clip(x - 128 if d == "uint8" else x, -128, 127).astype("int8") for x, d in zip(xs, dtypes)]
    check("qconcat", xs, dict(attrs, x_zero_points=[-8, 3, -7], y_zero_point=-8, out_dtype="int8"), threads)


POOLS = [  # kernel, stride, pad, ceil_mode, count_include_pad
    ((2, 2), (2, 2), (0, 0), False, False),
    ((3, 3), (1, 1), (1, 1), False, True),
    ((3, 3), (2, 2), (1, 1), True, False),
    ((3, 2), (2, 1), (1, 0), True, True),
    ((7, 7), (1, 1), (0, 0), False, False),
]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("dtypes", [("uint8", "uint8"), ("int8", "int8"), ("uint8", "int8")])
def test_native_qavg_pool2d_equals_the_reference(dtypes, pool, threads):
    x_dtype, y_dtype = dtypes
    kernel, stride, pad, ceil_mode, count_include_pad = pool
    rng = np.random.default_rng(9)
    x = random_q(rng, (5, 29, 9, 11), x_dtype)            # 145 planes: three chunks of 64, the last ragged
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                 x_scale=0.031, x_zero_point=RANGE[x_dtype][0] + 77, y_scale=0.027,
                 y_zero_point=RANGE[y_dtype][0] + 130, out_dtype=y_dtype)
    check("qavg_pool2d", [x], attrs, threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("dtypes", [("uint8", "uint8"), ("int8", "int8"), ("int8", "uint8")])
def test_native_qglobal_avg_pool_equals_the_reference(dtypes, keepdims, threads):
    x_dtype, y_dtype = dtypes
    rng = np.random.default_rng(10)
    x = random_q(rng, (3, 67, 7, 5), x_dtype)             # 201 planes of 35
    x[0, 0] = RANGE[x_dtype][1]                           # a saturating mean
    attrs = dict(x_scale=0.02, x_zero_point=RANGE[x_dtype][0] + 40, y_scale=0.011,
                 y_zero_point=RANGE[y_dtype][0] + 60, out_dtype=y_dtype, keepdims=keepdims)
    check("qglobal_avg_pool", [x], attrs, threads)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("dtype, zp, scale", [("uint8", 0, 0.031), ("uint8", 140, 0.5), ("int8", -20, 0.0173)])
def test_native_dequantize_linear_equals_the_reference(dtype, zp, scale, threads):
    rng = np.random.default_rng(11)
    q = random_q(rng, (2, 20003), dtype)                  # 40006 values: chunks of 16384 and a tail
    check("dequantize_linear", [q], dict(scale=scale, zero_point=zp), threads)

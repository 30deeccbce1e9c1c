"""One table of cases drives the generic tests of every primitive op in ``OPS``.

Each case names an op, its attributes, a maker of random inputs (one shape set per case; every op
has several cases) and an independent reference written here (numpy expressions, explicit loops
or PyTorch), never the op's own ``.reference``. From the table:

* forward: a one-node graph run by the reference interpreter and by a compiled Plan, in float32
  and float64, against the independent reference;
* gradient: loss = sum(op(x...) * r), differentiated by ``toolkit.autodiff.differentiate``,
  against central finite differences of the independent reference (float64), and the Plan's
  gradient against the interpreter's;
* shape rules that must reject, and the documented tie rule of maximum's gradient.

The table is ``op_cases.py``; its coverage of OPS, the registry's self-checks and the in-place
kernels are ``test_op_coverage.py``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.ops.op_cases import (
    DETERMINISTIC,
    DTYPES,
    FD_EPS,
    FD_MAX_ELEMENTS,
    GRAD_CASES,
    RANDOM,
    TOL,
    Case,
    assert_close,
    build_loss_graph,
    feeds,
    float_indices,
    one_node_graph,
    run_plan,
    upcast,
)
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.ops.autodiff import differentiate
from toolkit.ops.interpreter import interpret


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DETERMINISTIC, ids=str)
def test_forward(case: Case, dtype):
    arrays = case.inputs(dtype)
    attrs = case.attrs_for(dtype)
    graph, _, y = one_node_graph(case, arrays, attrs)
    graph.outputs["y"] = y
    expected = np.asarray(case.ref(*[upcast(a) for a in arrays]))
    got_interp = interpret(graph, feeds(arrays), {})[0]["y"]
    got_plan = run_plan(graph, feeds(arrays))["y"]
    for name, got in (("interpreter", got_interp), ("plan", got_plan)):
        assert got.dtype == np.dtype(y.dtype), f"{name}: dtype {got.dtype}, type says {y.dtype}"
        tol = TOL["float32"] if "float32" in (y.dtype, *(str(a.dtype) for a in arrays)) else TOL["float64"]
        assert_close(got, expected, tol, f"{case.id} {name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", RANDOM, ids=str)
def test_forward_random(case: Case, dtype):
    """Impure ops: values, keep rate, reproducibility per seed, plan == interpreter for one seed."""
    arrays = case.inputs(dtype)
    ratio = case.attrs["ratio"]
    graph, _, y = one_node_graph(case, arrays, case.attrs)
    graph.outputs["y"] = y
    interp = interpret(graph, feeds(arrays), {}, rng=np.random.default_rng(7))[0]["y"]
    plan = run_plan(graph, feeds(arrays), seed=7)["y"]
    np.testing.assert_array_equal(interp, plan)
    assert plan.dtype == np.dtype(dtype)
    scale = float(np.dtype(dtype).type(1.0 / (1.0 - ratio)))
    assert set(np.unique(plan)) <= {0.0, scale}
    keep = float(np.mean(plan != 0))
    n = plan.size
    assert abs(keep - (1 - ratio)) <= 5 * math.sqrt(ratio * (1 - ratio) / n) + 1e-12
    other = run_plan(graph, feeds(arrays), seed=8)["y"]
    if ratio > 0:
        assert not np.array_equal(other, plan), "a different seed must give a different mask"
    # mean of the inverted-dropout mask is ~1 (unbiased)
    assert abs(float(plan.mean()) - 1.0) <= 5 * math.sqrt(ratio / max(1 - ratio, 1e-9) / n) + 1e-12


# -- gradients ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradient(case: Case):
    arrays = case.inputs("float64")
    graph, y, names = build_loss_graph(case, arrays)
    rng = np.random.default_rng(99)
    r = rng.uniform(-1, 1, tuple(y.shape))
    inputs = dict(feeds(arrays), r=r)
    interp = interpret(graph, inputs, {})[0]
    plan = run_plan(graph, inputs)

    expected_loss = float(np.sum(np.asarray(case.ref(*arrays)) * r))
    np.testing.assert_allclose(interp["loss"], expected_loss, rtol=1e-10, atol=1e-12)

    for i in float_indices(arrays):
        x = arrays[i]
        analytic = interp[names[i]] if i in names else np.zeros_like(x)   # None: zero gradient
        assert analytic.shape == x.shape and analytic.dtype == x.dtype
        if i in names:
            assert_close(plan[names[i]], analytic, 1e-12, f"{case.id}: plan vs interpreter, input {i}")
        flat = np.arange(x.size)
        if x.size > FD_MAX_ELEMENTS:
            flat = rng.choice(x.size, FD_MAX_ELEMENTS, replace=False)
        for k in flat:
            idx = np.unravel_index(k, x.shape)
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[i][idx] += FD_EPS
            minus[i][idx] -= FD_EPS
            # difference before the sum: no cancellation against the untouched outputs
            diff = np.asarray(case.ref(*plus)) - np.asarray(case.ref(*minus))
            fd = float(np.sum(diff * r)) / (2 * FD_EPS)
            assert abs(analytic[idx] - fd) <= 1e-6 * abs(fd) + 1e-8, \
                f"{case.id}: d/dx{i}{list(idx)} analytic {analytic[idx]!r} vs finite difference {fd!r}"


def test_cast_gradient_crosses_dtypes():
    """cast f64 -> f32: the gradient comes back as float64 and equals r (cast is the identity)."""
    graph = Graph("test")
    x = Value(TensorType((3, 4), "float64"), name="x")
    r = Value(TensorType((3, 4), "float32"), name="r")
    graph.inputs.update(x=x, r=r)
    b = Builder(graph, "t")
    loss = b.reduce_sum(b.mul(b.op("cast", x, dtype="float32"), r), (0, 1))
    g = differentiate(graph, loss, [x])[x.id]
    assert g.dtype == "float64"
    graph.outputs["g"] = g
    rv = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
    inputs = {"x": np.ones((3, 4)), "r": rv}
    for got in (interpret(graph, inputs, {})[0]["g"], run_plan(graph, inputs)["g"]):
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, rv.astype(np.float64))


# -- shape rules that must reject --------------------------------------------------------------
@pytest.mark.parametrize("start,stop", [(3, 8), (-2, 1), (0, 6)])
def test_slice_rejects_out_of_range_bounds(start, stop):
    """The type must match what runs: x[5] sliced [3:8] would type as length 5 but run as 2."""
    from toolkit.ops import ShapeError
    graph = Graph("test")
    x = Value(TensorType((5,), "float64"), name="x")
    graph.inputs["x"] = x
    with pytest.raises(ShapeError, match="out of range"):
        Builder(graph).op("slice", x, axis=0, start=start, stop=stop)
    assert Builder(graph).op("slice", x, axis=0, start=0, stop=5).shape == (5,)


def test_maximum_ties_route_gradient_to_first_input():
    """Documented rule (Caffe's Eltwise MAX): at a == b the whole gradient goes to a.
    PyTorch's torch.maximum splits it instead (0.5 / 0.5); this pins the toolkit's choice."""
    graph = Graph("test")
    a = Value(TensorType((3,), "float64"), name="a")
    b = Value(TensorType((3,), "float64"), name="b")
    graph.inputs.update(a=a, b=b)
    bld = Builder(graph, "t")
    loss = bld.reduce_sum(bld.op("maximum", a, b), (0,))
    grads = differentiate(graph, loss, [a, b])
    graph.outputs.update(ga=grads[a.id], gb=grads[b.id])
    inputs = {"a": np.array([1.0, 2.0, 0.0]), "b": np.array([1.0, 1.0, 5.0])}
    for got in (interpret(graph, inputs, {})[0], run_plan(graph, inputs)):
        np.testing.assert_array_equal(got["ga"], [1.0, 1.0, 0.0])
        np.testing.assert_array_equal(got["gb"], [0.0, 0.0, 1.0])

"""Every case of the op table (``CASES``: ``op_cases_math.py`` and
``op_cases_conv_pool_fused.py``, in that order) and what runs one: a one-node graph of a case,
its feeds, a compiled Plan's run, the comparison at a tolerance, and the gradient cases (a case's
loss graph differentiated). The op-table tests and the back ends' tests import these."""
from __future__ import annotations

import numpy as np

from tests.ops import op_cases_conv_pool_fused, op_cases_math, op_cases_nhwc
from tests.ops.op_case_makers import Case
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import OPS, Builder
from toolkit.ops.autodiff import differentiate
from toolkit.runtime.plan import Plan, RuntimeState

__all__ = ["CASES", "Case", "DETERMINISTIC", "DTYPES", "GRAD_CASES", "RANDOM", "TOL", "assert_close",
           "build_loss_graph", "feeds", "float_indices", "one_node_graph", "run_plan", "upcast"]

CASES: list[Case] = op_cases_math.CASES + op_cases_conv_pool_fused.CASES + op_cases_nhwc.CASES
DTYPES = ("float32", "float64")
TOL = {"float32": 1e-5, "float64": 1e-12}


# -- running one node --------------------------------------------------------------------------
def one_node_graph(case: Case, arrays, attrs):
    graph = Graph("test")
    vals = []
    for i, a in enumerate(arrays):
        v = Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{i}")
        graph.inputs[f"x{i}"] = v
        vals.append(v)
    y = Builder(graph, case.id).op(case.op, *vals, **attrs)
    return graph, vals, y


def feeds(arrays):
    return {f"x{i}": a for i, a in enumerate(arrays)}


def run_plan(graph, inputs, seed=0):
    plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(seed)))
    return {k: np.array(v) for k, v in plan.run(inputs).items()}


def upcast(a):
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def assert_close(actual, expected, tol, what=""):
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.kind in "iub" or expected.dtype.kind in "iub":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(np.max(finite, initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


DETERMINISTIC = [c for c in CASES if not c.random]


RANDOM = [c for c in CASES if c.random]


# -- gradients ----------------------------------------------------------------------------------
def float_indices(arrays):
    return [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]


def grad_cases():
    out = []
    for c in CASES:
        if c.random or not c.grad or OPS[c.op].grad is None:
            continue
        arrays = c.inputs("float64")
        attrs = c.attrs_for("float64")
        graph, _, y = one_node_graph(c, arrays, attrs)
        if not float_indices(arrays) or y.dtype != "float64":
            continue                  # integer / float32 outputs: finite differences need float64
        out.append(c)
    return out


GRAD_CASES = grad_cases()
FD_EPS = 1e-6
FD_MAX_ELEMENTS = 24


def build_loss_graph(case: Case, arrays):
    graph, vals, y = one_node_graph(case, arrays, case.attrs_for("float64"))
    r = Value(TensorType(y.shape, y.dtype), name="r")
    graph.inputs["r"] = r
    b = Builder(graph, "loss")
    prod = b.mul(y, r)
    loss = b.reduce_sum(prod, range(prod.rank))
    graph.outputs["loss"] = loss
    wrt = [vals[i] for i in float_indices(arrays)]
    grads = differentiate(graph, loss, wrt)
    names = {}
    for i, v in zip(float_indices(arrays), wrt):
        if grads[v.id] is not None:
            graph.outputs[f"g{i}"] = grads[v.id]
            names[i] = f"g{i}"
    return graph, y, names

"""A one-node graph of an op-table case run by a plan on a chosen device and float32 policy:
shared by the precision tests in this folder and by the scripts they run on the CuPy stand-in."""
from __future__ import annotations


def run_one_node(case, device, precision):
    """The op-table case ``case`` as a one-node float32 graph under the float32 policy
    ``precision``, run by a plan on ``device``: its output as float64 (on the stand-in or a GPU)."""
    import numpy as np

    from tests.ops.op_cases import feeds, one_node_graph
    from toolkit.runtime.plan import Plan, RuntimeState
    arrays = case.inputs("float32")
    graph, _vals, y = one_node_graph(case, arrays, case.attrs_for("float32"))
    graph.outputs["y"] = y
    graph.precision = precision
    plan = Plan(graph, {}, {}, device, RuntimeState(np.random.default_rng(0)), native=False)
    out = plan.run(feeds(arrays))["y"]
    return np.array(out.get() if hasattr(out, "get") else out, dtype=np.float64)

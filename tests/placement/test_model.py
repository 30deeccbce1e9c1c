"""The cost model that needs no measurement (toolkit/placement/model.py): its arithmetic."""
from __future__ import annotations

import pytest

from toolkit.ir.dims import Sym
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.ops import Builder
from toolkit.placement.model import FlopsModel, Link, value_bytes


def _matmul_graph():
    g = Graph("infer")
    x = Value(TensorType((Sym.named("N"), 64), "float32"), name="x")
    w = Value(TensorType((64, 32), "float32"), name="w")
    g.inputs = {"x": x, "w": w}
    y = Builder(g, "ip").op("matmul", x, w, trans_a=False, trans_b=False)
    return g, x, y


def test_an_op_costs_its_flops_at_the_rate_plus_the_kernel_overhead():
    g, _x, _y = _matmul_graph()
    model = FlopsModel({"N": 8}, {"cpu": 1e9, "cpu:1": 2e9}, kernel_overhead_s=1e-6)
    (node,) = [n for n in g.nodes if n.op == "matmul"]
    flops = 2 * 8 * 64 * 32
    assert model.op_seconds(node, "cpu") == pytest.approx(1e-6 + flops / 1e9)
    assert model.op_seconds(node, "cpu:1") == pytest.approx(1e-6 + flops / 2e9)     # a name before a kind
    with pytest.raises(KeyError, match="gpu"):
        model.op_seconds(node, "gpu")


def test_a_transfer_costs_latency_plus_bytes_at_the_links_rate_and_nothing_on_one_device():
    _g, x, y = _matmul_graph()
    model = FlopsModel({"N": 8}, {"cpu": 1e9}, links={("cpu", "gpu"): Link(1e-5, 1e10)}, memory={"gpu": 1 << 30})
    assert value_bytes(y, {"N": 8}) == 8 * 32 * 4
    assert model.transfer_seconds(y, "cpu", "cpu") == 0.0
    assert model.transfer_seconds(x, "cpu", "gpu") == pytest.approx(1e-5 + 8 * 64 * 4 / 1e10)
    assert model.transfer_seconds(x, "cpu", "cpu:1") == pytest.approx(2e-6 + 8 * 64 * 4 / 10e9)   # the default link
    assert model.memory_limit("gpu") == 1 << 30 and model.memory_limit("cpu") is None

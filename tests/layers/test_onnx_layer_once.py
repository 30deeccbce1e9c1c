"""An ONNX layer's model is converted to primitives once per net (per bottoms' types and float
type), and each phase's graph gets a copy of the conversion."""
from __future__ import annotations

import numpy as np
import pytest

import layers.onnx.layer as onnx_layer
from toolkit.frontend import Net
from toolkit.ops.interpreter import interpret


def test_an_onnx_layer_converts_its_model_once_per_net(tmp_path, monkeypatch):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])], [w]),
        opset_imports=[helper.make_operatorsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    (tmp_path / "net.yaml").write_text(
        "name: n\ninputs:\n  x: {shape: [N, 4]}\n  t: {shape: [N, 3]}\nlayers:\n"
        "  - {name: body, type: ONNX, file: m.onnx, bottom: x, top: z}\n"
        "  - {name: loss, type: EuclideanLoss, bottom: [z, t], top: loss, phase: train}\n")
    conversions = []
    convert = onnx_layer._convert
    monkeypatch.setattr(onnx_layer, "_convert", lambda *args: conversions.append(args) or convert(*args))
    net = Net.load(str(tmp_path / "net.yaml"))
    assert len(conversions) == 1             # train, test and infer: one conversion
    graphs = [net.graph(phase) for phase in ("train", "test", "infer")] + [net.graph("infer", "float64")]
    assert len(conversions) == 2             # a float type of its own: converted for it
    train, _test, infer, wide = graphs
    assert [n.op for n in infer.nodes] == [n.op for n in train.nodes[:len(infer.nodes)]]
    assert [(n.op, n.scope) for n in infer.nodes] == [("matmul", "body/y"), ("relu", "body/z")]
    assert wide.weights["body.w"].value.dtype == "float64"
    weights = net.load_weights(str(tmp_path / "m.onnx"))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    out, _ = interpret(infer, {"x": x}, weights)
    np.testing.assert_allclose(out["z"], np.maximum(x @ numpy_helper.to_array(w), 0), rtol=1e-6)
    # the copies are separate graphs: one's nodes are not the other's
    assert {id(n) for n in infer.nodes}.isdisjoint(id(n) for n in net.graph("infer").nodes)


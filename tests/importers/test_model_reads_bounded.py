"""Model files are read within their own size: a caffemodel of a few hundred bytes and an ONNX
model of a few dozen import under an address-space limit far below the 2 GiB that protobuf
allows a message (a read that asked for the limit up front failed there with MemoryError)."""
from __future__ import annotations

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from tests.bounded import run_toolkit

MEMORY_MB = 1000

PROTOTXT = """name: "small"
input: "data"
input_shape { dim: 1 dim: 8 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 4 } }
"""


def test_a_small_caffemodel_imports_under_a_memory_limit(tmp_path):
    pytest.importorskip("google.protobuf", reason="the caffe extra (protobuf) reads caffemodels")
    from toolkit.importers.caffe.proto import classes
    weight = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
    net = classes()["NetParameter"](name="small")
    layer = net.layer.add(name="ip", type="InnerProduct")
    for array in (weight, np.ones(4, np.float32)):
        blob = layer.blobs.add()
        blob.shape.dim.extend(array.shape)
        blob.data.extend(array.ravel().tolist())
    (tmp_path / "small.caffemodel").write_bytes(net.SerializeToString())
    (tmp_path / "small.prototxt").write_text(PROTOTXT)
    assert (tmp_path / "small.caffemodel").stat().st_size < 1024
    r = run_toolkit("import", "caffe", tmp_path / "small.prototxt", "--weights", tmp_path / "small.caffemodel",
                    "--out", tmp_path / "out", memory_mb=MEMORY_MB, timeout=60)
    assert r.status == 0, r.err
    arrays = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert np.array_equal(next(v for k, v in arrays.items() if v.shape == (4, 8)), weight)


def test_a_tiny_onnx_model_imports_under_a_memory_limit(tmp_path):
    onnx = pytest.importorskip("onnx", reason="the onnx extra reads ONNX models")
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "tiny.onnx")
    assert (tmp_path / "tiny.onnx").stat().st_size < 100
    r = run_toolkit("import", "onnx", tmp_path / "tiny.onnx", "--out", tmp_path / "out",
                    memory_mb=MEMORY_MB, timeout=60)
    assert r.status == 0, r.err
    net = yaml.safe_load((tmp_path / "out" / "net.yaml").read_text())
    assert net["name"] == "tiny"

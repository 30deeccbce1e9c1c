"""Names that differ stay different: ONNX value names and Caffe blob names that become one net-file
name ('y:0' and 'y_0', 'x y' and 'x_y') are kept apart, the later one renamed with a note, so
every output a model declares comes back and every layer reads the blob it names."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.bounded import run_toolkit

MEMORY_MB = 1500


def _two_outputs(path, second="Neg"):
    """Outputs 'y:0' (Relu) and 'y_0' (``second``): one blob name unless kept apart."""
    onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y:0"]), helper.make_node(second, ["x"], ["y_0"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y:0", "y_0")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _infer(tmp_path, net, x):
    np.save(tmp_path / "x.npy", x)
    r = run_toolkit("infer", net, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz",
                    memory_mb=MEMORY_MB, timeout=60)
    assert r.status == 0, r.err
    return np.load(tmp_path / "y.npz")


def _tops(net_file) -> list[str]:
    net = yaml.safe_load(net_file.read_text())
    return [t for layer in net["layers"] for t in ([layer["top"]] if isinstance(layer["top"], str) else layer["top"])]


def test_outputs_whose_names_become_one_blob_name_both_come_back(tmp_path):
    got = _infer(tmp_path, _two_outputs(tmp_path / "m.onnx"), np.full((2, 3), -2, np.float32))
    assert sorted(got.files) == ["y_0", "y_0_2"]
    np.testing.assert_array_equal(got["y_0"], np.zeros((2, 3)))          # Relu of -2
    np.testing.assert_array_equal(got["y_0_2"], np.full((2, 3), 2))      # Neg of -2


@pytest.mark.parametrize("second", ["Neg", "Sigmoid"])        # one ONNX layer; a net of the catalog's layers
def test_import_keeps_the_names_apart_and_says_so(tmp_path, second):
    model = _two_outputs(tmp_path / "m.onnx", second)
    r = run_toolkit("import", "onnx", model, "--out", tmp_path / "out", memory_mb=MEMORY_MB, timeout=60)
    assert r.status == 0, r.err
    assert "note: the ONNX value 'y_0' is the blob 'y_0_2' ('y_0' is 'y:0')" in r.out + r.err
    assert sorted(_tops(tmp_path / "out" / "net.yaml")) == ["y_0", "y_0_2"]
    got = _infer(tmp_path, tmp_path / "out" / "net.yaml", np.full((2, 3), -2, np.float32))
    np.testing.assert_array_equal(got["y_0"], np.zeros((2, 3)))
    np.testing.assert_allclose(got["y_0_2"], np.full((2, 3), 2.0 if second == "Neg" else 1 / (1 + np.exp(2))),
                               rtol=1e-6)


CLASH = """name: "clash"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 } } }
layer { name: "zero" type: "Power" bottom: "data" top: "x y" power_param { scale: 0 } }
layer { name: "same" type: "Power" bottom: "data" top: "x_y" power_param { scale: 1 } }
layer { name: "out" type: "ReLU" bottom: "x y" top: "out" }
layer { name: "out2" type: "ReLU" bottom: "x_y" top: "out2" }
"""


def test_caffe_blobs_whose_names_become_one_name_stay_two_blobs(tmp_path):
    """'out' reads 'x y' (zeros, as Caffe gives), not 'x_y' (the input): before, both were x_y."""
    (tmp_path / "net.prototxt").write_text(CLASH)
    r = run_toolkit("import", "caffe", tmp_path / "net.prototxt", "--out", tmp_path / "out", memory_mb=MEMORY_MB,
                    timeout=60)
    assert r.status == 0, r.err
    assert "blob 'x_y' is 'x_y_2' here ('x_y' is the blob 'x y')" in r.out + r.err
    assert sorted(_tops(tmp_path / "out" / "net.yaml")) == ["out", "out2", "x_y", "x_y_2"]
    got = _infer(tmp_path, tmp_path / "out" / "net.yaml", np.array([[1, 2, 3]], np.float32))
    np.testing.assert_array_equal(got["out"], np.zeros((1, 3)))
    np.testing.assert_array_equal(got["out2"], [[1, 2, 3]])


def test_an_output_that_is_also_the_input_comes_back(tmp_path):
    """ONNX lets a model give its input back as an output: a blob of its own ('x_2'), as a top
    cannot be the net's input, where before the output was left out."""
    onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "x")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    x = np.full((2, 3), -2, np.float32)
    got = _infer(tmp_path, tmp_path / "m.onnx", x)
    assert sorted(got.files) == ["x_2", "y"]
    np.testing.assert_array_equal(got["x_2"], x)
    np.testing.assert_array_equal(got["y"], np.zeros((2, 3)))

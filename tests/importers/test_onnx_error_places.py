"""Where an ONNX model's problem is said to be: at the ONNX layer in the net file that names the
model (never a line and column of the binary model), or nowhere when the model itself is given
on the command line; the model's path once, as the user wrote it."""
from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")

from tests.train.train_helpers import cli  # noqa: E402

REFUSED = "node 'the_cos': the op Cos (domain ai.onnx, opset 17) has no counterpart here"
NET = """name: wrap
inputs:
  x: {shape: [N, 4]}
layers:
  - {name: g, type: ONNX, bottom: x, top: y, file: models/cos.onnx}
outputs: [y]
"""


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A folder holding models/cos.onnx (one Cos node: no counterpart) and wrap.yaml reading it."""
    from onnx import TensorProto, helper, save
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Cos", ["x"], ["y"], name="the_cos")], "g", [x], [y])
    (tmp_path / "models").mkdir()
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "models" / "cos.onnx"))
    (tmp_path / "wrap.yaml").write_text(NET)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", [("import", "onnx"), ("check",), ("compile",)])
@pytest.mark.parametrize("path", ["models/cos.onnx", "./models/cos.onnx"])
def test_a_model_given_directly_has_no_place(here, command, path):
    args = [*command, path] + (["--out", "cos"] if command[0] == "import" else [])
    r = cli(*args)
    assert r.status == 2
    assert r.err.splitlines() == [f"error: {path}: {REFUSED}"]
    assert not (here / "cos").exists()


def test_a_model_read_by_a_net_file_is_placed_at_its_layer(here):
    r = cli("check", "wrap.yaml")
    assert r.status == 2
    col = NET.splitlines()[4].index("file:") + 1
    assert r.err.splitlines() == [f"wrap.yaml:5:{col}: error: layer 'g' (ONNX): models/cos.onnx: {REFUSED}"]

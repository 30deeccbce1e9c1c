"""`toolkit import caffe` takes what Caffe takes (docs/spec.md section 9): two layers of one name
in a phase (BVLC's own mnist_autoencoder), renamed with a note, each with its own weights; a
prototxt without a name named after its file; a Python layer refused as what it is; and an
import that fails leaves nothing in --out, so that its rerun needs no --force."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from tests.train.train_helpers import cli

DATA = Path(__file__).resolve().parents[1] / "data" / "caffe"
pytest.importorskip("google.protobuf", reason="the caffe extra (protobuf) reads caffemodels")


def _caffemodel(path: Path, layers: list[tuple[str, list[np.ndarray]]]) -> None:
    """A caffemodel of the layers in order (a name may come twice, as Caffe saves such a net)."""
    from toolkit.importers.caffe.proto import classes
    net = classes()["NetParameter"](name="written")
    for name, arrays in layers:
        layer = net.layer.add(name=name, type="InnerProduct")
        for a in arrays:
            blob = layer.blobs.add()
            blob.shape.dim.extend(a.shape)
            blob.data.extend(a.astype(np.float32).ravel().tolist())
    path.write_bytes(net.SerializeToString())


def test_bvlcs_mnist_autoencoder_imports_with_its_second_loss_renamed(tmp_path):
    r = cli("import", "caffe", DATA / "examples_mnist_mnist_autoencoder.prototxt", "--input-shape", "data=1,28,28",
            "--out", tmp_path / "out")
    assert r.status == 0, r.err
    assert "note: layer 'loss' at line 316 has the name of the layer at line 302 in the same phase: renamed " \
           "'loss_2' (its blobs wire it as before)" in r.out.splitlines()
    widths = [784, 1000, 500, 250, 30, 250, 500, 1000, 784]     # the encoder and decoder, as the file has them
    params = sum(a * b + b for a, b in zip(widths, widths[1:]))
    assert f"{params:,} parameters" in r.out
    net = yaml.safe_load((tmp_path / "out" / "net.yaml").read_text())
    losses = {layer["name"]: layer for layer in net["layers"] if layer["type"].endswith("Loss")}
    assert losses["loss"]["type"] == "SigmoidCrossEntropyLoss" and losses["loss"]["bottom"] == ["decode1", "flatdata"]
    assert losses["loss_2"]["type"] == "EuclideanLoss" and losses["loss_2"]["bottom"] == ["decode1neuron", "flatdata"]
    check = cli("check", tmp_path / "out" / "net.yaml")
    assert check.status == 0, check.err
    assert f"total: {params:,} parameters" in check.out


TWICE = """
name: "twice"
input: "data"
input_shape { dim: 1 dim: 4 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a" inner_product_param { num_output: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "a" top: "b" inner_product_param { num_output: 2 } }
layer { name: "ip_2" type: "ReLU" bottom: "b" top: "c" }
"""


def test_two_layers_of_one_name_each_take_their_own_weights(tmp_path):
    (tmp_path / "twice.prototxt").write_text(TWICE)
    rng = np.random.default_rng(0)
    first = [rng.standard_normal((3, 4)), rng.standard_normal(3)]
    second = [rng.standard_normal((2, 3)), rng.standard_normal(2)]
    _caffemodel(tmp_path / "twice.caffemodel", [("ip", first), ("ip", second)])
    r = cli("import", "caffe", tmp_path / "twice.prototxt", "--weights", tmp_path / "twice.caffemodel",
            "--out", tmp_path / "out")
    assert r.status == 0, r.err
    net = yaml.safe_load((tmp_path / "out" / "net.yaml").read_text())
    # 'ip_2' is the file's own ReLU: the renamed layer takes the next free name
    assert [layer["name"] for layer in net["layers"]] == ["ip", "ip_3", "ip_2"]
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    np.testing.assert_array_equal(weights["ip.weight"], first[0].astype(np.float32))
    np.testing.assert_array_equal(weights["ip_3.weight"], second[0].astype(np.float32))
    np.testing.assert_array_equal(weights["ip_3.bias"], second[1].astype(np.float32))


ONE = """
name: "one"
input: "data"
input_shape { dim: 1 dim: 4 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
"""


def test_a_prototxt_without_a_name_takes_its_files(tmp_path):
    folder = tmp_path / "caffe"
    folder.mkdir()
    (folder / "my_classifier.prototxt").write_text(ONE.replace('name: "one"\n', ""))
    r = cli("import", "caffe", folder / "my_classifier.prototxt", "--out", tmp_path / "out")
    assert r.status == 0, r.err
    assert yaml.safe_load((tmp_path / "out" / "net.yaml").read_text())["name"] == "my_classifier"


PYTHON = """
name: "py"
input: "data"
input_shape { dim: 1 dim: 4 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "custom" type: "Python" bottom: "ip" top: "out"
  python_param { module: "my_layers" layer: "Rescale" } }
"""

PYTHON_DATA = """
name: "pydata"
layer { name: "feed" type: "Python" top: "data" top: "label" python_param { module: "feeders" layer: "Batches" } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_a_python_layer_is_refused_as_what_it_is(tmp_path):
    (tmp_path / "py.prototxt").write_text(PYTHON)
    r = cli("import", "caffe", tmp_path / "py.prototxt", "--out", tmp_path / "out")
    assert r.status == 2 and "Traceback" not in r.err and not (tmp_path / "out").exists()
    assert r.errors == [f"{tmp_path / 'py.prototxt'}:6:1: error: layer 'custom' is a Python layer "
                        "(my_layers.Rescale): its code is not part of the model file; write what it computes with "
                        "the catalog's layers, or import the deploy prototxt without it"]
    (tmp_path / "pydata.prototxt").write_text(PYTHON_DATA)
    r = cli("import", "caffe", tmp_path / "pydata.prototxt", "--out", tmp_path / "out")
    assert r.status == 2 and r.errors == [
        f"{tmp_path / 'pydata.prototxt'}:3:1: error: layer 'feed' is a Python layer (feeders.Batches): its code is "
        "not part of the model file; as it reads no bottom it feeds data: give the shape of what it yields with "
        "--input-shape data=C,H,W and the data itself as train.data"]
    # given that shape, it stands for the data it feeds, as a data layer does
    r = cli("import", "caffe", tmp_path / "pydata.prototxt", "--input-shape", "data=4", "--out", tmp_path / "out")
    assert r.status == 0, r.err
    inputs = yaml.safe_load((tmp_path / "out" / "net.yaml").read_text())["inputs"]
    assert inputs == {"data": {"shape": ["N", 4], "dtype": "float32"}, "label": {"shape": ["N"], "dtype": "int64"}}


def test_a_failed_import_leaves_nothing_and_its_rerun_needs_no_force(tmp_path):
    (tmp_path / "net.prototxt").write_text(ONE)
    rng = np.random.default_rng(1)
    wrong = [rng.standard_normal((5, 4)), rng.standard_normal(5)]     # the prototxt makes ip [3, 4]
    _caffemodel(tmp_path / "wrong.caffemodel", [("ip", wrong)])
    for out in (tmp_path / "new" / "deeper", tmp_path / "existing"):
        if out.name == "existing":
            out.mkdir()
            (out / "notes.txt").write_text("mine")
        r = cli("import", "caffe", tmp_path / "net.prototxt", "--weights", tmp_path / "wrong.caffemodel",
                "--out", out)
        assert r.status == 2 and "has shape [5, 4] there, the prototxt makes it [3, 4]" in r.err, r.err
        assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
        if out.name == "existing":
            assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []   # no staged folder left
    right = [rng.standard_normal((3, 4)), rng.standard_normal(3)]
    _caffemodel(tmp_path / "right.caffemodel", [("ip", right)])
    r = cli("import", "caffe", tmp_path / "net.prototxt", "--weights", tmp_path / "right.caffemodel",
            "--out", tmp_path / "existing")
    assert r.status == 0, r.err
    assert sorted(p.name for p in (tmp_path / "existing").iterdir()) == ["model.safetensors", "net.yaml", "notes.txt"]
    assert f"wrote {tmp_path / 'existing' / 'model.safetensors'}: 2 arrays from" in r.out
    np.testing.assert_array_equal(load_file(str(tmp_path / "existing" / "model.safetensors"))["ip.weight"],
                                  right[0].astype(np.float32))

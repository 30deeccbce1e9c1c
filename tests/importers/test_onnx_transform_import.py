"""A model that `toolkit export onnx` wrote with its input transform in front reads back with that
transform as the net's, applied once: `toolkit infer model.onnx` and `toolkit import onnx`'s net
on raw inputs equal ONNX Runtime on them (and the original net's `toolkit infer`); a model whose
front nodes are not exactly the exporter's keeps them as nodes; a model exported with
--no-transform declares the transform its metadata describes."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from PIL import Image

onnx = pytest.importorskip("onnx", reason="the onnx extra writes the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime is the reference")

from tests.train.train_helpers import cli  # noqa: E402

TINY = {"name": "tiny", "inputs": {"data": {"shape": ["N", 3, 5, 4]}},
        "layers": [{"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv", "num_output": 2,
                    "kernel_size": 3}],
        "transform": {"preset": "caffe-imagenet", "resize": [9, 8]}}


def _ort(path, feeds: dict) -> dict:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _infer(tmp_path, net, *args) -> tuple[np.ndarray, str]:
    out = tmp_path / "out.npy"
    r = cli("infer", net, *args, "--output", out)
    assert r.status == 0, r.err
    return np.load(out), r.err


def _tiny(tmp_path):
    from toolkit.weights import save_weights
    from toolkit.zoo.resolve import load_net
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY, sort_keys=False))
    weights = tmp_path / "tiny.safetensors"
    save_weights(str(weights), load_net(str(path)).init_weights(seed=2))
    return path, weights


def test_an_exported_zoo_net_infers_on_raw_inputs_as_onnx_runtime_does(tmp_path):
    model = tmp_path / "lenet.onnx"
    assert cli("export", "onnx", "zoo:lenet", "-o", model).status == 0
    x = (np.random.default_rng(0).random((5, 1, 8, 8)) * 16).astype(np.float32)      # raw digits' pixels
    np.save(tmp_path / "x.npy", x)
    got, err = _infer(tmp_path, model, "--input", f"data={tmp_path / 'x.npy'}")
    assert "x * 0.0625" in err                                   # the transform, read back, applied once
    np.testing.assert_allclose(got, _ort(model, {"data": x})["prob"], rtol=0, atol=1e-5)
    want, _ = _infer(tmp_path, "zoo:lenet", "--input", f"data={tmp_path / 'x.npy'}")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_cropping_transform_reads_back_through_import_and_runs_on_arrays_and_images(tmp_path):
    path, weights = _tiny(tmp_path)
    model = tmp_path / "tiny.onnx"
    assert cli("export", "onnx", path, "--weights", weights, "-o", model).status == 0
    r = cli("import", "onnx", model, "--out", tmp_path / "imported")
    assert r.status == 0, r.err
    net = yaml.safe_load((tmp_path / "imported" / "net.yaml").read_text())
    assert net["inputs"]["data"]["shape"] == ["N", 3, 5, 4]
    assert net["transform"]["channel_order"] == "bgr" and net["transform"]["crop_size"] == [5, 4]
    assert not any(layer.get("type") in ("Gather", "Slice") for layer in net["layers"])
    x = (np.random.default_rng(1).random((2, 3, 9, 8)) * 255).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = _ort(model, {"data": x})["conv"]
    targets = [(model, []),
               (tmp_path / "imported" / "net.yaml", ["--weights", tmp_path / "imported" / "model.safetensors"])]
    for target, given in targets:
        got, _ = _infer(tmp_path, target, *given, "--input", f"data={tmp_path / 'x.npy'}")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    image = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (13, 11, 3), dtype=np.uint8)).save(image)
    original, _ = _infer(tmp_path, path, "--weights", weights, "--input", image)
    for target, given in targets:
        got, _ = _infer(tmp_path, target, *given, "--input", image)
        np.testing.assert_allclose(got, original, rtol=0, atol=1e-4)


def test_front_nodes_that_are_not_exactly_the_exporters_stay_nodes(tmp_path):
    model_path = tmp_path / "lenet.onnx"
    assert cli("export", "onnx", "zoo:lenet", "-o", model_path).status == 0
    model = onnx.load(str(model_path))
    # the scale node now reads a constant that is not the exporter's: the chain is no longer its own
    scale = next(n for n in model.graph.node if n.name.startswith("toolkit.input_transform/data/"))
    const = next(t for t in model.graph.initializer if t.name == scale.input[1])
    const.name = scale.input[1] = "someone_elses_scale"
    tampered = tmp_path / "tampered.onnx"
    onnx.save(model, str(tampered))
    x = (np.random.default_rng(3).random((2, 1, 8, 8)) * 16).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    got, err = _infer(tmp_path, tampered, "--input", f"data={tmp_path / 'x.npy'}")
    assert "inputs are transformed" not in err                   # the nodes do it, once
    np.testing.assert_allclose(got, _ort(tampered, {"data": x})["prob"], rtol=0, atol=1e-5)


def test_a_model_exported_without_its_transform_declares_it_from_the_metadata(tmp_path):
    model = tmp_path / "lenet.onnx"
    r = cli("export", "onnx", "zoo:lenet", "-o", model, "--no-transform")
    assert r.status == 0 and "the input transform is left out (--no-transform)" in r.err, r.err
    record = json.loads({p.key: p.value for p in onnx.load(str(model)).metadata_props}["toolkit.input_transform"])
    assert record["in_graph"] is False
    x = (np.random.default_rng(4).random((3, 1, 8, 8)) * 16).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    got, _ = _infer(tmp_path, model, "--input", f"data={tmp_path / 'x.npy'}")
    np.testing.assert_allclose(got, _ort(model, {"data": x * np.float32(0.0625)})["prob"], rtol=0, atol=1e-5)
    plain, _ = _infer(tmp_path, model, "--input", f"data={tmp_path / 'x.npy'}", "--no-transform")
    np.testing.assert_allclose(plain, _ort(model, {"data": x})["prob"], rtol=0, atol=1e-5)


def test_a_mean_image_exports_with_a_fixed_input_size_and_runs_as_nodes(tmp_path):
    """A mean image fixes the size of what it is subtracted from: the model's input takes it, the
    crop is a Slice of constants, and the nodes (a mean image is no net file's key) run as nodes."""
    path, weights = _tiny(tmp_path)
    mean = np.random.default_rng(7).random((3, 9, 8)) * 100
    np.save(tmp_path / "mean.npy", mean)
    path.write_text(yaml.safe_dump({**TINY, "transform": {"mean_file": "mean.npy", "crop_size": [5, 4],
                                                          "channel_order": "bgr"}}, sort_keys=False))
    model = tmp_path / "tiny.onnx"
    r = cli("export", "onnx", path, "--weights", weights, "-o", model)
    assert r.status == 0, r.err
    dims = [d.dim_param or d.dim_value for d in onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["N", 3, 9, 8]
    x = (np.random.default_rng(8).random((2, 3, 9, 8)) * 255).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = _ort(model, {"data": x})["conv"]
    original, _ = _infer(tmp_path, path, "--weights", weights, "--input", f"data={tmp_path / 'x.npy'}")
    np.testing.assert_allclose(want, original, rtol=0, atol=1e-4)
    got, err = _infer(tmp_path, model, "--input", f"data={tmp_path / 'x.npy'}")
    assert "inputs are transformed" not in err
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)

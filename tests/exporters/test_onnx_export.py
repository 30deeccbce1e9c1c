"""``toolkit export onnx``: every layer test net and every zoo net, exported, passes onnx.checker's
full check and runs in ONNX Runtime equal to the toolkit, at two batch sizes (the batch stays
dynamic); opsets 13 to the newest; the input transform as nodes in front (ONNX Runtime on raw
inputs equals `toolkit infer` on them) and in the metadata; the errors.

Tolerance: 1e-4 relative to the largest expected magnitude (float32 on both sides)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra writes the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime checks them")

from tests.layers.layer_case_nets import load_net, random_inputs, random_weights  # noqa: E402
from tests.layers.layer_cases import CASES  # noqa: E402
from tests.train.train_helpers import cli  # noqa: E402
from toolkit.exporters.onnx_graph import ExportError, export_graph  # noqa: E402
from toolkit.ops.interpreter import interpret  # noqa: E402

TOL = 1e-4


def ort_run(model, feeds: dict) -> dict:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def assert_equal_outputs(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for name, expected in want.items():
        actual = got[name]
        assert actual.shape == np.shape(expected), f"{what}: '{name}' {actual.shape} vs {np.shape(expected)}"
        scale = max(float(np.abs(expected).max()) if np.size(expected) else 0.0, 1e-6)
        err = float(np.abs(actual - expected).max()) / scale if np.size(expected) else 0.0
        assert err < TOL, f"{what}: output '{name}' differs by {err:.2e} of its largest magnitude"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_layer_test_net_exports_and_runs_equal_in_onnx_runtime(tmp_path, case):
    net = load_net(tmp_path, case)
    weights = {k: v.astype(np.float32) for k, v in random_weights(net, "float32").items()}
    graph = net.graph("infer", "float32")
    model = export_graph(graph, weights, net.name)
    for batch in (3, 5):
        inputs = {k: v for k, v in random_inputs(net, case, "float32", batch=batch).items() if k in graph.inputs}
        want, _ = interpret(graph, inputs, weights)
        assert_equal_outputs(ort_run(model, inputs), {k: want[k] for k in graph.outputs}, f"{case.id} batch {batch}")


ZOO = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "zoo").iterdir() if (p / "net.yaml").is_file())


@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_net_exports_and_runs_equal_to_toolkit_infer_on_raw_inputs(tmp_path, name):
    """The transform is nodes in front: ONNX Runtime on raw inputs equals `toolkit infer` (which
    applies the net's transform) on the same raw inputs; with --no-transform, equal to `toolkit
    infer --no-transform`."""
    import toolkit
    out, plain = tmp_path / f"{name}.onnx", tmp_path / f"{name}_plain.onnx"
    r = cli("export", "onnx", f"zoo:{name}", "-o", out)
    assert r.status == 0, r.err
    assert f"wrote {out}" in r.out and "dynamic: N" in r.out
    r = cli("export", "onnx", f"zoo:{name}", "-o", plain, "--no-transform")
    assert r.status == 0, r.err
    model, plain_model = onnx.load(str(out)), onnx.load(str(plain))
    onnx.checker.check_model(model, full_check=True)
    transformed, raw = toolkit.load(f"zoo:{name}"), toolkit.load(f"zoo:{name}", transform=False)
    assert ("the input transform is left out" in r.err) == (transformed.transform is not None)
    rng = np.random.default_rng(0)
    for batch in (1, 4):
        feeds = {}
        for info in raw.inputs:
            shape = [batch if d is None else d for d in info.shape]
            feeds[info.name] = (rng.integers(0, 8, size=shape) if info.dtype.startswith("int")
                                else rng.random(shape) * 16).astype(info.dtype)       # raw: digits' pixels
        for got, want in ((ort_run(model, feeds), transformed.infer(**feeds)),
                          (ort_run(plain_model, feeds), raw.infer(**feeds))):
            assert set(got) == set(want)
            for key in want:
                np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5, err_msg=f"zoo:{name} {key}")


def test_a_preset_transform_exports_as_nodes_with_a_dynamic_image_size(tmp_path):
    """Channel order, a centre crop from the run-time shape (torchvision's half-to-even offsets
    and Caffe's floor ones), raw scale, mean and std: ONNX Runtime on raw images of several sizes
    equals `toolkit infer` on them."""
    import toolkit
    for preset, mean in (("caffe-imagenet", {}), ("torchvision-imagenet", {}), ("caffe-imagenet", {"mean": 3.5})):
        path = tmp_path / "net.yaml"
        path.write_text(json.dumps({
            "name": "tiny", "inputs": {"data": {"shape": ["N", 3, 5, 4]}},
            "layers": [{"name": "conv", "type": "Convolution", "bottom": "data", "top": "conv", "num_output": 2,
                        "kernel_size": 3}],
            "transform": {"preset": preset, "crop_size": [5, 4], **mean}}))
        out = tmp_path / "tiny.onnx"
        r = cli("export", "onnx", path, "-o", out, "--weights", _tiny_weights(tmp_path, path))
        assert r.status == 0, r.err
        model = onnx.load(str(out))
        dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        assert dims == ["N", 3, "data_height", "data_width"]
        ours = toolkit.load(str(path), weights=str(tmp_path / "w.safetensors"))
        rng = np.random.default_rng(3)
        for size in ((5, 4), (8, 7), (10, 13)):
            x = (rng.random((2, 3) + size) * 255).astype(np.float32)
            assert_equal_outputs(ort_run(model, {"data": x}), ours.infer(data=x), f"{preset} {size}")


def _tiny_weights(folder, path):
    from toolkit.weights import save_weights
    from toolkit.zoo.resolve import load_net
    save_weights(str(folder / "w.safetensors"), load_net(str(path)).init_weights(seed=1))
    return folder / "w.safetensors"


@pytest.mark.parametrize("opset", [13, 17, 18, onnx.defs.onnx_opset_version()])
def test_opsets_from_13_to_the_newest(tmp_path, opset):
    """Reductions take their axes as an attribute before opset 18 and as an input from it; a
    recurrent layer's loop is a Scan in every opset."""
    case = next(c for c in CASES if c.id == "layer_norm")
    for case in (case, next(c for c in CASES if c.id == "gru")):
        net = load_net(tmp_path, case)
        weights = {k: v.astype(np.float32) for k, v in random_weights(net, "float32").items()}
        graph = net.graph("infer", "float32")
        model = export_graph(graph, weights, net.name, opset=opset)
        assert model.opset_import[0].version == opset
        inputs = {k: v for k, v in random_inputs(net, case, "float32").items() if k in graph.inputs}
        want, _ = interpret(graph, inputs, weights)
        assert_equal_outputs(ort_run(model, inputs), {k: want[k] for k in graph.outputs}, f"opset {opset}")


def test_the_input_transform_travels_in_the_metadata(tmp_path):
    out = tmp_path / "lenet.onnx"
    assert cli("export", "onnx", "zoo:lenet", "-o", out).status == 0
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert meta["toolkit.net"] == "lenet" and meta["toolkit.phase"] == "infer"
    record = json.loads(meta["toolkit.input_transform"])
    assert record["inputs"] == ["data"] and record["in_graph"] is True
    assert record["steps"]["data"]["scale"] == 0.0625 and record["steps"]["data"]["formula"] == \
        "((x * raw_scale) - mean) / std * scale"


def test_the_test_phase_exports_its_loss_and_accuracy(tmp_path):
    case = next(c for c in CASES if c.id == "softmax_loss_caffe_normalizations")
    net = load_net(tmp_path, case)
    weights = {k: v.astype(np.float32) for k, v in random_weights(net, "float32").items()}
    graph = net.graph("test", "float32")
    model = export_graph(graph, weights, net.name)
    inputs = {k: v for k, v in random_inputs(net, case, "float32").items() if k in graph.inputs}
    want, _ = interpret(graph, inputs, weights)
    assert {"full", "batch", "acc", "acc3"} <= set(graph.outputs)
    assert_equal_outputs(ort_run(model, inputs), {k: want[k] for k in graph.outputs}, "test phase")


def test_what_onnx_cannot_express_is_an_error_naming_the_layer(tmp_path):
    """The train phase's dropout draws its mask from the executor's generator: no ONNX op does."""
    case = next(c for c in CASES if any(layer["type"] == "Dropout" for layer in c.layers))
    net = load_net(tmp_path, case)
    weights = net.init_weights()
    layer = next(x["name"] for x in case.layers if x["type"] == "Dropout")
    with pytest.raises(ExportError, match=f"ONNX export: layer '{layer}': the primitive 'dropout_mask' has no ONNX"):
        export_graph(net.graph("train", "float32"), weights, net.name)


def test_user_mistakes_are_one_line_and_status_2(tmp_path):
    r = cli("export", "onnx", "zoo:lenet", "-o", tmp_path / "m.onnx", "--opset", "12")
    assert r.status == 2 and r.errors == [f"error: --opset 12: choose one from 13 to {onnx.defs.onnx_opset_version()}"]
    r = cli("export", "onnx", "zoo:lenet", "-o", tmp_path)
    assert r.status == 2 and "a folder; give the model file's name" in r.err and "Traceback" not in r.err
    r = cli("export", "onnx", "zoo:lenet", "-o", tmp_path / "m.onnx", "--weights", tmp_path / "none.safetensors")
    assert r.status == 2 and "Traceback" not in r.err and not (tmp_path / "m.onnx").exists()


def test_causal_attention_over_a_symbolic_length_exports_with_a_dynamic_t(tmp_path):
    """The causal mask's positions (iota) become Range over T's run-time size: one ONNX model
    runs every length, equal to the toolkit's interpreter."""
    path = tmp_path / "decoder.yaml"
    path.write_text("""name: decoder
inputs:
  x: {shape: [N, T, 8]}
layers:
  - {name: attn, type: MultiHeadAttention, bottom: x, top: y, num_heads: 2, causal: true}
outputs: [y]
""")
    from toolkit.frontend import Net
    net = Net.load(str(path))
    weights = net.init_weights(seed=1)
    graph = net.graph("infer", "float32")
    model = export_graph(graph, weights, net.name)
    assert "Range" in {n.op_type for n in model.graph.node}
    rng = np.random.default_rng(2)
    for batch, steps in ((2, 3), (1, 7)):
        feeds = {"x": rng.standard_normal((batch, steps, 8)).astype(np.float32)}
        want, _ = interpret(graph, feeds, weights)
        assert_equal_outputs(ort_run(model, feeds), {"y": want["y"]}, f"T={steps}")

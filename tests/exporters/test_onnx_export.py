"""``toolkit export onnx``: every layer test net and every zoo net, exported, passes onnx.checker's
full check and runs in ONNX Runtime equal to the toolkit, at two batch sizes (the batch stays
dynamic); opsets 13 to the newest; the input transform in the metadata; the errors.

Tolerance: 1e-4 relative to the largest expected magnitude (float32 on both sides)."""
from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra writes the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime checks them")

from tests.layers.test_layers_vs_torch import CASES, load_net, random_inputs, random_weights  # noqa: E402
from tests.train.test_loop import cli  # noqa: E402
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


@pytest.mark.parametrize("name", ["lenet", "mlp", "resnet", "branchnet", "gru_digits", "transformer_digits"])
def test_every_zoo_net_exports_and_runs_equal_to_toolkit_infer(tmp_path, name):
    import toolkit
    out = tmp_path / f"{name}.onnx"
    r = cli("export", "onnx", f"zoo:{name}", "-o", out)
    assert r.status == 0, r.err
    assert f"wrote {out}" in r.out and "dynamic: N" in r.out
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    ours = toolkit.load(f"zoo:{name}", transform=False)
    rng = np.random.default_rng(0)
    for batch in (1, 4):
        feeds = {}
        for info in ours.inputs:
            shape = [batch if d is None else d for d in info.shape]
            feeds[info.name] = (rng.integers(0, 8, size=shape) if info.dtype.startswith("int")
                                else rng.random(shape)).astype(info.dtype)
        assert_equal_outputs(ort_run(model, feeds), ours.infer(**feeds), f"zoo:{name} batch {batch}")


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
    assert record["inputs"] == ["data"] and record["scale"] == 0.0625 and record["formula"] == "(x - mean) * scale"


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

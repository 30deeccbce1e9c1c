"""``toolkit export onnx`` of a quantized model folder (``toolkit quantize``'s) writes QDQ:
QuantizeLinear / DequantizeLinear around Conv and Gemm, the weights int8 initializers dequantized
per output channel (axis 0), the biases int32, and around the residual adds and the global
average pooling of zoo:resnet; ONNX Runtime runs it to the outputs of the
toolkit's own int8 run (its fused integer kernels and its unfused float reading of the QDQ
graph both), the net's input transform in front as for a float net; and the toolkit imports the
written model back onto its int8 ops, equal to the folder's run.

ONNX Runtime runs with ``session.x64quantprecision`` on: without it, its u8 x s8 kernels on an
x64 processor without VNNI saturate 16-bit pair sums with full-range weights (measured here:
LeNet's probabilities off by up to 0.75 on 359 digits, 3 of them classified otherwise).
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra writes the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime is the reference")
from onnx import numpy_helper  # noqa: E402

import toolkit  # noqa: E402
from tests.train.train_helpers import cli  # noqa: E402
from toolkit.training.data import load_digits  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return _exported(tmp_path_factory, "lenet")


def _exported(tmp_path_factory, name: str):
    """zoo:NAME quantized on the first 256 digits and exported; (folder result, model path, the
    last 359 digits (not the 256 calibrated on), the folder's probabilities on them)."""
    folder = tmp_path_factory.mktemp("quantized")
    pixels, _ = load_digits()
    result = toolkit.quantize(f"zoo:{name}", calibrate={"data": pixels[:256]}, out=str(folder / f"{name}-int8"))
    path = folder / f"{name}-int8.onnx"
    r = cli("export", "onnx", result.net_file, "--weights", result.weights_file, "-o", path)
    assert r.status == 0, r.err
    assert "QDQ" in r.err
    digits = pixels[-359:].astype(np.float32)
    model = toolkit.load(str(result.net_file), weights=str(result.weights_file))
    return result, path, digits, model.infer(data=digits)["prob"]


def _session(path, fused: bool = True):
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    if not fused:        # the QDQ graph read as written: float ops on dequantized values
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_the_model_is_qdq_with_int8_weights_per_channel(exported):
    _, path, _, _ = exported
    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producer = {o: n for n in nodes for o in n.output}
    ops = [n.op_type for n in nodes]
    assert ops.count("Conv") == 2 and ops.count("Gemm") == 2
    for node in nodes:
        if node.op_type not in ("Conv", "Gemm"):
            continue
        x, w, b = (producer[name] for name in node.input)
        assert x.op_type == w.op_type == b.op_type == "DequantizeLinear"
        weight, scales = init[w.input[0]], init[w.input[1]]
        assert weight.dtype == np.int8 and np.abs(weight).max() == 127
        assert scales.shape == (weight.shape[0],) and {a.name: a.i for a in w.attribute} == {"axis": 0}
        assert init[b.input[0]].dtype == np.int32
    # every float weight of the layers is gone: the int8 ones are what the model holds
    assert not [a for a in init.values() if a.dtype == np.float32 and a.size > 64]
    # the input transform stays in front (LeNet scales its pixels by 1/16)
    assert ops[0] == "Mul" and model.graph.input[0].name == "data"


@pytest.mark.parametrize("fused", [True, False], ids=["fused-integer-kernels", "qdq-as-float-ops"])
def test_onnx_runtime_runs_it_to_the_toolkits_outputs(exported, fused):
    _, path, digits, probabilities = exported
    got = _session(path, fused).run(None, {"data": digits})[0]
    assert got.shape == probabilities.shape
    # the last layer's output is float (it feeds the softmax): the two differ by float rounding
    assert np.abs(got - probabilities).max() < 1e-5
    assert (got.argmax(axis=1) == probabilities.argmax(axis=1)).all()
    assert np.median(probabilities.max(axis=1)) > 0.9


def test_a_residual_net_with_global_pooling_exports_too(tmp_path_factory):
    """zoo:resnet: two residual adds (ReLU folded in) and global average pooling in int8, written
    as DequantizeLinear -> Add / GlobalAveragePool -> QuantizeLinear."""
    _, path, digits, probabilities = _exported(tmp_path_factory, "resnet")
    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}
    readers = {}
    for n in model.graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    for op in ("Add", "GlobalAveragePool"):
        found = [n for n in model.graph.node if n.op_type == op]
        assert found, op
        for node in found:
            assert all(producer[i].op_type == "DequantizeLinear" for i in node.input)
            after = readers[node.output[0]][0]
            after = readers[after.output[0]][0] if after.op_type == "Relu" else after
            assert after.op_type == "QuantizeLinear"
    # the fused integer kernels sum as the toolkit does; the float reading of the QDQ graph sums in
    # float32 before it requantizes, and a sum within float rounding of a rounding boundary lands
    # one step away (with the biases corrected, 4.2e-5 of probability on these digits)
    for fused, bound in ((True, 2e-5), (False, 1e-4)):
        got = _session(path, fused).run(None, {"data": digits})[0]
        assert np.abs(got - probabilities).max() < bound, fused
        assert (got.argmax(axis=1) == probabilities.argmax(axis=1)).all()


def test_the_test_phase_exports_in_int8_too(exported, tmp_path):
    """--phase test (the int8 net with its loss and accuracy, as ``toolkit test`` measures it):
    ONNX Runtime's accuracy is the folder's on the same digits."""
    result, _, digits, probabilities = exported
    path = tmp_path / "test-phase.onnx"
    r = cli("export", "onnx", result.net_file, "--weights", result.weights_file, "-o", path, "--phase", "test")
    assert r.status == 0 and "QDQ" in r.err, r.err
    _, labels = load_digits()
    outputs = [o.name for o in onnx.load(str(path)).graph.output]
    got = dict(zip(outputs, _session(path).run(None, {"data": digits, "label": labels[-359:].astype(np.int64)})))
    assert float(got["accuracy"]) == pytest.approx((probabilities.argmax(axis=1) == labels[-359:]).mean(), abs=1e-6)


def test_the_exported_model_imports_back_onto_the_int8_ops(exported):
    from layers.onnx import import_proto
    _, path, digits, probabilities = exported
    imported = import_proto(onnx.load(str(path)), str(path))
    ops = [n.op for n in imported.graph.nodes]
    assert ops.count("qconv2d") == 2 and ops.count("qgemm") == 2 and "conv2d" not in ops
    # the model file run as a net: its transform read back from the nodes in front
    got = toolkit.load(str(path)).infer(data=digits)
    np.testing.assert_allclose(next(iter(got.values())), probabilities, rtol=0, atol=1e-6)

"""The ONNX importer against the ONNX project's own tests and against ONNX Runtime.

- every node test case of the onnx package: each op passes at least the cases recorded in
  onnx_conformance_passes.json (benchmarks/onnx_node_table.py writes it and the README's table);
- the pytorch-converted and pytorch-operator model tests: the recorded ones pass;
- the light real models (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet,
  SqueezeNet, VGG-19, ZFNet-512) equal their expected outputs at the cases' tolerance;
- every zoo net exported and imported back equals the toolkit at two batch sizes (the batch
  imported as a symbol);
- the mistakes: one line each, naming the node, the op, its domain and opset."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
pytest.importorskip("onnxruntime", reason="the onnx extra's runtime is the reference")

from layers.onnx import import_model  # noqa: E402
from peers.onnx_conformance import data_dir, model_cases, node_cases, run_case, table  # noqa: E402
from tests.train.train_helpers import cli  # noqa: E402
from toolkit.errors import UserError  # noqa: E402
from toolkit.ops.interpreter import interpret  # noqa: E402

RECORDED = json.loads((Path(__file__).parent / "onnx_conformance_passes.json").read_text())
LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512"]


@pytest.fixture(scope="module")
def node_table():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return table(node_cases())


def test_every_op_passes_its_recorded_node_cases(node_table):
    fewer = {op: (len(node_table.get(op, {"pass": []})["pass"]), want) for op, want in RECORDED["node"].items()
             if len(node_table.get(op, {"pass": []})["pass"]) < want}
    assert not fewer, f"ops passing fewer node cases than recorded (now, recorded): {fewer}"
    catalog = ["Conv", "ConvTranspose", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
               "BatchNormalization", "InstanceNormalization", "LRN", "Relu", "Softmax", "LogSoftmax", "Reshape",
               "Flatten", "Transpose", "Concat", "Slice", "Gather", "Squeeze", "Unsqueeze", "ReduceMean", "ReduceSum",
               "Where", "Elu", "LeakyRelu", "Sigmoid", "Tanh", "Erf"]
    for op in catalog:
        assert node_table[op]["pass"], f"{op}: no node case passes"
    assert sum(len(r["pass"]) for r in node_table.values()) >= sum(RECORDED["node"].values())


def test_a_failed_node_case_says_why(node_table):
    for op, r in node_table.items():
        for name, why in r["fail"] + r["unsupported"]:
            assert why and "Traceback" not in why, f"{name}: no reason"


@pytest.mark.parametrize("kind", ["pytorch-converted", pytest.param("pytorch-operator", marks=[
    # test_operator_sqrt feeds negative numbers on purpose: its expected output is NaN there
    pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")])])
def test_the_pytorch_model_tests(kind):
    passed = sorted(c.name for c in model_cases(kind) if run_case(c)[0] == "pass")
    missing = sorted(set(RECORDED["models"][kind]) - set(passed))
    assert not missing, f"{kind}: no longer pass: {missing}"


# VGG-19's ops (convolutions, ReLU, max pooling, Gemm) are AlexNet's and ZFNet's, at 15 s of the
# reference interpreter: the longer run (make test-slow)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "vgg19" else n for n in LIGHT])
def test_the_light_real_models_give_their_expected_outputs(name):
    from onnx import numpy_helper
    from onnx.backend.test.runner import Runner
    folder = os.path.join(data_dir(), "light")
    path = os.path.join(folder, f"light_{name}.onnx")
    model = onnx.load(path)
    imported = import_model(path)
    init = {i.name for i in model.graph.initializer}
    info = next(i for i in model.graph.input if i.name not in init)
    feed = Runner.generate_dummy_data(info, seed=0, name=name, random=False)
    expected = onnx.TensorProto()
    expected.ParseFromString(Path(folder, f"light_{name}_output_0.pb").read_bytes())
    got, _ = interpret(imported.graph, {info.name: feed}, dict(imported.weights))
    rtol = 2e-3 if name == "densenet121" else 1e-3
    np.testing.assert_allclose(got[model.graph.output[0].name], numpy_helper.to_array(expected), rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("name", ["lenet", "mlp", "resnet", "branchnet", "transformer_digits", "gru_digits"])
def test_a_zoo_net_exported_and_imported_back_equals_itself(tmp_path, name):
    import toolkit
    out = tmp_path / f"{name}.onnx"
    assert cli("export", "onnx", f"zoo:{name}", "-o", out).status == 0
    imported = import_model(str(out))
    ours = toolkit.load(f"zoo:{name}", transform=False)
    assert [str(d) for d in next(iter(imported.graph.inputs.values())).shape[:1]] == ["N"]
    rng = np.random.default_rng(1)
    for batch in (1, 7):
        feeds = {i.name: (rng.integers(0, 8, [batch if d is None else d for d in i.shape]) if i.dtype.startswith("int")
                          else rng.random([batch if d is None else d for d in i.shape])).astype(i.dtype)
                 for i in ours.inputs}
        got, _ = interpret(imported.graph, feeds, dict(imported.weights))
        for key, want in ours.infer(**feeds).items():
            np.testing.assert_allclose(got[key], want, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def _model_with(tmp_path, node, inputs, outputs, opset=17, name="m.onnx"):
    from onnx import helper
    graph = helper.make_graph([node], "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_an_unsupported_op_is_one_line_naming_op_domain_opset_and_node(tmp_path):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    path = _model_with(tmp_path, helper.make_node("Cos", ["x"], ["y"], name="the_cos"), [x], [y])
    with pytest.raises(UserError) as e:
        import_model(path)
    assert str(e.value) == (f"error: {path}: node 'the_cos': the op Cos (domain ai.onnx, opset 17) "
                            "has no counterpart here")
    custom = _model_with(tmp_path, helper.make_node("Fancy", ["x"], ["y"], name="n1", domain="com.example"), [x], [y],
                         name="c.onnx")
    with pytest.raises(UserError, match="node 'n1': the op Fancy \\(domain com.example, opset 17\\)"):
        import_model(custom)


def test_what_is_not_a_model_is_refused_in_one_line(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(os.urandom(64))
    with pytest.raises(UserError, match="not a readable ONNX model|not an ONNX model"):
        import_model(str(junk))
    with pytest.raises(UserError, match="no such file"):
        import_model(str(tmp_path / "none.onnx"))


def test_an_older_opset_is_brought_to_13(tmp_path):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    path = _model_with(tmp_path, helper.make_node("Softmax", ["x"], ["y"], axis=1), [x], [y], opset=11)
    imported = import_model(path)
    assert imported.opset == 13 and str(imported.graph.inputs["x"].shape[0]) == "batch"
    x_ = np.random.default_rng(0).random((5, 4)).astype(np.float32)
    got, _ = interpret(imported.graph, {"x": x_}, {})
    np.testing.assert_allclose(got["y"], np.exp(x_) / np.exp(x_).sum(1, keepdims=True), rtol=1e-6)


def test_an_if_on_a_run_time_condition_and_one_known_at_import(tmp_path):
    """If becomes the graph's if when its condition is computed, and is inlined when it is known."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 3])
    else_out = helper.make_tensor_value_info("e", TensorProto.FLOAT, ["N", 3])
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [then_out])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [else_out])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(nodes, "g", [x], [y], [zero])
    path = tmp_path / "if.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    imported = import_model(str(path))
    assert any(n.op == "if" for n in imported.graph.nodes)
    for sign in (1.0, -1.0):
        x_ = (sign * np.abs(np.random.default_rng(0).random((4, 3)))).astype(np.float32)
        got, _ = interpret(imported.graph, {"x": x_}, dict(imported.weights))
        np.testing.assert_array_equal(got["y"], np.maximum(x_, 0) if sign > 0 else -x_)
    known = helper.make_graph([helper.make_node("If", ["yes"], ["y"], then_branch=then_g, else_branch=else_g)],
                              "g", [x], [y], [helper.make_tensor("yes", TensorProto.BOOL, [], [True])])
    path.write_bytes(helper.make_model(known, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    imported = import_model(str(path))
    assert [n.op for n in imported.graph.nodes] == ["relu"]


def _loop_model(path, early_stop: bool):
    """y <- y * 0.5 + x, 4 times (a for-loop with each step's y stacked), or until sum(y) > 6."""
    from onnx import TensorProto, helper
    fl = TensorProto.FLOAT
    body_in = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
               helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
               helper.make_tensor_value_info("y_in", fl, ["N", 3])]
    nodes = [helper.make_node("Constant", [], ["half"], value=helper.make_tensor("h", fl, [], [0.5])),
             helper.make_node("Mul", ["y_in", "half"], ["scaled"]),
             helper.make_node("Add", ["scaled", "x"], ["y_out"])]
    if early_stop:
        nodes += [helper.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
                  helper.make_node("Constant", [], ["six"], value=helper.make_tensor("s", fl, [], [6.0])),
                  helper.make_node("Less", ["total", "six"], ["c_out"])]
        body_out = [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("y_out", fl, ["N", 3])]
    else:
        nodes += [helper.make_node("Identity", ["c_in"], ["c_out"]),
                  helper.make_node("Identity", ["y_out"], ["y_scan"])]
        body_out = [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("y_out", fl, ["N", 3]),
                    helper.make_tensor_value_info("y_scan", fl, ["N", 3])]
    body = helper.make_graph(nodes, "body", body_in, body_out)
    outs = ["y_final"] + ([] if early_stop else ["y_steps"])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "y0"], outs, body=body)], "g",
        [helper.make_tensor_value_info("x", fl, ["N", 3]), helper.make_tensor_value_info("y0", fl, ["N", 3])],
        [helper.make_tensor_value_info(o, fl, None) for o in outs],
        [helper.make_tensor("trips", TensorProto.INT64, [], [4]),
         helper.make_tensor("go", TensorProto.BOOL, [], [True])])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return str(path)


@pytest.mark.parametrize("early_stop", [False, True], ids=["for", "until"])
def test_a_loop_with_a_known_trip_count_runs_as_onnx_runtime_does(tmp_path, early_stop):
    import onnxruntime as ort
    path = _loop_model(tmp_path / "loop.onnx", early_stop)
    imported = import_model(path)
    assert any(n.op == "loop" for n in imported.graph.nodes)
    rng = np.random.default_rng(4)
    for batch in (1, 3):
        feeds = {"x": rng.random((batch, 3)).astype(np.float32), "y0": rng.random((batch, 3)).astype(np.float32)}
        got, _ = interpret(imported.graph, feeds, dict(imported.weights))
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        for name, expected in zip(["y_final", "y_steps"], want):
            np.testing.assert_allclose(got[name], expected, rtol=1e-6)


@pytest.mark.parametrize("name, layered", [("lenet", True), ("resnet", True), ("mlp", True), ("branchnet", True),
                                           ("gru_digits", False), ("transformer_digits", False)])
def test_import_writes_the_catalogs_layers_where_every_node_maps_to_one(tmp_path, name, layered):
    import yaml

    import toolkit
    out = tmp_path / f"{name}.onnx"
    assert cli("export", "onnx", f"zoo:{name}", "-o", out).status == 0
    r = cli("import", "onnx", out, "--out", tmp_path / "imp")
    assert r.status == 0, r.err
    net = yaml.safe_load((tmp_path / "imp" / "net.yaml").read_text())
    types = {layer["type"] for layer in net["layers"]}
    assert ("ONNX" not in types) == layered, (types, r.out)
    assert ("not a net of the catalog's layers, because of node" in r.out) == (not layered)
    # the exported transform reads back as the imported net's: both apply it
    ours = toolkit.load(f"zoo:{name}")
    again = toolkit.load(str(tmp_path / "imp" / "net.yaml"), weights=str(tmp_path / "imp" / "model.safetensors"))
    assert again.transform is not None and again.transform.steps == ours.transform.steps
    rng = np.random.default_rng(3)
    feeds = {i.name: (rng.integers(0, 8, [3 if d is None else d for d in i.shape]) if i.dtype.startswith("int")
                      else rng.random([3 if d is None else d for d in i.shape])).astype(i.dtype) for i in ours.inputs}
    for key, want in ours.infer(**feeds).items():
        np.testing.assert_allclose(again.infer(**feeds)[key], want, rtol=1e-4, atol=1e-5)


def test_a_constant_too_big_to_fold_is_one_error_however_free_memory_moves(tmp_path, monkeypatch):
    """Each of the net's three phases imports the model; with the free memory shrinking between
    them (another process allocating), the problem is still reported once: the fixed cap is the
    reason given, not the moving figure."""
    from onnx import TensorProto, helper

    import toolkit.hostmem as hostmem
    free = iter(range(40 << 30, 0, -(100 << 20)))
    monkeypatch.setattr(hostmem, "available_memory", lambda: next(free))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])]
    inits = [helper.make_tensor("s", TensorProto.INT64, [2], [100000, 100000])]
    path = tmp_path / "fill.onnx"
    path.write_bytes(helper.make_model(helper.make_graph(nodes, "fill", [x], [y], inits),
                                       opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    r = cli("check", path)
    assert r.status == 2 and len(r.errors) == 1, r.err
    assert "over the 1.0 GiB a constant computed at import may hold" in r.errors[0]


def test_a_hostile_model_cannot_make_the_importer_allocate_without_bound(tmp_path):
    """A few bytes asking for a huge constant at import (ConstantOfShape of 10^10 elements, a
    constant outer product) are one line each, before anything is allocated; an .onnx given as a
    net names the model, not a place in a net file."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    cases = {
        "fill": ([helper.make_node("ConstantOfShape", ["s"], ["c"]), helper.make_node("Add", ["c", "x"], ["y"])],
                 [helper.make_tensor("s", TensorProto.INT64, [2], [100000, 100000])]),
        "outer": ([helper.make_node("Range", ["zero", "n", "one"], ["r"]),
                   helper.make_node("Unsqueeze", ["r", "ax"], ["col"]),
                   helper.make_node("Unsqueeze", ["r", "ax0"], ["row"]),
                   helper.make_node("MatMul", ["col", "row"], ["c"]),
                   helper.make_node("Add", ["c", "x"], ["y"])],
                  [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
                   helper.make_tensor("n", TensorProto.FLOAT, [], [2e5]),
                   helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
                   helper.make_tensor("ax", TensorProto.INT64, [1], [1]),
                   helper.make_tensor("ax0", TensorProto.INT64, [1], [0])]),
    }
    for name, (nodes, inits) in cases.items():
        path = tmp_path / f"{name}.onnx"
        graph = helper.make_graph(nodes, name, [x], [y], inits)
        path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
        with pytest.raises(UserError, match="folding it at import would make a constant of up to"):
            import_model(str(path))
        r = cli("check", path)
        assert r.status == 2 and len(r.errors) == 1 and r.errors[0].startswith(f"error: {path}: node "), r.err

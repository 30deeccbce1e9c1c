"""Quantized ONNX models read by the importer and run against ONNX Runtime:

- a small conv net (conv, relu, max pooling, conv, relu, flatten, gemm) quantized by ONNX
  Runtime's own ``quantize_static`` over a few calibration inputs, in its QDQ and QOperator
  formats, per tensor and per channel, uint8 activations (and int8 in QDQ): the toolkit runs its
  convolutions and its Gemm as qconv2d / qgemm and equals ONNX Runtime within one step of the
  output's scale;
- a residual net (a residual add, average pooling, a concatenation, global average pooling) in
  both formats: every op runs in int8 (qadd, qavg_pool2d, qconcat, qglobal_avg_pool), within one
  step of ONNX Runtime in QDQ and equal to it in QOperator;
- the same through the command line: ``toolkit import onnx`` and ``toolkit infer``;
- the ONNX project's own node cases of QuantizeLinear, DequantizeLinear, QLinearConv,
  QLinearMatMul, ConvInteger and MatMulInteger (uint8 weights, zero points, 3-d products),
  exactly;
- a quantized op with no counterpart: one line naming it, exit status 2.

ONNX Runtime runs with its ``session.x64quantprecision`` switch on: by default its u8 x s8 kernels
on an x64 processor without VNNI sum pairs of products in 16 bits, which saturate with full-range
weights (tests/ops/test_quant_ops.py measured this), and the switch makes them exact.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime is the reference")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import (  # noqa: E402
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)

from layers.onnx import import_proto  # noqa: E402
from tests.train.train_helpers import cli  # noqa: E402
from toolkit.ops.interpreter import interpret  # noqa: E402

SHAPE = (3, 10, 10)


def float_model(path, seed: int = 0, relu_last: bool = True):
    """conv 3x3 pad 1, relu, max pool 2, conv 3x3, relu, flatten, gemm (transB), as ONNX."""
    rng = np.random.default_rng(seed)

    def init(name, shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *SHAPE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [init("w1", (4, 3, 3, 3)), init("b1", (4,), 0.1), init("w2", (6, 4, 3, 3)), init("b2", (6,), 0.1),
         init("w3", (10, 54)), init("b3", (10,), 0.1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


class Calibration(CalibrationDataReader):
    def __init__(self, count: int = 8):
        rng = np.random.default_rng(1)
        self.feeds = iter([{"x": rng.standard_normal((1, *SHAPE)).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self.feeds, None)


def quantized_model(tmp_path, fmt: str, per_channel: bool, activations: str = "uint8"):
    source = float_model(tmp_path / "float.onnx")
    out = tmp_path / f"{fmt}-{per_channel}-{activations}.onnx"
    quantize_static(str(source), str(out), Calibration(), quant_format=getattr(QuantFormat, fmt),
                    per_channel=per_channel, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8)
    return out


def output_scale(model) -> float:
    """The scale of the DequantizeLinear that gives the model's output."""
    out = model.graph.output[0].name
    node = next(n for n in model.graph.node if out in n.output)
    assert node.op_type == "DequantizeLinear"
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return float(init[node.input[1]])


def ort_session(path):
    """ONNX Runtime's session, its integer kernels exact on every x64 processor."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_run(path, x):
    return ort_session(path).run(None, {"x": x})[0]


def inputs(batch: int = 4, seed: int = 5):
    return np.random.default_rng(seed).standard_normal((batch, *SHAPE)).astype(np.float32)


CASES = [("QDQ", False, "uint8"), ("QDQ", True, "uint8"), ("QOperator", False, "uint8"),
         ("QOperator", True, "uint8"), ("QDQ", True, "int8"), ("QDQ", False, "int8")]


@pytest.mark.parametrize("fmt,per_channel,activations", CASES,
                         ids=[f"{f}-{'channel' if p else 'tensor'}-{a}" for f, p, a in CASES])
def test_a_model_quantized_by_onnx_runtime_runs_as_onnx_runtime(tmp_path, fmt, per_channel, activations):
    path = quantized_model(tmp_path, fmt, per_channel, activations)
    model = onnx.load(str(path))
    imported = import_proto(model, str(path))
    ops = [n.op for n in imported.graph.nodes]
    # the int8 ops run the convolutions and the gemm; no float convolution or product is left
    assert ops.count("qconv2d") == 2 and ops.count("qgemm") == 1, ops
    assert "conv2d" not in ops and "matmul" not in ops
    x = inputs()
    got, _ = interpret(imported.graph, {"x": x}, dict(imported.weights))
    got = got["y"]
    want = ort_run(path, x)
    step = output_scale(model)
    diff = np.abs(got - want)
    assert diff.max() <= step * 1.001, f"{diff.max() / step:.2f} steps apart"
    assert (diff == 0).mean() >= 0.95
    # not trivially so: the outputs spread over many steps
    assert len(np.unique(np.round(want / step))) > 15


def live_ops(graph) -> list[str]:
    """The ops the graph's outputs depend on (a pattern the importer replaced leaves its float
    nodes behind, unread, for the compiler's dead-code pass)."""
    producer = {v.id: n for n in graph.nodes for v in n.outputs}
    seen, todo = {}, list(graph.outputs.values())
    while todo:
        node = producer.get(todo.pop().id)
        if node is not None and id(node) not in seen:
            seen[id(node)] = node.op
            todo.extend(node.inputs)
    return list(seen.values())


def residual_model(path):
    """conv, relu, conv, residual add, relu, average pooling 2x2, a 1x1 conv concatenated to its
    input, global average pooling, flatten."""
    rng = np.random.default_rng(0)

    def init(name, shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r2"]),
             helper.make_node("AveragePool", ["r2"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["ap", "w3"], ["c3"]),
             helper.make_node("Concat", ["ap", "c3"], ["cat"], axis=1),
             helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
             helper.make_node("Flatten", ["g"], ["y"])]
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 12])],
        [init("w1", (8, 3, 3, 3)), init("b1", (8,), 0.1), init("w2", (8, 8, 3, 3)), init("b2", (8,), 0.1),
         init("w3", (4, 8, 1, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


class ResidualCalibration(CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(1)
        self.feeds = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.feeds, None)


@pytest.mark.parametrize("fmt,per_channel", [("QDQ", True), ("QDQ", False), ("QOperator", True)])
def test_a_residual_net_runs_int8_end_to_end(tmp_path, fmt, per_channel):
    path = tmp_path / f"residual-{fmt}.onnx"
    quantize_static(str(residual_model(tmp_path / "residual.onnx")), str(path), ResidualCalibration(),
                    quant_format=getattr(QuantFormat, fmt), per_channel=per_channel)
    model = onnx.load(str(path))
    imported = import_proto(model, str(path))
    ops = sorted(op for op in live_ops(imported.graph) if op not in ("constant", "dequantize_linear", "reshape"))
    assert ops == ["qadd", "qavg_pool2d", "qconcat", "qconv2d", "qconv2d", "qconv2d", "qglobal_avg_pool",
                   "quantize_linear"]
    x = np.random.default_rng(3).standard_normal((4, 3, 8, 8)).astype(np.float32)
    got = interpret(imported.graph, {"x": x}, dict(imported.weights))[0]["y"]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    if fmt == "QOperator":     # its layout transformer refuses this model's int8 QLinearConv
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    want = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    step = output_scale(model)
    if fmt == "QOperator":     # the same integer ops, one by one
        np.testing.assert_array_equal(got, want)
    else:                      # ONNX Runtime's fused kernels round their factors in float32
        assert np.abs(got - want).max() <= step * 1.001 and (got == want).mean() >= 0.7
    assert len(np.unique(want)) > 20


def test_a_qdq_relu_folds_into_the_quantized_convolution(tmp_path):
    """DequantizeLinear -> Conv -> Relu -> QuantizeLinear (a QDQ model that keeps its Relu) is one
    qconv2d with the ReLU in its store, equal to ONNX Runtime's."""
    rng = np.random.default_rng(3)
    w = rng.integers(-127, 128, (5, 3, 3, 3)).astype(np.int8)
    scales = rng.uniform(0.002, 0.01, 5).astype(np.float32)
    inits = [numpy_helper.from_array(np.float32(0.02), "xs"), numpy_helper.from_array(np.uint8(120), "xz"),
             numpy_helper.from_array(w, "wq"), numpy_helper.from_array(scales, "ws"),
             numpy_helper.from_array(np.zeros(5, np.int8), "wz"), numpy_helper.from_array(np.float32(0.015), "ys"),
             numpy_helper.from_array(np.uint8(0), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    imported = import_proto(model, str(path))
    convs = [n for n in imported.graph.nodes if n.op == "qconv2d"]
    assert len(convs) == 1 and convs[0].attrs["relu"] and convs[0].attrs["out_dtype"] == "uint8"
    x = np.random.default_rng(4).uniform(-2, 2, (2, 3, 6, 6)).astype(np.float32)
    got = interpret(imported.graph, {"x": x}, {})[0]["y"]
    want = ort_run(path, x)
    assert np.abs(got - want).max() <= 0.015 * 1.001
    assert (got == want).mean() >= 0.95 and (want == 0).any() and len(np.unique(want)) > 20


def test_import_and_infer_from_the_command_line(tmp_path):
    path = quantized_model(tmp_path, "QDQ", True)
    out = tmp_path / "imported"
    r = cli("import", "onnx", path, "--out", out)
    assert r.status == 0, r.err
    x = inputs(3, seed=8)
    np.save(tmp_path / "x.npy", x)
    r = cli("infer", out / "net.yaml", "--weights", out / "model.safetensors", "--input", f"x={tmp_path / 'x.npy'}",
            "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    got = np.load(tmp_path / "y.npy")
    want = ort_run(path, x)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= output_scale(onnx.load(str(path))) * 1.001


# -- the ONNX project's node cases ------------------------------------------------------------------------
QUANTIZED_OPS = ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger")


def _node_cases():
    import warnings

    from onnx.backend.test.case import node
    with warnings.catch_warnings():          # some cases' data overflow on purpose
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    types = {TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32, TensorProto.FLOAT, TensorProto.FLOAT16}
    found = []
    for case in cases:
        nodes = case.model.graph.node
        if len(nodes) != 1 or nodes[0].op_type not in QUANTIZED_OPS or any(
                a.name == "block_size" for a in nodes[0].attribute):
            continue
        values = list(case.model.graph.input) + list(case.model.graph.output)
        if all(v.type.tensor_type.elem_type in types for v in values):
            found.append(case)
    return found


def _as_array(a):
    return numpy_helper.to_array(a) if hasattr(a, "dims") else np.asarray(a)


NODE_CASES = _node_cases()


def test_the_node_cases_are_found():
    ops = {c.model.graph.node[0].op_type for c in NODE_CASES}
    assert ops == set(QUANTIZED_OPS) and len(NODE_CASES) >= 16


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_the_onnx_node_cases_exactly(case):
    """Each case with its scales and zero points (inputs in the cases) made initializers, as a
    quantized model holds them; the first input fed."""
    (feeds, outputs), = case.data_sets[:1]
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    arrays = [_as_array(a) for a in feeds]
    for info, a in list(zip(model.graph.input, arrays))[1:]:
        model.graph.initializer.append(numpy_helper.from_array(a, info.name))
    del model.graph.input[1:]
    imported = import_proto(model, case.name)
    got, _ = interpret(imported.graph, {model.graph.input[0].name: arrays[0]}, dict(imported.weights))
    for info, expected in zip(model.graph.output, outputs):
        expected = _as_array(expected)
        assert got[info.name].dtype == expected.dtype
        np.testing.assert_array_equal(got[info.name], expected)


# -- what has no counterpart ------------------------------------------------------------------------------
def _model(path, nodes, inits):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_quantized_op_with_no_counterpart_is_one_line(tmp_path):
    inits = [numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(3), "z")]
    path = _model(tmp_path / "qmul.onnx", [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("QLinearMul", ["q", "s", "z", "q", "s", "z", "s", "z"], ["y"], domain="com.microsoft")],
        inits)
    r = cli("compile", path)
    assert r.status == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "QLinearMul" in lines[0] and "com.microsoft" in lines[0] and "Traceback" not in r.err


def test_blocked_quantization_is_one_line(tmp_path):
    inits = [numpy_helper.from_array(np.full((1, 2), 0.1, np.float32), "s"),
             numpy_helper.from_array(np.zeros((1, 2), np.uint8), "z")]
    path = _model(tmp_path / "blocked.onnx", [helper.make_node(
        "QuantizeLinear", ["x", "s", "z"], ["q"], axis=1, block_size=2)], inits)
    model = onnx.load(str(path))
    model.opset_import[0].version = 21
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
    model.ir_version = 10
    onnx.save(model, str(path))
    r = cli("compile", path)
    assert r.status == 2
    assert len(r.err.strip().splitlines()) == 1 and "block_size" in r.err


def test_a_convolution_whose_relu_is_a_model_output_stays_float_there(tmp_path):
    """DequantizeLinear -> Conv -> Relu, the Relu's value an output of the model and read by a
    QuantizeLinear too: the output is the float ReLU of the convolution, not its quantized form."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.float32(0.02), "xs"), numpy_helper.from_array(np.uint8(120), "xz"),
             numpy_helper.from_array(rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.float32(0.004), "ws"), numpy_helper.from_array(np.float32(0.05), "ys"),
             numpy_helper.from_array(np.uint8(0), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "ys", "yz"], ["d"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("d", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "two.onnx"
    onnx.save(model, str(path))
    imported = import_proto(model, str(path))
    x = np.random.default_rng(6).uniform(-2, 2, (1, 3, 5, 5)).astype(np.float32)
    got = interpret(imported.graph, {"x": x}, {})[0]
    want = ort_session(path).run(None, {"x": x})
    np.testing.assert_allclose(got["r"], want[0], rtol=1e-5, atol=1e-6)
    steps = got["r"] / np.float32(0.05)
    assert (np.abs(steps - np.rint(steps)) > 0.01).sum() > 5      # float values, not 0.05 steps
    assert np.abs(got["d"] - want[1]).max() <= 0.05 * 1.001


def test_a_quantized_model_input_is_one_line(tmp_path):
    """A net's inputs are floats or indices: a model fed uint8 is refused by the net file, naming
    the input, before anything is written."""
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.float32(0.1), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "u8.onnx"
    onnx.save(model, str(path))
    r = cli("import", "onnx", path, "--out", tmp_path / "out")
    assert r.status == 2 and len(r.err.strip().splitlines()) == 1
    assert "input 'x' is uint8" in r.err and "QuantizeLinear" in r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("per_channel", [True, False], ids=["channel", "tensor"])
def test_qdq_matmuls_run_as_qgemm(tmp_path, per_channel):
    """MatMul by a [K, N] weight (ONNX Runtime quantizes it per column: axis 1), a Relu between
    two: each one qgemm, equal to ONNX Runtime. (Its QOperator form, QLinearMatMul of uint8 by
    int8, has no kernel in ONNX Runtime at opset 10; the node cases check that op.)"""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "mm.onnx"))

    class Rows(CalibrationDataReader):
        def __init__(self):
            r = np.random.default_rng(1)
            self.feeds = iter([{"x": r.standard_normal((4, 16)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.feeds, None)
    path = tmp_path / "mm-qdq.onnx"
    quantize_static(str(tmp_path / "mm.onnx"), str(path), Rows(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel)
    quantized = onnx.load(str(path))
    imported = import_proto(quantized, str(path))
    assert sorted(op for op in live_ops(imported.graph) if op.startswith("q")) == ["qgemm", "qgemm", "quantize_linear"]
    x = np.random.default_rng(3).standard_normal((6, 16)).astype(np.float32)
    got = interpret(imported.graph, {"x": x}, dict(imported.weights))[0]["y"]
    want = ort_run(path, x)
    assert np.abs(got - want).max() <= output_scale(quantized) * 1.001
    assert len(np.unique(want)) > 15

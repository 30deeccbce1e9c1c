"""ONNX ops written in several primitives (layers/onnx/logic.py, windows.py) run as
``toolkit infer model.onnx`` runs them (the model loaded as a net and compiled for the CPU) and
equal ONNX Runtime on the same model: the boolean ops, Pow with a computed or integer exponent,
ReduceProd, pooling with dilations, ceil_mode, unequal padding and three image axes, 3-d
convolution, 1-d transposed convolution and one given a larger output_shape, Slice with
negative and larger steps, Pad's reflect/edge/wrap, ArgMax's select_last_index, Max/Min/TopK and
Div of integers, ReduceMax of booleans, Gather along any axis with indices given at run time,
Dropout's mask, BatchNormalization's training mode and a Split's empty part. What they cannot
express is one line naming it, as is a Constant whose data does not fill its dims."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime is the reference")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from toolkit.errors import UserError  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _model(nodes, inputs, outputs, inits=(), opset=20):
    graph = helper.make_graph(nodes, "written", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _through_toolkit_and_runtime(tmp_path, model, feeds):
    import toolkit
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    names = [o.name for o in model.graph.output]
    want = dict(zip(names, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)))
    got = toolkit.load(str(path)).infer(**feeds)
    return got, want


# Pow of integers at run time (k ** e, k from -6 to 6): 0 ** e goes through log(0) = -inf and
# exp(-inf) = 0, as the lowering intends; the numpy kernel says so
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
def test_the_written_ops_equal_onnx_runtime_through_the_compiled_net(tmp_path):
    v = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Less", ["y", "zero"], ["neg"]),
        helper.make_node("And", ["pos", "neg"], ["and"]),
        helper.make_node("Or", ["pos", "neg"], ["or"]),
        helper.make_node("Xor", ["pos", "neg"], ["xor"]),
        helper.make_node("Not", ["pos"], ["not"]),
        helper.make_node("ReduceMax", ["pos", "axis3"], ["any"], keepdims=0),
        helper.make_node("Pow", ["x", "y"], ["pow"]),                      # exponent computed at run time
        helper.make_node("Pow", ["k", "e"], ["ipow"]),                     # integers
        helper.make_node("ReduceProd", ["x", "axis3"], ["prod"], keepdims=1),
        helper.make_node("MaxPool", ["x"], ["mp"], kernel_shape=[3, 2], dilations=[2, 2], strides=[2, 1],
                         pads=[1, 0, 2, 1], ceil_mode=1),
        helper.make_node("MaxPool", ["x"], ["mpgrid"], kernel_shape=[2, 2], dilations=[2, 2], strides=[2, 4],
                         pads=[1, 0, 0, 1]),                                # the stride a multiple of the dilation
        helper.make_node("AveragePool", ["x"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 2, 2],
                         ceil_mode=1, count_include_pad=1),
        helper.make_node("Reshape", ["x", "shape5"], ["x5"]),
        helper.make_node("AveragePool", ["x5"], ["ap3"], kernel_shape=[2, 2, 2], strides=[1, 2, 2],
                         pads=[1, 0, 1, 0, 1, 1]),
        helper.make_node("Conv", ["x5", "w5", "b5"], ["conv3"], strides=[1, 2, 1], pads=[1, 1, 0, 0, 1, 1],
                         dilations=[2, 1, 2]),
        helper.make_node("Reshape", ["x", "shape3"], ["x3"]),
        helper.make_node("ConvTranspose", ["x3", "wt"], ["ct1"], strides=[2], pads=[1, 0]),
        helper.make_node("ConvTranspose", ["x", "wt2", "bt2"], ["ct2"], strides=[2, 2], output_shape=[14, 13]),
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["sl"]),
        helper.make_node("Pad", ["x", "pads", "", "axes23"], ["refl"], mode="reflect"),
        helper.make_node("Pad", ["x", "pads", "", "axes23"], ["edge"], mode="edge"),
        helper.make_node("Pad", ["x", "pads", "", "axes23"], ["wrap"], mode="wrap"),
        helper.make_node("ArgMax", ["r"], ["last"], axis=2, select_last_index=1, keepdims=0),
        helper.make_node("ArgMin", ["r"], ["lastmin"], axis=3, select_last_index=1),
        helper.make_node("Min", ["k", "e"], ["imin"]),
        helper.make_node("TopK", ["k", "two"], ["topv", "topi"], axis=1),
        helper.make_node("Div", ["k", "dv"], ["idiv"]),                    # truncated toward zero
        helper.make_node("Gather", ["x", "gi"], ["gat"], axis=3),          # indices at run time, negative too
        helper.make_node("Dropout", ["x"], ["dx", "dmask"]),
        helper.make_node("BatchNormalization", ["x", "s3", "b3", "m3", "v3"], ["bn", "rm", "rv"], training_mode=1,
                         momentum=0.8),
        helper.make_node("Split", ["x", "parts"], ["whole", "nothing"], axis=3),
        helper.make_node("Concat", ["nothing", "whole"], ["cat"], axis=3),
    ]
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"), _ints("axis3", [3]),
             _ints("shape5", [2, 1, 3, 6, 6]), _ints("starts", [-1, 5, 0]), _ints("ends", [-100, 0, 100]),
             _ints("axes", [1, 2, 3]), _ints("steps", [-2, -2, 4]), _ints("pads", [2, 1, 3, 2]),
             _ints("axes23", [2, 3]), _ints("two", [2]),
             numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 1, 2, 3, 2)).astype(np.float32),
                                     "w5"),
             numpy_helper.from_array(np.array([0.5, -1.0, 0.0, 2.0], np.float32), "b5"), _ints("parts", [6, 0])] + \
        [numpy_helper.from_array(np.array(values, np.float32), name) for name, values in
         (("s3", [1.0, 2.0, -0.5]), ("b3", [0.0, 0.1, -1.0]), ("m3", [0.3, -0.2, 1.0]), ("v3", [1.0, 2.0, 0.5]),
          ("bt2", [0.5]))] + \
        [_ints("shape3", [2, 3, 36])] + \
        [numpy_helper.from_array(np.random.default_rng(k).standard_normal(shape).astype(np.float32), name)
         for k, (name, shape) in enumerate((("wt", (3, 2, 3)), ("wt2", (3, 1, 3, 3))))]
    outs = [v(n, B, None) for n in ("and", "or", "xor", "not", "any")] + \
        [v(n, F, None) for n in ("pow", "prod", "mp", "mpgrid", "ap", "ap3", "conv3", "ct1", "ct2", "sl", "refl",
                                 "edge", "wrap", "gat", "dx", "bn", "rm", "rv", "cat")] + \
        [v(n, I64, None) for n in ("ipow", "last", "lastmin", "imin", "topv", "topi", "idiv")] + [v("dmask", B, None)]
    model = _model(nodes, [v("x", F, [2, 3, 6, 6]), v("y", F, [2, 3, 6, 6]), v("k", I64, [2, 5]),
                           v("e", I64, [2, 5]), v("r", F, [2, 3, 4, 5]), v("dv", I64, [2, 5]), v("gi", I64, [2, 4])],
                   outs, inits)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    y = np.round(rng.standard_normal((2, 3, 6, 6)) * 2).astype(np.float32)     # integers: a negative x's power is real
    r = rng.integers(0, 3, (2, 3, 4, 5)).astype(np.float32)                    # ties, so the last index differs
    feeds = {"x": x, "y": y, "k": rng.integers(-6, 7, (2, 5)).astype(np.int64),
             "e": rng.integers(0, 5, (2, 5)).astype(np.int64), "r": r,
             "dv": rng.choice([-3, -2, -1, 1, 2, 3], (2, 5)).astype(np.int64),
             "gi": rng.integers(-6, 6, (2, 4)).astype(np.int64)}
    got, want = _through_toolkit_and_runtime(tmp_path, model, feeds)
    assert len(want) == 32 and set(got) >= set(want)
    for name, expected in want.items():
        assert got[name].shape == expected.shape, name
        if expected.dtype.kind in "biu":
            np.testing.assert_array_equal(got[name], expected, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("node, inits, why", [
    (helper.make_node("Pad", ["x", "p"], ["z"], mode="reflect"), [_ints("p", [0, 3, 0, 0, 0, 0, 0, 0])],
     "Pad mode reflect of 3 elements along an axis of 3: more than the axis holds"),
    (helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["z"]),
     [_ints("s", [0]), _ints("e", [3]), _ints("a", [1]), _ints("t", [-1])],
     "the slice of axis 1 is empty; an empty tensor has no counterpart here"),
])
def test_what_the_written_ops_cannot_express_is_one_line(tmp_path, node, inits, why):
    from layers.onnx import import_model
    v = helper.make_tensor_value_info
    model = _model([node], [v("x", F, [2, 3, 4, 5])], [v("z", F, None)], inits)
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(UserError) as e:
        import_model(str(path))
    assert str(e.value).endswith(why) and "\n" not in str(e.value)


def test_a_constant_whose_data_does_not_fill_its_dims_is_one_line(tmp_path):
    from layers.onnx import import_model
    tensor = helper.make_tensor("c", F, [4], [1.0, 2.0, 3.0, 4.0])
    tensor.float_data.append(5.0)                   # five values for four elements
    model = _model([helper.make_node("Constant", [], ["z"], value=tensor, name="k")], [],
                   [helper.make_tensor_value_info("z", F, [4])])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(UserError) as e:
        import_model(str(path))
    assert str(e.value).endswith("node 'k' (Constant): its tensor cannot be read: cannot reshape array of size 5 "
                                 "into shape (4,)")


def test_shape_arithmetic_that_does_not_fit_and_a_huge_tile_are_one_line(tmp_path):
    from layers.onnx import import_model
    v = helper.make_tensor_value_info
    cases = [
        (_model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Add", ["s", "three"], ["t"], name="plus"),
                 helper.make_node("Reshape", ["x", "t"], ["z"])], [v("x", F, ["N", 3])], [v("z", F, None)],
                [_ints("three", [1, 2, 3])]),
         "node 'plus' (Add): folding it at import failed: operands could not be broadcast together with shapes "
         "(2,) (3,) "),
        (_model([helper.make_node("Tile", ["x", "r"], ["z"], name="tile")], [v("x", F, [2, 3])], [v("z", F, None)],
                [_ints("r", [2**40, 2**20])]),
         "node 'tile' (Tile): repeats [1099511627776, 1048576] make a tensor of "),
    ]
    for model, why in cases:
        path = tmp_path / "m.onnx"
        path.write_bytes(model.SerializeToString())
        with pytest.raises(UserError) as e:
            import_model(str(path))
        assert why in str(e.value) and "\n" not in str(e.value)

"""Writes the fuzzing corpus's seeds (``python -m tests.fuzz.make_seeds``): for each target a few
small inputs that the toolkit reads whole, taken from the tests' own files or written the way the
tests write them, so that the fuzzer starts from inputs that reach deep into each parser.
Each seed is named ``seed-...``; the corpus's other entries (``found-...``) are inputs the fuzzer
found to break the property once, kept so that the replay holds the fix."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from tests.fuzz.targets import CAFFE_NET

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
CAFFE_DATA = ROOT / "tests" / "data" / "caffe"

PROTOTXTS = ["examples_mnist_lenet.prototxt", "examples_mnist_lenet_train_test.prototxt",
             "examples_cifar10_cifar10_quick.prototxt", "examples_cifar10_cifar10_full.prototxt",
             "examples_mnist_mnist_autoencoder.prototxt", "examples_mnist_lenet_solver.prototxt",
             "examples_mnist_lenet_adadelta_solver.prototxt", "examples_cifar10_cifar10_quick_solver.prototxt",
             "models_bvlc_alexnet_deploy.prototxt"]
NETS = [ROOT / "zoo" / name / "net.yaml" for name in ("lenet", "mlp", "branchnet", "gru_digits", "resnet",
                                                       "transformer_digits")]
NETS += [ROOT / "benchmarks" / "nets" / name for name in ("decoder_lengths.yaml", "gru_lengths.yaml",
                                                          "inception.yaml")]
# ONNX's own node test cases (the conformance suite's) of the ops whose sizes come from the model
ONNX_CASES = ["test_reshape_reordered_all_dims", "test_reshape_negative_dim", "test_expand_dim_changed",
              "test_tile", "test_constantofshape_int_zeros", "test_range_float_type_positive_delta",
              "test_range_int32_type_negative_delta_expanded", "test_loop11", "test_if",
              "test_conv_with_strides_padding", "test_maxpool_2d_pads", "test_gemm_all_attributes",
              "test_slice_neg_steps", "test_gather_1", "test_concat_3d_axis_negative_1",
              "test_split_equal_parts_1d_opset13", "test_resize_upsample_scales_nearest",
              "test_lrn", "test_batchnorm_epsilon", "test_transpose_all_permutations_0", "test_pad",
              "test_einsum_batch_matmul", "test_cumsum_1d_exclusive", "test_topk", "test_scatter_elements_with_axis",
              "test_nonzero_example", "test_where_example", "test_lstm_defaults", "test_gru_defaults",
              "test_softmax_axis_1", "test_averagepool_2d_ceil", "test_convtranspose_pad", "test_squeeze",
              "test_unsqueeze_axis_0", "test_shape", "test_size", "test_onehot_with_axis", "test_depthtospace_dcr_mode",
              "test_reduce_sum_keepdims_example", "test_argmax_default_axis_example"]


def _caffemodel(v1: bool = False, legacy: bool = False, double: bool = False) -> bytes:
    from toolkit.importers.caffe.proto import classes
    rng = np.random.default_rng(0)
    shapes = {"conv": [(2, 3, 3, 3), (2,)], "bn": [(2,), (2,), (1,)], "scale": [(2,), (2,)], "prelu": [(2,)],
              "deconv": [(2, 1, 2, 2), (2,)], "ip": [(3, 50), (3,)], "embed": [(4, 2), (2,)]}
    c = classes()
    net = c["NetParameter"](name="blobs")
    for name, blobs in shapes.items():
        layer = net.layers.add(name=name, type=4) if v1 else net.layer.add(name=name, type="unused")
        for shape in blobs:
            blob = layer.blobs.add()
            values = rng.standard_normal(int(np.prod(shape))).round(3).tolist()
            if legacy:                      # Caffe's first files: num, channels, height, width
                full = (1,) * (4 - len(shape)) + tuple(shape)
                blob.num, blob.channels, blob.height, blob.width = full
            else:
                blob.shape.dim.extend(shape)
            (blob.double_data if double else blob.data).extend(values)
    return net.SerializeToString()


def _onnx_seeds() -> dict[str, bytes]:
    import warnings

    from onnx.backend.test.case import node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = {case.name: case for case in node.collect_testcases(None)}
    out = {}
    for name in ONNX_CASES:
        if name in cases and cases[name].model is not None:
            out[name.removeprefix("test_")] = cases[name].model.SerializeToString()
    from onnx import TensorProto, helper, numpy_helper
    weight = numpy_helper.from_array(np.full((2, 1, 3, 3), 0.5, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("Softmax", ["f"], ["y"])],
        "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 32])], [weight])
    out["conv_net"] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    out.update(_onnx_sized())
    return out


def _onnx_sized() -> dict[str, bytes]:
    """Models whose sizes are constants of the model (shapes, repeats, trip counts), known at import:
    the mutations of those numbers are what the importer must bound."""
    from onnx import TensorProto, helper, numpy_helper

    def model(nodes, inits, out_shape, out_type=TensorProto.FLOAT) -> bytes:
        graph = helper.make_graph(nodes, "sized", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])],
                                  [helper.make_tensor_value_info("y", out_type, out_shape)],
                                  [numpy_helper.from_array(np.asarray(v, dtype=np.int64), k) for k, v in inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    node = helper.make_node
    body = helper.make_graph(
        [node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones((), np.float32))),
         node("Add", ["carried", "one"], ["next"]), node("Identity", ["cond_in"], ["cond_out"]),
         node("Identity", ["next"], ["scanned"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carried", TensorProto.FLOAT, ["N", 2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("next", TensorProto.FLOAT, ["N", 2, 3]),
         helper.make_tensor_value_info("scanned", TensorProto.FLOAT, ["N", 2, 3])])
    return {
        "sized_reshape": model([node("Reshape", ["x", "shape"], ["y"])], {"shape": [-1, 6]}, ["N", 6]),
        "sized_tile": model([node("Tile", ["x", "repeats"], ["y"])], {"repeats": [1, 2, 2]}, ["N", 4, 6]),
        "sized_expand": model([node("Expand", ["x", "shape"], ["y"])], {"shape": [2, 1, 2, 3]}, [2, "N", 2, 3]),
        "sized_constantofshape": model(
            [node("Shape", ["x"], ["s"]), node("Mul", ["s", "k"], ["t"]), node("ConstantOfShape", ["t"], ["c"]),
             node("Add", ["c", "c"], ["y"])], {"k": [1, 1, 2]}, ["N", 2, 6]),
        "sized_range": model([node("Range", ["start", "limit", "delta"], ["y"])],
                             {"start": 0, "limit": 10, "delta": 3}, [4], TensorProto.INT64),
        "sized_slice": model([node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
                             {"starts": [0, -1], "ends": [2, -4], "axes": [1, 2], "steps": [1, -1]}, ["N", 2, 3]),
        "sized_loop": model([node("Loop", ["trips", "", "x"], ["y", "scan"], body=body)],
                            {"trips": 3}, ["N", 2, 3]),
    }


def _kserve_seeds() -> dict[str, bytes]:
    def request(inputs, **extra) -> bytes:
        return json.dumps({"inputs": inputs, **extra}).encode()
    fp32 = {"name": "data", "shape": [1, 1, 2, 2], "datatype": "FP32", "data": [0.0, 1.5, -2.0, 3.25]}
    seeds = {"json": b"\n" + request([fp32], id="7"),
             "json_outputs": b"\n" + request([fp32], outputs=[{"name": "prob", "parameters": {
                 "classification": 2, "binary_data": True}}], parameters={"binary_data_output": False}),
             "json_bytes": b"\n" + request([{"name": "image", "shape": [2], "datatype": "BYTES",
                                              "data": ["abc", "\u00e9"]}])}
    head = request([{"name": "data", "shape": [2, 2], "datatype": "INT64", "parameters": {"binary_data_size": 32}},
                    {"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}}])
    binary = np.arange(4, dtype=np.int64).tobytes() + struct.pack("<I", 3) + b"png"
    seeds["binary"] = str(len(head)).encode() + b"\n" + head + binary
    return seeds


def seeds() -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    out["prototxt"] = {Path(n).stem: (CAFFE_DATA / n).read_bytes() for n in PROTOTXTS}
    out["prototxt"]["blobs"] = CAFFE_NET.encode()
    out["caffemodel"] = {"blobs": _caffemodel(), "blobs_v1": _caffemodel(v1=True),
                         "blobs_legacy": _caffemodel(legacy=True), "blobs_double": _caffemodel(double=True)}
    out["onnx"] = _onnx_seeds()
    out["netfile"] = {f"{p.parent.name}_{p.stem}": p.read_bytes() for p in NETS}
    out["netfile"]["derived"] = b"base: zoo:lenet\nname: derived\nlayers:\n  - {name: ip2, num_output: 4}\n"
    out["kserve"] = _kserve_seeds()
    return out


def main() -> None:
    for target, files in seeds().items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("seed-*"):
            old.unlink()
        for name, data in files.items():
            (folder / f"seed-{name}").write_bytes(data)
        print(f"{target}: {len(files)} seeds, {sum(map(len, files.values())):,} bytes")


if __name__ == "__main__":
    main()

"""A small ONNX model whose tensors keep their bytes in a file beside it (``m.onnx`` +
``m.onnx.data``), for the tests of external data: its weights W, C and BRANCH, and the writer of
a tensor that says where its bytes lie. Imported only by test modules that have already skipped
themselves without onnx."""
from __future__ import annotations

import os

import numpy as np
from onnx import TensorProto, helper

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
C = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
BRANCH = np.array([10.0, 20.0, 30.0, 40.0], np.float32)


def external(name: str, array: np.ndarray, location: str, offset: int, entries=None) -> TensorProto:
    """A tensor of ``array``'s type and dims whose bytes are said to lie in ``location`` at
    ``offset`` (``entries`` override or, given None, drop the entries written)."""
    t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
    t.data_location = TensorProto.EXTERNAL
    said = {"location": location, "offset": str(offset), "length": str(array.nbytes)}
    said.update(entries or {})
    for key, value in said.items():
        if value is not None:
            t.external_data.add(key=key, value=value)
    return t


def write_model(folder, data_name="m.onnx.data", w_inline=False, **entries) -> str:
    """m.onnx in ``folder``: y = x @ W + C + (If sum(x) > 0 then BRANCH else -BRANCH), with W an
    initializer, C a Constant's value and BRANCH a Constant inside the If's then-body, all three
    kept in ``data_name`` (``entries`` change W's entries; ``w_inline`` keeps W in the model)."""
    os.makedirs(folder, exist_ok=True)
    data = W.tobytes() + C.tobytes() + BRANCH.tobytes()
    os.makedirs(os.path.dirname(os.path.join(folder, data_name)), exist_ok=True)
    with open(os.path.join(folder, data_name), "wb") as f:
        f.write(data)
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["t"], name="branch", value=external("", BRANCH, data_name, 64))],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])])
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["e"], value=helper.make_tensor("", TensorProto.FLOAT, [4], -BRANCH))],
        "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Constant", [], ["c"], name="bias", value=external("", C, data_name, 48)),
             helper.make_node("Add", ["xw", "c"], ["xwc"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["b"], name="choose", then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["xwc", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor("w", TensorProto.FLOAT, W.shape, W) if w_inline else
                               external("w", W, data_name, 0, entries),
                               helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(folder, "m.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path

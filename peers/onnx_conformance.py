"""The ONNX project's own test cases run through the importer: its node test cases
(``onnx.backend.test.case.node``), its pytorch-converted and pytorch-operator model tests and its
light real models. Each case's model is imported as ``toolkit infer model.onnx`` imports it (the
same converters, layers/onnx) and each of its data sets run by the reference interpreter
(toolkit/ops/interpreter.py), compared with the case's expected outputs at the case's own
tolerances. A case fed an input of a type a net's input cannot have (float16, bfloat16) fails, as
``toolkit infer`` refuses it. Used by test_onnx_import.py and by benchmarks/onnx_node_table.py, which counts them."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from toolkit.onnxtypes import ONNX_ELEMENT_TYPES


def node_cases():
    from onnx.backend.test.case import node
    return node.collect_testcases(None)


def _array(x) -> np.ndarray:
    """A data set's value: an array, or a TensorProto (some cases keep their data so)."""
    if hasattr(x, "SerializeToString") and hasattr(x, "dims"):
        from onnx import numpy_helper
        return numpy_helper.to_array(x)
    return np.asarray(x)


def case_ops(cases) -> dict[str, str]:
    """case name -> the op it tests: a one-node case's op; an expanded case (a function op written
    out in other ops) counts for the op of the case it expands, marked "(expanded)"."""
    ops = {}
    for case in cases:
        nodes = case.model.graph.node
        if len(nodes) == 1:
            ops[case.name] = nodes[0].op_type
    for case in cases:
        if case.name in ops:
            continue
        base = case.name.split("_expanded")[0]
        ops[case.name] = f"{ops[base]} (expanded)" if base in ops else nodes_summary(case)
    return ops


def nodes_summary(case) -> str:
    nodes = case.model.graph.node
    return nodes[-1].op_type if nodes else "?"


def _frozen(case, inputs, named: set = frozenset()) -> object:
    """The case's model with the inputs the importer asked to know (axes, shapes, repeats, k) made
    initializers, as a model file carries them; every other input stays an input."""
    from onnx import numpy_helper
    model = type(case.model)()
    model.CopyFrom(case.model)
    init = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    keep = []
    for info, arr in zip([i for i in model.graph.input if i.name not in init], inputs):
        arr = _array(arr)
        if info.name in named:
            model.graph.initializer.append(numpy_helper.from_array(arr, info.name))
        else:
            keep.append(info)
    del names
    while len(model.graph.input):
        model.graph.input.pop()
    model.graph.input.extend(keep)
    return model


def _integer_sources(case, name: str, inputs) -> set[str]:
    """The inputs to freeze where the importer asks to know ``name``: the input itself, or where
    it is computed (a crop's pads from its target shape), the integer inputs it is computed from."""
    init = {t.name for t in case.model.graph.initializer}
    graph_inputs = [i.name for i in case.model.graph.input if i.name not in init]
    if name in graph_inputs:
        return {name}
    integer = {n for n, a in zip(graph_inputs, inputs) if _array(a).dtype.kind in "iu"}
    wanted = {name}
    for node in reversed(list(case.model.graph.node)):
        if any(o in wanted for o in node.output):
            wanted |= {i for i in node.input if i}
    return wanted & integer


def run_case(case) -> tuple[str, str]:
    """("pass", ""), ("fail", why) or ("unsupported", why). Where the importer needs an integer
    input known (an axes or shape input), each data set's values are frozen into the model."""
    from layers.onnx import import_proto
    from toolkit.errors import UserError
    try:
        imported = import_proto(case.model, case.name)
    except UserError as e:
        text = str(e)
        if "must be known when the model is imported" not in text:
            kind = "unsupported" if "has no counterpart here" in text and "the op " in text else "fail"
            return kind, text.split(": ", 2)[-1]
        for inputs, outputs in case.data_sets:
            named: set[str] = set()
            while True:          # freeze each input the importer asks to know, one after another
                try:
                    imported = import_proto(_frozen(case, inputs, named), case.name)
                    break
                except UserError as again:
                    text = str(again)
                    name = text.split("('", 1)[1].split("')", 1)[0] if "('" in text else ""
                    wanted = _integer_sources(case, name, inputs)
                    if "must be known when the model is imported" not in text or not wanted - named:
                        return "fail", text.split(": ", 2)[-1]
                    named |= wanted
            status = _compare(case, imported, imported.graph.inputs, [(inputs, outputs)], frozen=True)
            if status[0] != "pass":
                return status
        return "pass", ""
    return _compare(case, imported, imported.graph.inputs, case.data_sets)


def _compare(case, imported, graph_inputs, data_sets, frozen: bool = False) -> tuple[str, str]:
    from typing import get_args

    from schemas.base import DType
    from toolkit.ops.interpreter import interpret
    graph = imported.graph
    for name, value in graph.inputs.items():
        # what a net file declares, and so what `toolkit infer model.onnx` feeds
        if value.dtype not in get_args(DType):
            return "fail", f"input '{name}' is {value.dtype}; a net's inputs are {', '.join(get_args(DType))}"
    init = {i.name for i in case.model.graph.initializer}
    names = [i.name for i in case.model.graph.input if i.name not in init]
    for inputs, outputs in data_sets:
        feeds = {n: _array(a) for n, a in zip(names, inputs) if n in graph_inputs}
        try:
            got, _ = interpret(graph, feeds, dict(imported.weights))
        except Exception as e:            # a run-time failure is a failed case, with its reason
            return "fail", f"run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        for info, expected in zip(case.model.graph.output, outputs):
            actual = got[info.name]
            expected = _array(expected)
            if actual.shape != expected.shape:
                return "fail", f"output {info.name} has shape {list(actual.shape)}, expected {list(expected.shape)}"
            try:
                np.testing.assert_allclose(actual.astype(expected.dtype) if expected.dtype != object else actual,
                                           expected, rtol=case.rtol, atol=case.atol)
            except AssertionError:
                err = np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max()
                return "fail", f"output {info.name} differs by {err:.3g}"
    return "pass", ""


def table(cases=None) -> dict[str, dict]:
    """op -> {"pass": [...], "fail": [(case, why)], "unsupported": [(case, why)]}."""
    cases = cases if cases is not None else node_cases()
    ops = case_ops(cases)
    out: dict[str, dict] = defaultdict(lambda: {"pass": [], "fail": [], "unsupported": []})
    for case in cases:
        status, why = run_case(case)
        entry = out[ops[case.name]][status]
        entry.append(case.name if status == "pass" else (case.name, why))
    return dict(out)


def data_dir() -> str:
    import os

    import onnx
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def model_cases(kind: str) -> list:
    """The ``pytorch-converted`` or ``pytorch-operator`` model tests shipped with the onnx package:
    each a folder with model.onnx and test_data_set_*/{input,output}_*.pb, read as node cases are."""
    import glob
    import os
    from types import SimpleNamespace

    import onnx
    from onnx import numpy_helper
    out = []
    for folder in sorted(glob.glob(os.path.join(data_dir(), kind, "*"))):
        model = onnx.load(os.path.join(folder, "model.onnx"))
        sets = []
        for data in sorted(glob.glob(os.path.join(folder, "test_data_set_*"))):
            def read(prefix):
                arrays = []
                for f in sorted(glob.glob(os.path.join(data, f"{prefix}_*.pb")),
                                key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0])):
                    t = onnx.TensorProto()
                    with open(f, "rb") as fh:
                        t.ParseFromString(fh.read())
                    arrays.append(numpy_helper.to_array(t))
                return arrays
            sets.append((read("input"), read("output")))
        out.append(SimpleNamespace(name=os.path.basename(folder), model=model, data_sets=sets, rtol=1e-3, atol=1e-7))
    return out


def light_cases() -> list:
    """The light real models (``light/light_*.onnx``): each fed what onnx's own backend runner
    feeds it (``Runner.generate_dummy_data``, not random) and compared with the output stored
    beside it, at the tolerance test_onnx_import.py holds them to."""
    import glob
    import os
    from types import SimpleNamespace

    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.runner import Runner
    out = []
    for path in sorted(glob.glob(os.path.join(data_dir(), "light", "light_*.onnx"))):
        name = os.path.basename(path)[len("light_"):-len(".onnx")]
        model = onnx.load(path)
        init = {i.name for i in model.graph.initializer}
        feeds = [Runner.generate_dummy_data(i, seed=0, name=name, random=False)
                 for i in model.graph.input if i.name not in init]
        expected = []
        for k in range(len(model.graph.output)):
            t = onnx.TensorProto()
            with open(path[:-len(".onnx")] + f"_output_{k}.pb", "rb") as fh:
                t.ParseFromString(fh.read())
            expected.append(numpy_helper.to_array(t))
        out.append(SimpleNamespace(name=name, model=model, data_sets=[(feeds, expected)],
                                   rtol=2e-3 if name == "densenet121" else 1e-3, atol=1e-7))
    return out


# The ops that have a counterpart here, fixed so that a count before and after a change divides by
# the same cases: every op with a converter (ops.py, control.py, recurrent.py) or a fold rule for
# computed values (Constant, Shape, Size) when the count was first taken, and the boolean ops and
# ReduceProd, which the catalog's primitives express.
COUNTERPARTS = frozenset("""
Abs Add ArgMax ArgMin AveragePool BatchNormalization Cast CastLike Clip Concat ConstantOfShape Conv
ConvTranspose Div Dropout Einsum Elu Equal Erf Exp Expand Flatten GRU Gather Gelu Gemm
GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual HardSigmoid HardSwish Identity If
InstanceNormalization LRN LSTM LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop
MatMul Max MaxPool Mean Min Mul Neg PRelu Pad Pow RNN Reciprocal ReduceL1 ReduceL2 ReduceLogSumExp
ReduceMax ReduceMean ReduceMin ReduceSum ReduceSumSquare Relu Reshape Scan Selu Sigmoid Sign Slice
Softmax Softplus Softsign Split Sqrt Squeeze Sub Sum Tanh Tile TopK Transpose Unsqueeze Where
Constant Shape Size
And Or Xor Not ReduceProd
""".split())

# the element types the graph has
CATALOG_TYPES = frozenset(ONNX_ELEMENT_TYPES)


def _graph_parts(graph):
    """Every node and every typed value of a graph and of the subgraphs its nodes hold."""
    from onnx import AttributeProto
    nodes, values = [], list(graph.input) + list(graph.output)
    for node in graph.node:
        nodes.append(node)
        for a in node.attribute:
            inner = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS \
                else []
            for g in inner:
                n, v = _graph_parts(g)
                nodes += n
                values += v
    return nodes, values


def in_scope(case) -> bool:
    """Whether every op of the case (its subgraphs' too) has a counterpart here (COUNTERPARTS, the
    default domain) and every tensor it takes and gives is of a type the graph has."""
    nodes, values = _graph_parts(case.model.graph)
    if any(n.domain not in ("", "ai.onnx") or n.op_type not in COUNTERPARTS for n in nodes):
        return False
    for v in values:
        t = v.type
        if not t.HasField("tensor_type") or t.tensor_type.elem_type not in CATALOG_TYPES:
            return False
    return True

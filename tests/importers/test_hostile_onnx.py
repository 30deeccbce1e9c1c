"""ONNX models that lie about sizes: shapes computed at import past any memory, a Loop of 10^12
trips, a node missing an input, a centre crop whose integer division of a symbolic size has no
polynomial answer. Each is one line with exit status 2 in bounded time and memory through the
command line."""
from __future__ import annotations

import numpy as np
import pytest

from tests.bounded import run_toolkit

onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

MEMORY_MB = 1500


def _save(path, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _x(shape):
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))


def _out(name="y", dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, None)


def _ints(name, value):
    return numpy_helper.from_array(np.array(value, dtype=np.int64), name)


def _infer(tmp_path, model, shape=(2, 3), *more):
    np.save(tmp_path / "x.npy", np.ones(shape, np.float32))
    return run_toolkit("infer", model, "--input", f"x={tmp_path / 'x.npy'}", *more, memory_mb=MEMORY_MB, timeout=60)


def _one_line(r, *said):
    assert r.status == 2 and len(r.lines) == 1 and r.lines[0].startswith("error: "), r.err
    assert "Traceback" not in r.err and all(s in r.lines[0] for s in said), r.err
    assert r.seconds < 30, r.seconds


def test_a_node_missing_an_input_is_one_line_naming_it(tmp_path):
    model = _save(tmp_path / "m.onnx", [helper.make_node("Add", ["x"], ["y"])], [_x((2, 3))], [_out()])
    _one_line(_infer(tmp_path, model), "node 'g/y' (Add)", "input 1 ('B'), which Add requires, is missing")


def test_a_required_input_left_empty_is_one_line(tmp_path):
    model = _save(tmp_path / "m.onnx", [helper.make_node("Reshape", ["x", ""], ["y"])], [_x((2, 3))], [_out()])
    _one_line(_infer(tmp_path, model), "(Reshape)", "input 1 ('shape'), which Reshape requires, is missing")


@pytest.mark.parametrize("target", [[-1, 10**12], [10**12, -1]])
def test_a_reshape_of_a_symbolic_size_to_rows_of_a_trillion_is_one_line(tmp_path, target):
    model = _save(tmp_path / "m.onnx", [helper.make_node("Reshape", ["x", "s"], ["y"])], [_x(("N", 3))], [_out()],
                  [_ints("s", target)])
    _one_line(_infer(tmp_path, model), "node 'g/y' (Reshape)", "3*N is not divisible by 1000000000000")


def test_a_reshape_copying_an_axis_the_input_lacks_is_one_line(tmp_path):
    model = _save(tmp_path / "m.onnx", [helper.make_node("Reshape", ["x", "s"], ["y"])], [_x(("N", 3))], [_out()],
                  [_ints("s", [0, 0, 0])])
    _one_line(_infer(tmp_path, model), "(Reshape)",
              "a 0 on axis 2 of the shape [0, 0, 0], past the rank-2 input's axes")


@pytest.mark.parametrize("case", ["expand", "tile"])
def test_shapes_past_int64_bytes_are_refused_by_the_plan(tmp_path, case):
    """2^62 x 2^62 values: numpy's int64 product of the sizes wrapped (an OverflowError, or a
    plan of a few bytes that failed to reshape); counted in Python's integers, refused."""
    if case == "expand":
        nodes, shape, inits = [helper.make_node("Expand", ["x", "s"], ["y"])], (1, 3), [_ints("s", [2**62, 2**62, 3])]
    else:
        nodes, shape, inits = [helper.make_node("Tile", ["x", "r"], ["y"])], ("N", 3), [_ints("r", [2**62, 2**62])]
    model = _save(tmp_path / "m.onnx", nodes, [_x(shape)], [_out()], inits)
    _one_line(_infer(tmp_path, model, (1, 3)), "its broadcast_to output [", "EiB; the plan needs at least")


def _sizes(case):
    """(nodes, input shape, initializers) of a model asking for a tensor far past memory."""
    node = helper.make_node
    if case == "reshape":
        return [node("Reshape", ["x", "s"], ["y"])], (2, 3), [_ints("s", [-1, 10**12])]
    if case == "constant_of_shape":
        return [node("Shape", ["x"], ["s"]), node("Mul", ["s", "k"], ["s2"]), node("ConstantOfShape", ["s2"], ["y"])], \
            (4, 3), [_ints("k", [10**6])]
    if case == "tile":
        return [node("Tile", ["x", "r"], ["y"])], (2, 3), [_ints("r", [10**11, 1])]
    if case == "expand":
        return [node("Expand", ["x", "s"], ["y"])], (1, 3), [_ints("s", [10**12, 3])]
    if case == "range":
        zero, limit, one = (numpy_helper.from_array(np.array(v, np.float32), n)
                            for n, v in (("a", 0), ("b", 1e12), ("c", 1)))
        return [node("Range", ["a", "b", "c"], ["r"]), node("Add", ["x", "r"], ["y"])], (1, 1), [zero, limit, one]
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["reshape", "constant_of_shape", "tile", "expand", "range"])
def test_shapes_computed_at_import_are_bounded_before_allocation(tmp_path, case):
    nodes, shape, inits = _sizes(case)
    model = _save(tmp_path / "m.onnx", nodes, [_x(shape)], [_out()], inits)
    r = _infer(tmp_path, model, shape)
    _one_line(r)
    assert "TiB" in r.lines[0] or "element counts differ" in r.lines[0], r.err


def _fill_of_shape(path, times: list[int]):
    """ConstantOfShape(Shape(x) * times): the output's size comes from x's shape alone."""
    node = helper.make_node
    return _save(path, [node("Shape", ["x"], ["s"]), node("Mul", ["s", "k"], ["s2"]),
                        node("ConstantOfShape", ["s2"], ["y"])], [_x(("N", 3))], [_out()], [_ints("k", times)])


def test_a_fill_of_a_symbolic_shape_times_a_million_is_one_line(tmp_path):
    """x's data is read by no node, only its shape: N takes its value from x all the same, and the
    plan of 2*10^6 x 3*10^6 values is refused (it was a DimError traceback: N had no value)."""
    r = _infer(tmp_path, _fill_of_shape(tmp_path / "m.onnx", [10**6]))
    _one_line(r, "broadcast_to output [64000000, 3000000]", "TiB")


def test_a_fill_of_an_input_shape_takes_the_inputs_size(tmp_path):
    r = _infer(tmp_path, _fill_of_shape(tmp_path / "m.onnx", [1, 2]), (4, 3), "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.zeros((4, 6), np.float32))


@pytest.mark.parametrize("limit", [np.inf, np.nan])
def test_a_range_without_a_finite_length_is_one_line(tmp_path, limit):
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("a", 0), ("b", limit), ("c", 1))]
    model = _save(tmp_path / "m.onnx", [helper.make_node("Range", ["a", "b", "c"], ["r"]),
                                        helper.make_node("Add", ["x", "r"], ["y"])], [_x((1, 1))], [_out()], bounds)
    _one_line(_infer(tmp_path, model, (1, 1)), "(Range)", "has no finite length")


def _loop_model(path, trips, shape):
    """x + 1, ``trips`` times over: a for-loop (its body passes its condition on unchanged)."""
    info = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["v", "one"], ["v2"]), helper.make_node("Identity", ["c"], ["cout"])], "body",
        [info("i", TensorProto.INT64, []), info("c", TensorProto.BOOL, []), info("v", TensorProto.FLOAT, None)],
        [info("cout", TensorProto.BOOL, []), info("v2", TensorProto.FLOAT, None)])
    return _save(path, [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], [_x(shape)], [_out()],
                 [_ints("n", trips), numpy_helper.from_array(np.array(1, np.float32), "one")])


@pytest.mark.parametrize("shape", [(2, 3), ("N", 3)])
def test_a_loop_of_a_trillion_trips_is_refused_at_import(tmp_path, shape):
    model = _loop_model(tmp_path / "m.onnx", 10**12, shape)
    _one_line(_infer(tmp_path, model), "node 'g/y' (Loop)", "a trip count of 1,000,000,000,000, over the 1,048,576")


def test_a_loop_within_the_bound_still_runs(tmp_path):
    model = _loop_model(tmp_path / "m.onnx", 5, (2, 3))
    r = _infer(tmp_path, model, (2, 3), "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.full((2, 3), 6, np.float32))


def _while_model(path, trips, limit):
    """x + 1 until its largest value reaches ``limit``, at most ``trips`` times: a while-loop."""
    info = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["v", "one"], ["v2"]), helper.make_node("ReduceMax", ["v2"], ["m"], keepdims=0),
         helper.make_node("Less", ["m", "limit"], ["cout"])], "body",
        [info("i", TensorProto.INT64, []), info("c", TensorProto.BOOL, []), info("v", TensorProto.FLOAT, [2, 3])],
        [info("cout", TensorProto.BOOL, []), info("v2", TensorProto.FLOAT, [2, 3])])
    return _save(path, [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], [_x((2, 3))], [_out()],
                 [_ints("n", trips), numpy_helper.from_array(np.array(1, np.float32), "one"),
                  numpy_helper.from_array(np.array(limit, np.float32), "limit")])


def test_a_while_loop_with_no_bound_runs_until_it_stops(tmp_path):
    model = _while_model(tmp_path / "m.onnx", 2**63 - 1, 10)        # exporters' "no bound"
    r = _infer(tmp_path, model, (2, 3), "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.full((2, 3), 10, np.float32))


def test_a_while_loop_that_never_stops_is_stopped_at_the_bound(tmp_path):
    """Checked each trip: its condition still true at the bound is one line naming the node. The
    bound is lowered in the child (1,048,576 trips of this body take some 40 s)."""
    import subprocess
    import sys

    from tests.bounded import ROOT
    model = _while_model(tmp_path / "m.onnx", 10**12, 1e30)
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    code = ("import sys, layers.onnx.control as c; c.MAX_LOOP_TRIPS = 1000; from toolkit.cli import main; "
            "sys.exit(main(sys.argv[1:]))")

    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_MB << 20, MEMORY_MB << 20))
    r = subprocess.run([sys.executable, "-c", code, "infer", str(model), "--input", f"x={tmp_path / 'x.npy'}"],
                       capture_output=True, text=True, cwd=ROOT, preexec_fn=limit, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == f"error: {model}: node 'g/y' (Loop): its condition still holds after 1,000 trips, the most " \
                       "a loop may run here", r.stderr


def _crop(path, shape):
    """x's centre 5 x 5: starts (size - 5) / 2, computed from Shape(x)."""
    node = helper.make_node
    return _save(path,
                 [node("Shape", ["x"], ["s"]), node("Gather", ["s", "hw"], ["size"]),
                  node("Sub", ["size", "k"], ["d"]), node("Div", ["d", "two"], ["start"]),
                  node("Add", ["start", "k"], ["end"]), node("Slice", ["x", "start", "end", "hw"], ["y"])],
                 [_x(shape)], [_out()], [_ints("hw", [2, 3]), _ints("k", [5]), _ints("two", [2])])


def test_a_centre_crop_of_a_symbolic_size_is_one_line(tmp_path):
    """(H - 5) / 2 over a symbolic H has no integer polynomial: said of the Div, not a DimError."""
    model = _crop(tmp_path / "m.onnx", ("N", 3, "height", "width"))
    _one_line(_infer(tmp_path, model, (1, 3, 9, 9)), "node 'g/start' (Div)", "height - 5 is not divisible by 2",
              "give the input fixed sizes")


def test_a_centre_crop_of_a_fixed_size_runs(tmp_path):
    r = _infer(tmp_path, _crop(tmp_path / "m.onnx", ("N", 3, 9, 9)), (1, 3, 9, 9), "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    assert np.load(tmp_path / "y.npy").shape == (1, 3, 5, 5)

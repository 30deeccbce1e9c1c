"""Caffe files that lie about their sizes or hold values of the wrong kind: `toolkit import caffe`
says what is wrong in one line at its place (exit 2), within bounded time and memory, and leaves
nothing in --out; or, where the value is Caffe's own (``inf``, a local_size past the channels),
imports it. Each runs the real CLI in a child process (tests/bounded.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.bounded import run_toolkit
from toolkit.importers.caffe.net import MAX_LAYERS, MAX_PROTOTXT_FIELDS

pytest.importorskip("google.protobuf", reason="the caffe extra (protobuf) reads caffemodels")

HEAD = 'name: "t"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n'
# the binary files' readers are bounded by tests/importers' other files (protobuf's reader once
# reserved 2 GiB): here the bound leaves that to them
BINARY_MB = 3000
CONV = ('layer {{ name: "c" type: "Convolution" bottom: "data" top: "c" {param}\n'
        '  convolution_param {{ num_output: {num_output} kernel_size: 3 }} }}\n')


def imported(tmp_path, text: str, *args, name: str = "net.prototxt", memory_mb: int = 600, timeout: float = 30):
    (tmp_path / name).write_text(text)
    return run_toolkit("import", "caffe", tmp_path / name, *args, "--out", tmp_path / "out",
                       memory_mb=memory_mb, timeout=timeout)


def refused(r, tmp_path, said: str) -> None:
    assert r.status == 2 and len(r.lines) == 1 and said in r.lines[0], r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("param, num_output, said", [
    ("", "abc", "net.prototxt:5:23: error: num_output must be a whole number, not the word 'abc'"),
    ("", '"8"', "net.prototxt:5:23: error: num_output must be a whole number, not a string"),
    ("", "-3", "net.prototxt:5:23: error: num_output must be from 0 to 4,294,967,295 (what the field holds), "
               "not -3"),
    ("", "9" * 5000, "net.prototxt:5:35: error: an integer of 5,000 digits: no field holds more than 64 bits"),
    ("param { lr_mult { } }", "8", "net.prototxt:4:71: error: lr_mult must be a value, not a message { ... }"),
    ("param { lr_mult: abc }", "8", "net.prototxt:4:71: error: lr_mult must be a number, not the word 'abc'"),
], ids=["word", "string", "negative", "5000 digits", "lr_mult message", "lr_mult word"])
def test_a_value_of_the_wrong_kind_is_refused_at_its_place(tmp_path, param, num_output, said):
    r = imported(tmp_path, HEAD + CONV.format(param=param, num_output=num_output))
    refused(r, tmp_path, said)


@pytest.mark.parametrize("value, want", [("inf", np.inf), ("-inf", -np.inf), ("-Infinity", -np.inf), ("1.5f", 1.5)])
def test_inf_is_read_as_infinity_not_as_a_number_with_a_float_suffix(tmp_path, value, want):
    r = imported(tmp_path, HEAD + 'layer { name: "p" type: "Power" bottom: "data" top: "p" '
                                  f'power_param {{ shift: {value} }} }}\n')
    assert r.status == 0, r.err
    import yaml
    layer = yaml.safe_load((tmp_path / "out" / "net.yaml").read_text())["layers"][0]
    assert layer["shift"] == want


def test_a_solver_value_of_the_wrong_kind_is_refused_at_its_place(tmp_path):
    (tmp_path / "solver.prototxt").write_text('base_lr: 0.01\nclip_gradients: abc\nmax_iter: 10\n')
    r = imported(tmp_path, HEAD + CONV.format(param="", num_output=4), "--solver", tmp_path / "solver.prototxt")
    refused(r, tmp_path, "solver.prototxt:2:1: error: clip_gradients must be a number, not the word 'abc'")


def chain(layers: int) -> str:
    lines = [HEAD.rstrip("\n")]
    for i in range(layers):
        lines.append(f'layer {{ name: "r{i}" type: "ReLU" bottom: "{f"r{i - 1}" if i else "data"}" top: "r{i}" }}')
    return "\n".join(lines) + "\n"


def test_a_prototxt_of_150000_layers_stops_at_the_field_bound(tmp_path):
    """10 MB of layers: the parse stops at the first field past the bound, in a few seconds (it
    went on for 30 s and more, to end in 'a gap in the importer' or a MemoryError)."""
    r = imported(tmp_path, chain(150_000), timeout=60)
    # the head is 7 fields, each layer 5 (itself, name, type, bottom, top): field 200,001 is the
    # top of the layer on line 40,002
    refused(r, tmp_path, f"net.prototxt:40002:37: error: more than {MAX_PROTOTXT_FIELDS:,} fields: "
                         "larger than any net this reads")
    assert r.seconds < 30, r.seconds


def test_more_layers_than_any_net_is_refused_at_the_first_one_past_the_bound(tmp_path):
    r = imported(tmp_path, chain(MAX_LAYERS + 1), timeout=60)
    refused(r, tmp_path, f"net.prototxt:{3 + MAX_LAYERS + 1}:1: error: more than {MAX_LAYERS:,} layers: "
                         "larger than any net this imports")


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_an_lrn_window_of_a_billion_imports_and_runs_at_once(tmp_path, region):
    """local_size 1e9 over 3 channels of 8 x 8: the sum over every channel, or over the whole
    image (it built a billion slices: 40 s, then MemoryError); the result is Caffe's formula."""
    text = HEAD + ('layer { name: "n" type: "LRN" bottom: "data" top: "n" '
                   f'lrn_param {{ local_size: 1000000001 alpha: 3e9 beta: 0.75 k: 2 norm_region: {region} }} }}\n')
    r = imported(tmp_path, text, memory_mb=1500)
    assert r.status == 0 and r.seconds < 20, r.err
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = run_toolkit("infer", tmp_path / "out" / "net.yaml", "--input", f"data={tmp_path / 'x.npy'}",
                    "--output", tmp_path / "y.npy", memory_mb=1500, timeout=60)
    assert r.status == 0 and r.seconds < 30, r.err
    if region == "ACROSS_CHANNELS":
        want = x / (2 + 3e9 / 1000000001 * (x ** 2).sum(1, keepdims=True)) ** 0.75
    else:
        want = x / (2 + 3e9 / 1000000001 ** 2 * (x ** 2).sum((2, 3), keepdims=True)) ** 0.75
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5)


def blob_model(path: Path, dims, values, legacy: bool = False) -> None:
    from toolkit.importers.caffe.proto import classes
    net = classes()["NetParameter"](name="t")
    layer = net.layer.add(name="c", type="Convolution")
    blob = layer.blobs.add()
    if legacy:
        blob.num, blob.channels, blob.height, blob.width = dims
    else:
        blob.shape.SetInParent()                # a shape message, even with no dim
        blob.shape.dim.extend(dims)
    blob.data.extend(values)
    path.write_bytes(net.SerializeToString())


@pytest.mark.parametrize("dims, values, said", [
    ([-4, -27], [0.0] * 108, "a weight blob of layer 'c' says shape [-4, -27]: a dimension is negative"),
    ([], [], "a weight blob of layer 'c' says shape [] (1 value) but holds 0"),
    ([1 << 40, 1 << 40], [0.0], "says shape [1099511627776, 1099511627776] (1,208,925,819,614,629,174,706,176 values) "
                                "but holds 1"),
], ids=["negative", "empty shape no data", "past 2**64"])
def test_a_caffemodel_blob_whose_shape_lies_is_refused(tmp_path, dims, values, said):
    blob_model(tmp_path / "w.caffemodel", dims, values)
    r = imported(tmp_path, HEAD + CONV.format(param="", num_output=4), "--weights", tmp_path / "w.caffemodel",
                 memory_mb=BINARY_MB)
    refused(r, tmp_path, said)


def test_a_binaryproto_mean_with_negative_dims_is_refused(tmp_path):
    from toolkit.importers.caffe.proto import classes
    blob = classes()["BlobProto"](num=-1, channels=-3, height=4, width=4)
    blob.data.extend([0.5] * 48)
    (tmp_path / "mean.binaryproto").write_bytes(blob.SerializeToString())
    text = ('name: "t"\nlayer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }\n'
            '  transform_param { mean_file: "mean.binaryproto" } data_param { source: "db" batch_size: 4 } }\n'
            'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 3 } }\n'
            'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n')
    r = imported(tmp_path, text, "--input-shape", "data=3,4,4", memory_mb=BINARY_MB)
    refused(r, tmp_path, "net.prototxt:3:21: error: transform_param.mean_file mean.binaryproto: its blob says shape "
                         "[-1, -3, 4, 4]: a dimension is negative")


def test_weights_of_the_wrong_shape_leave_nothing_in_out(tmp_path):
    blob_model(tmp_path / "w.caffemodel", [5, 3, 3, 3], [0.0] * 135)
    r = imported(tmp_path, HEAD + CONV.format(param="", num_output=4), "--weights", tmp_path / "w.caffemodel",
                 memory_mb=BINARY_MB)
    refused(r, tmp_path, "has shape [5, 3, 3, 3] there, the prototxt makes it [4, 3, 3, 3]")


def test_layers_that_make_a_net_file_larger_than_any_are_refused_at_the_layer(tmp_path, monkeypatch):
    """8,500 Convolution layers with their params and fillers fit the prototxt's bound but wrote a
    net file past the reader's 200,000 values: 'a gap in the importer'. The bound lowered here to
    what twenty ReLU layers make (each 5 values: the layer, name, type, bottom, top)."""
    from toolkit.errors import SpecError
    from toolkit.importers.caffe import net as caffe_net
    monkeypatch.setattr(caffe_net, "MAX_NET_VALUES", 100)
    (tmp_path / "net.prototxt").write_text(chain(30))
    with pytest.raises(SpecError) as e:
        caffe_net.import_net(str(tmp_path / "net.prototxt"))
    problem, = e.value.problems
    assert (problem.location.line, problem.location.col) == (3 + 21, 1)
    assert problem.message == ("the layers up to this one make a net file of more than 100 values: larger than any "
                               "net this imports")

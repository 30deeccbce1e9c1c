"""ONNX models whose tensors keep their bytes in files beside them (``torch.onnx.export``'s default
``m.onnx`` + ``m.onnx.data``): initializers, Constant values and tensors inside an If's body read
from the model's folder, equal to ONNX Runtime; a model and its data moved together still load;
PyTorch's exports of a ResNet, a BERT-style encoder and an LSTM tagger run through ``toolkit
infer`` equal to ONNX Runtime; and every data file that lies (about where it is, what it is or how
big it is) is one line and exit status 2, naming the file, before anything is read."""
from __future__ import annotations

import os
import shutil
import stat
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra reads the models")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra's runtime is the reference")
from onnx import TensorProto, helper  # noqa: E402

from tests.cli.cli_helpers import run_cli, run_subprocess  # noqa: E402
from tests.importers.external_data_model import BRANCH, C, W, external, write_model  # noqa: E402
from toolkit.importers.onnx.netfile import blob_name  # noqa: E402


def infer(model: str, x: np.ndarray, work) -> np.ndarray:
    np.save(work / "x.npy", x)
    r = run_cli("infer", model, "--input", f"x={work / 'x.npy'}", "--output", work / "y.npy")
    assert r.status == 0, r.err
    return np.load(work / "y.npy")


def expected(x: np.ndarray) -> np.ndarray:
    return x @ W + C + (BRANCH if x.sum() > 0 else -BRANCH)


def test_initializers_constants_and_a_body_read_their_data_from_beside_the_model(tmp_path):
    path = write_model(tmp_path / "model")
    x = np.random.default_rng(0).random((2, 3)).astype(np.float32)
    got = infer(path, x, tmp_path)
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(reference, expected(x), rtol=1e-6)
    np.testing.assert_allclose(got, reference, rtol=1e-6, atol=1e-6)
    got = infer(path, -x, tmp_path)                       # the other branch
    np.testing.assert_allclose(got, expected(-x), rtol=1e-6, atol=1e-6)


def test_data_is_read_from_the_models_folder_not_the_current_one(tmp_path, monkeypatch):
    """Constants whose data file has a namesake in the current folder read the one beside the model."""
    path = write_model(tmp_path / "model", w_inline=True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.onnx.data").write_bytes(np.full(32, 99.0, np.float32).tobytes())
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(infer(path, x, tmp_path), expected(x), rtol=1e-6)


def test_a_model_and_its_data_moved_together_still_load(tmp_path):
    path = write_model(tmp_path / "first", data_name="weights/all.bin")
    x = np.random.default_rng(1).random((2, 3)).astype(np.float32)
    before = infer(path, x, tmp_path)
    shutil.move(tmp_path / "first", tmp_path / "elsewhere" / "second")
    moved = str(tmp_path / "elsewhere" / "second" / "m.onnx")
    np.testing.assert_array_equal(infer(moved, x, tmp_path), before)
    np.testing.assert_allclose(before, expected(x), rtol=1e-6)


def test_a_data_file_changed_since_the_model_was_read_is_read_again(tmp_path):
    """A model is kept while it is unchanged (a net reads it once per phase): its data file counts."""
    from toolkit.importers.onnx.files import loaded_model
    path = write_model(tmp_path / "model")
    np.testing.assert_array_equal(loaded_model(path).arrays["w"], W)
    data = tmp_path / "model" / "m.onnx.data"
    st = os.stat(data)
    data.write_bytes((2 * W).tobytes() + data.read_bytes()[W.nbytes:])
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    np.testing.assert_array_equal(loaded_model(path).arrays["w"], 2 * W)


def test_import_of_a_one_layer_model_copies_its_data_beside_the_copy(tmp_path):
    """An LSTM model stays one ONNX layer reading DIR/MODEL.onnx: its data file travels with it."""
    torch = pytest.importorskip("torch")
    from tests.importers.torch_models import exported_tagger
    model = exported_tagger(tmp_path / "t.onnx")
    _to_external(tmp_path / "t.onnx")
    r = run_cli("import", "onnx", tmp_path / "t.onnx", "--out", tmp_path / "imp")
    assert r.status == 0, r.err
    assert (tmp_path / "imp" / "t.onnx.data").is_file()
    ids = np.random.default_rng(0).integers(0, 40, (3, 9))
    np.save(tmp_path / "ids.npy", ids)
    os.remove(tmp_path / "t.onnx.data")                   # the copy reads its own data, not the source's
    r = run_cli("infer", tmp_path / "imp" / "net.yaml", "--weights", tmp_path / "imp" / "model.safetensors",
                "--input", f"ids={tmp_path / 'ids.npy'}", "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    with torch.no_grad():
        want = model(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-5)


def _to_external(path) -> None:
    """The model at ``path`` rewritten as PyTorch's default export lays it out: its tensors in
    PATH.data beside it."""
    model = onnx.load(str(path))
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=os.path.basename(path) + ".data", size_threshold=64)


# --- PyTorch's own exports ------------------------------------------------------------------------

def _pytorch_models():
    torch = pytest.importorskip("torch")
    from tests.importers.torch_models import Encoder, Tagger, randomize_batchnorm, resnet18
    torch.manual_seed(0)
    resnet = resnet18()
    randomize_batchnorm(resnet, 1)
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.zeros(2, 12)
    mask[1, 8:] = 1.0
    return {"resnet": (resnet.eval(), (torch.randn(2, 3, 32, 32),)),
            "bert": (Encoder().eval(), (ids, mask)),
            "lstm_tagger": (Tagger().eval(), (torch.randint(0, 40, (2, 7)),))}


def _run_both(path, feeds: dict, tmp_path) -> None:
    """``toolkit infer`` (the command line) against ONNX Runtime on the same inputs, to 1e-5."""
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    r = run_cli("infer", path, *args, "--output", tmp_path / "y.npz")
    assert r.status == 0, r.err
    got = np.load(tmp_path / "y.npz")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    names = [o.name for o in session.get_outputs()]
    assert sorted(got.files) == sorted(blob_name(n) for n in names)
    for name, w in zip(names, want):
        key = blob_name(name)
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(got[key], w, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("name", ["resnet", "bert", "lstm_tagger"])
def test_pytorch_default_export_runs_as_onnx_runtime_runs_it(tmp_path, name):
    """``torch.onnx.export(model, args, path)`` and nothing else: its dynamo exporter writes the
    weights to PATH.data."""
    pytest.importorskip("onnxscript", reason="torch.onnx.export's default (dynamo) exporter needs onnxscript")
    torch = pytest.importorskip("torch")
    model, args = _pytorch_models()[name]
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path))
    assert (tmp_path / "m.onnx.data").is_file()           # the default this test is about
    inputs = [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]
    _run_both(path, {k: a.numpy() for k, a in zip(inputs, args)}, tmp_path)


@pytest.mark.parametrize("name", ["resnet", "bert", "lstm_tagger"])
def test_pytorch_export_with_its_weights_beside_it_runs_as_onnx_runtime_runs_it(tmp_path, name):
    """The TorchScript exporter's model laid out as the default one is (PATH + PATH.data): what the
    default test checks, where onnxscript is not installed."""
    torch = pytest.importorskip("torch")
    model, args = _pytorch_models()[name]
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17,
                          input_names=["a", "b"][:len(args)], output_names=["y"])
    _to_external(path)
    held = onnx.load(str(path), load_external_data=False).graph.initializer
    assert sum(t.data_location == TensorProto.EXTERNAL for t in held) >= 3
    inputs = [i.name for i in onnx.load(str(path), load_external_data=False).graph.input if i.name not in
              {t.name for t in held}]
    _run_both(path, {k: a.numpy() for k, a in zip(inputs, args)}, tmp_path)


# --- data files that lie -----------------------------------------------------------------------

def _refused(path, *needles) -> str:
    np.save(os.path.join(os.path.dirname(path), "x.npy"), np.ones((2, 3), np.float32))
    r = run_cli("infer", path, "--input", f"x={os.path.join(os.path.dirname(path), 'x.npy')}")
    assert r.status == 2, (r.status, r.err)
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("error: "), r.err
    assert "Traceback" not in r.err
    for needle in needles:
        assert needle in r.err, r.err
    return r.err_lines[0]


@pytest.mark.parametrize("location, said", [
    ("../m.onnx.data", "outside the model's folder"),
    ("sub/../../m.onnx.data", "outside the model's folder"),
    ("/etc/passwd", "an absolute path"),
])
def test_a_data_file_outside_the_models_folder_is_refused(tmp_path, location, said):
    (tmp_path / "m.onnx.data").write_bytes(W.tobytes())    # what '..' would reach
    path = write_model(tmp_path / "model", location=location)
    _refused(path, f"initializer 'w' keeps its data in '{location}'", said)


def test_a_constant_pointing_outside_is_refused_too(tmp_path):
    """A Constant's value (here inside an If's body) is checked like an initializer."""
    path = write_model(tmp_path / "model", w_inline=True)
    model = onnx.load(path, load_external_data=False)
    then_body = next(a.g for a in model.graph.node[5].attribute if a.name == "then_branch")
    for entry in then_body.node[0].attribute[0].t.external_data:
        if entry.key == "location":
            entry.value = "/etc/hostname"
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    _refused(path, "Constant node 'branch' attribute 'value' in the body 'then' of If node 'choose'",
             "'/etc/hostname', an absolute path")


def test_a_link_is_refused_even_to_a_file_inside_the_folder(tmp_path):
    path = write_model(tmp_path / "model")
    os.rename(tmp_path / "model" / "m.onnx.data", tmp_path / "model" / "real.data")
    os.symlink("real.data", tmp_path / "model" / "m.onnx.data")
    _refused(path, "'m.onnx.data', which is a symbolic link")


def test_a_linked_folder_on_the_way_is_refused(tmp_path):
    path = write_model(tmp_path / "model", data_name="sub/all.bin")
    os.rename(tmp_path / "model" / "sub", tmp_path / "outside")
    os.symlink(tmp_path / "outside", tmp_path / "model" / "sub")
    _refused(path, "'sub/all.bin' (on the way, 'sub'), which is a symbolic link")


def test_a_fifo_is_refused_without_waiting_on_it(tmp_path):
    path = write_model(tmp_path / "model")
    os.remove(tmp_path / "model" / "m.onnx.data")
    os.mkfifo(tmp_path / "model" / "m.onnx.data")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    r = run_subprocess("infer", path, "--input", f"x={tmp_path / 'x.npy'}", timeout=60)   # the real exit status
    assert r.status == 2 and len(r.err_lines) == 1, r.err
    assert "'m.onnx.data', which is a FIFO" in r.err


def test_a_device_is_refused(tmp_path):
    path = write_model(tmp_path / "model")
    os.remove(tmp_path / "model" / "m.onnx.data")
    try:
        os.mknod(tmp_path / "model" / "m.onnx.data", 0o600 | stat.S_IFCHR, os.makedev(1, 3))   # /dev/null's
    except PermissionError:
        pytest.skip("making a device node needs root")
    _refused(path, "'m.onnx.data', which is a character device")


def test_a_missing_data_file_is_named(tmp_path):
    path = write_model(tmp_path / "model")
    os.remove(tmp_path / "model" / "m.onnx.data")
    _refused(path, "initializer 'w' keeps its data in 'm.onnx.data', and there is no 'm.onnx.data' in the model's "
                   "folder")


def test_a_name_that_would_break_the_line_is_shown_on_one(tmp_path):
    path = write_model(tmp_path / "model", location="w.bin\nerror: forged")
    _refused(path, "keeps its data in 'w.bin\\nerror: forged', and there is no 'w.bin\\nerror: forged'")


@pytest.mark.parametrize("entries, said", [
    ({"length": "4800"}, "its data is 4,800 bytes at offset 0 of 'm.onnx.data', which holds only 80 bytes"),
    ({"offset": "60"}, "its data is 48 bytes at offset 60 of 'm.onnx.data', which holds only 80 bytes"),
    ({"offset": "1000"}, "its data starts at byte 1,000 of 'm.onnx.data', which holds only 80 bytes"),
    ({"length": "40"}, "its dims [3, 4] need 48 bytes, but its external data in 'm.onnx.data' is 40 bytes long"),
    ({"length": None}, "need 48 bytes, but its external data in 'm.onnx.data' is the 80 bytes from offset 0 to the "
                       "file's end"),
    ({"offset": "-8"}, "its external data's offset '-8' is not a non-negative whole number"),
    ({"length": "0x30"}, "its external data's length '0x30' is not a non-negative whole number"),
])
def test_a_size_that_lies_is_refused_before_anything_is_read(tmp_path, entries, said):
    path = write_model(tmp_path / "model", **entries)
    _refused(path, "initializer 'w'", said)


def test_dims_that_do_not_match_the_length_are_refused_however_large(tmp_path):
    path = write_model(tmp_path / "model")
    model = onnx.load(path, load_external_data=False)
    model.graph.initializer[0].dims[:] = [1 << 40, 1 << 40]
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    _refused(path, "its dims [1099511627776, 1099511627776] need more bytes than the file holds, but its external "
                   "data in 'm.onnx.data' is 48 bytes long")


def test_many_tensors_sharing_the_same_bytes_cannot_ask_for_more_than_the_files_hold(tmp_path):
    """Each tensor's range fits, but together they would make the reader allocate 1000 times the file."""
    (tmp_path / "m.onnx.data").write_bytes(np.zeros(1 << 12, np.float32).tobytes())
    inits = [external(f"w{i}", np.zeros(1 << 12, np.float32), "m.onnx.data", 0) for i in range(1000)]
    graph = helper.make_graph([helper.make_node("Sum", ["x"] + [f"w{i}" for i in range(1000)], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 12])], inits)
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    np.save(tmp_path / "x.npy", np.ones(1 << 12, np.float32))
    r = run_cli("infer", path, "--input", f"x={tmp_path / 'x.npy'}")
    assert r.status == 2 and len(r.err_lines) == 1, r.err
    assert "its 1000 tensors with external data ask for 16,384,000 bytes, more than the 16,384 their 1 data file(s) " \
           "hold" in r.err

"""Outputs aimed at inputs: every command that writes refuses a target that is one of the files it
reads (the same path, a path through a symbolic link or '..', a hard link to it), in one line
with exit status 2 before anything is written, and the input is left as it was."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tests.bounded import ROOT, run_toolkit

LENET = ROOT / "zoo" / "lenet"
CAFFE = ROOT / "tests" / "data" / "caffe" / "examples_cifar10_cifar10_quick.prototxt"
REFUSED = "an input of this command; an output never replaces an input"


def lenet(folder):
    shutil.copy(LENET / "net.yaml", folder / "net.yaml")
    shutil.copy(LENET / "model.safetensors", folder / "model.safetensors")
    return folder / "net.yaml", folder / "model.safetensors"


def refused(r, start: str) -> None:
    assert r.status == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith(f"error: {start}") and REFUSED in r.lines[0], r.err


@pytest.mark.parametrize("how", ["same", "dotted", "symlink", "hardlink", "weights"])
def test_export_onto_its_own_net_or_weights_is_refused(tmp_path, how):
    net, weights = lenet(tmp_path)
    before = {p: p.read_bytes() for p in (net, weights)}
    target = {"same": net, "dotted": tmp_path / ".." / tmp_path.name / "net.yaml", "symlink": tmp_path / "l.onnx",
              "hardlink": tmp_path / "h.onnx", "weights": weights}[how]
    if how == "symlink":
        os.symlink(net, target)
    if how == "hardlink":
        os.link(weights, target)
    r = run_toolkit("export", "onnx", net, "--weights", weights, "-o", target, memory_mb=2000, timeout=60)
    refused(r, f"-o {target}: ")
    assert {p: p.read_bytes() for p in (net, weights)} == before


def test_infer_output_onto_its_input_is_refused(tmp_path):
    net, weights = lenet(tmp_path)
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 1, 8, 8), np.float32))
    before = x.read_bytes()
    for given in (str(x), f"data={x}"):
        r = run_toolkit("infer", net, "--weights", weights, "--input", given, "--output", tmp_path / "." / "x.npy",
                        memory_mb=2000, timeout=60)
        refused(r, f"--output {tmp_path / '.' / 'x.npy'}: is an --input file")
    assert x.read_bytes() == before


def test_data_out_onto_the_training_source_is_refused(tmp_path):
    (tmp_path / "net").mkdir()
    x = np.random.default_rng(0).normal(size=(20, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "net" / "d.npz", data=x, label=np.arange(20) % 10)
    net = tmp_path / "net" / "net.yaml"
    net.write_text((LENET / "net.yaml").read_text().replace("builtin:digits", "d.npz"))
    before = (tmp_path / "net" / "d.npz").read_bytes()
    r = run_toolkit("data", net, "--out", tmp_path / "net" / "d.npz", memory_mb=2000, timeout=60)
    refused(r, f"--out {tmp_path / 'net' / 'd.npz'}: is train.data.source {tmp_path / 'net' / 'd.npz'}")
    assert (tmp_path / "net" / "d.npz").read_bytes() == before


def test_graph_onto_its_net_is_refused(tmp_path):
    net = tmp_path / "net.dot"
    shutil.copy(LENET / "net.yaml", net)
    r = run_toolkit("graph", net, "-o", net, memory_mb=2000, timeout=60)
    refused(r, f"-o {net}: is the net file")
    assert net.read_text() == (LENET / "net.yaml").read_text()


@pytest.mark.parametrize("which", ["prototxt", "solver", "labels"])
def test_import_caffe_never_writes_over_what_it_reads(tmp_path, which):
    """Even with --force, which replaces an earlier import's files, never a file the import reads."""
    out = tmp_path / "out"
    out.mkdir()
    prototxt = out / "net.yaml" if which == "prototxt" else tmp_path / "q.prototxt"
    shutil.copy(CAFFE, prototxt)
    args = ["import", "caffe", prototxt, "--out", out, "--force"]
    victim = prototxt
    if which == "solver":
        victim = out / "model.safetensors"
        victim.write_text('base_lr: 0.01\nmax_iter: 10\n')
        args += ["--solver", victim]
    if which == "labels":
        victim = out / "input.json"
        victim.write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
        args += ["--labels", victim]
    before = victim.read_bytes()
    r = run_toolkit(*args, memory_mb=2000, timeout=60)
    refused(r, f"--out {out}: would write {victim}, which is the {which}")
    assert victim.read_bytes() == before and sorted(p.name for p in out.iterdir()) == [victim.name]


def test_import_onnx_into_its_own_folder_is_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    before = model.read_bytes()
    r = run_toolkit("import", "onnx", model, "--out", tmp_path, "--force", memory_mb=2000, timeout=60)
    refused(r, f"--out {tmp_path}: would write {model}, which is the ONNX model")
    assert model.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_new_run_never_writes_over_the_weights_it_starts_from(tmp_path):
    """--out holds an earlier run's best.safetensors only (no run files): training from it there
    would replace it with this run's best."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(LENET / "model.safetensors", out / "best.safetensors")
    before = (out / "best.safetensors").read_bytes()
    r = run_toolkit("train", LENET / "net.yaml", "--weights", out / "best.safetensors", "--out", out,
                    "--set", "train.max_iter=2", memory_mb=3000, timeout=120)
    refused(r, f"--out {out}: would write {out / 'best.safetensors'}, which is the weights file")
    assert (out / "best.safetensors").read_bytes() == before and sorted(p.name for p in out.iterdir()) == \
        ["best.safetensors"]


def test_import_caffe_never_writes_over_the_mean_image_its_prototxt_names(tmp_path):
    """The prototxt's transform_param.mean_file is a binaryproto called mean.npy in --out: the
    import's mean.npy (its conversion) would replace it."""
    from toolkit.importers.caffe.proto import classes
    out = tmp_path / "out"
    out.mkdir()
    blob = classes()["BlobProto"](num=1, channels=3, height=32, width=32)
    blob.data.extend([1.0] * 3 * 32 * 32)
    (out / "mean.npy").write_bytes(blob.SerializeToString())
    before = (out / "mean.npy").read_bytes()
    prototxt = tmp_path / "q.prototxt"
    prototxt.write_text(CAFFE.with_name("examples_cifar10_cifar10_quick_train_test.prototxt").read_text()
                        .replace("examples/cifar10/mean.binaryproto", str(out / "mean.npy")))
    r = run_toolkit("import", "caffe", prototxt, "--input-shape", "data=3,32,32", "--out", out, "--force",
                    memory_mb=4000, timeout=60)
    refused(r, f"--out {out}: would write {out / 'mean.npy'}, which is a file the prototxt names")
    assert (out / "mean.npy").read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["mean.npy"]

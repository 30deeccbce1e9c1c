"""A run and a published model carry what their net names: the mean image (found beside the net,
never in the current folder), the lengths of sequences of different lengths; `zoo verify` fails a
folder whose net names a file its card does not list; `zoo publish` writes over none of the files it
reads, and one that fails leaves the zoo folder as it found it. Each through the CLI, bounded."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.bounded import ROOT, run_toolkit
from toolkit.zoo.card import read_card, write_card

LENET = ROOT / "zoo" / "lenet"
PUBLISH = ("--licence", "MIT", "--task", "digits")


def mean_net(tmp_path, named: str = "mean.npy", value: float = 3.0):
    """A LeNet folder whose train.data subtracts a mean image ``named`` (relative to the net), and
    a folder to run in that holds a different mean.npy (which must never be used)."""
    folder, elsewhere = tmp_path / "net", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    text = (LENET / "net.yaml").read_text().replace("scale: 0.0625}", f"scale: 0.0625, mean_file: {named}}}")
    (folder / "net.yaml").write_text(text)
    shutil.copy(LENET / "model.safetensors", folder / "model.safetensors")
    (folder / named).parent.mkdir(parents=True, exist_ok=True)
    np.save(folder / named, np.full((1, 8, 8), value, np.float32))
    np.save(elsewhere / "mean.npy", np.full((1, 8, 8), 1000.0, np.float32))
    return folder, elsewhere


def test_a_mean_file_is_read_beside_the_net_not_in_the_current_folder(tmp_path):
    folder, elsewhere = mean_net(tmp_path)
    here = run_toolkit("test", folder / "net.yaml", "--weights", folder / "model.safetensors", cwd=folder,
                       memory_mb=2000, timeout=60)
    there = run_toolkit("test", folder / "net.yaml", "--weights", folder / "model.safetensors", cwd=elsewhere,
                        memory_mb=2000, timeout=60)
    assert here.status == 0 and there.status == 0, here.err + there.err
    assert json.loads(there.out) == json.loads(here.out)


@pytest.mark.parametrize("named", ["mean.npy", "../means/m.npy"])
def test_a_run_carries_its_mean_image(tmp_path, named):
    folder, elsewhere = mean_net(tmp_path, named)
    r = run_toolkit("train", folder / "net.yaml", "--out", tmp_path / "run", "--set", "train.max_iter=2",
                    cwd=elsewhere, memory_mb=3000, timeout=120)
    assert r.status == 0, r.err
    carried = tmp_path / "run" / "mean.npy" if named == "mean.npy" else tmp_path / "run" / "m.npy"
    assert carried.read_bytes() == (folder / named).read_bytes()
    assert f"mean_file: {carried.name}" in (tmp_path / "run" / "net.yaml").read_text()
    r = run_toolkit("train", folder / "net.yaml", "--resume", tmp_path / "run", "--set", "train.max_iter=3",
                    cwd=elsewhere, memory_mb=3000, timeout=120)     # the net as given: no change to name
    assert r.status == 0, r.err


@pytest.mark.parametrize("named", ["mean.npy", "../means/m.npy"])
def test_a_published_model_carries_its_mean_image(tmp_path, named):
    folder, elsewhere = mean_net(tmp_path, named)
    original = (folder / named).read_bytes()
    r = run_toolkit("zoo", "publish", folder, "--to", tmp_path / "zoo", *PUBLISH, cwd=elsewhere,
                    memory_mb=3000, timeout=120)
    assert r.status == 0, r.err
    model = tmp_path / "zoo" / "lenet"
    name = "mean.npy" if named == "mean.npy" else "m.npy"
    assert (model / name).read_bytes() == original
    assert f"mean_file: {name}" in (model / "net.yaml").read_text()
    card, _ = read_card(model / "README.md")
    assert [f.file for f in card.data_files] == [name]
    (folder / named).unlink()                          # the model needs nothing of where it came from
    r = run_toolkit("zoo", "verify", model, cwd=elsewhere, memory_mb=3000, timeout=120)
    assert r.status == 0 and f"ok    {name}: sha256" in r.out, r.err


def test_verify_fails_a_model_whose_net_names_a_file_its_card_does_not_list(tmp_path):
    folder, elsewhere = mean_net(tmp_path)
    assert run_toolkit("zoo", "publish", folder, "--to", tmp_path / "zoo", *PUBLISH, memory_mb=3000,
                       timeout=120).status == 0
    model = tmp_path / "zoo" / "lenet"
    card, body = read_card(model / "README.md")
    write_card(model / "README.md", card.model_copy(update={"data_files": []}), body)
    r = run_toolkit("zoo", "verify", model, "--no-test", memory_mb=2000, timeout=60)
    assert r.status == 2 and r.lines == [f"error: {model / 'net.yaml'}: names mean.npy (train.data.mean_file), "
                                         "which the card does not list (the model folder does not carry it)"], r.err


def test_bundled_data_carries_the_lengths_of_sequences(tmp_path):
    from toolkit.frontend import Net
    from toolkit.weights import save_weights
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 8, 24)
    data = np.zeros((24, 7, 3), np.float32)
    for i, n in enumerate(lengths):
        data[i, :n] = rng.normal(size=(n, 3))
    np.savez(tmp_path / "seqs.npz", data=data, label=rng.integers(0, 3, 24), lengths=lengths)
    run = tmp_path / "run"
    run.mkdir()
    (run / "net.yaml").write_text("""name: cls
inputs:
  data: {shape: [N, T, 3]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: rec, type: GRU, bottom: data, top: h, num_output: 5, return_sequence: false}
  - {name: fc, type: InnerProduct, bottom: h, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
train:
  data: {source: ../seqs.npz, lengths: lengths, batch_size: 6, test_fraction: 0.25}
  solver: {type: sgd, base_lr: 0.2}
  max_iter: 4
""")
    save_weights(str(run / "model.safetensors"), Net.load(str(run / "net.yaml")).init_weights(seed=0))
    r = run_toolkit("zoo", "publish", run, "--to", tmp_path / "zoo", *PUBLISH, "--bundle-data", memory_mb=3000,
                    timeout=120)
    assert r.status == 0, r.err
    with np.load(tmp_path / "zoo" / "cls" / "data.npz") as bundled:
        np.testing.assert_array_equal(bundled["lengths"], lengths)
    r = run_toolkit("zoo", "verify", tmp_path / "zoo" / "cls", memory_mb=3000, timeout=120)
    assert r.status == 0, r.err


def test_publish_never_writes_over_the_data_it_bundles(tmp_path):
    """The zoo folder's model already holds the npz the net trains on: bundling would replace it."""
    model = tmp_path / "zoo" / "lenet"
    model.mkdir(parents=True)
    x = np.random.default_rng(0).normal(size=(40, 1, 8, 8)).astype(np.float32)
    np.savez(model / "data.npz", data=x, label=(np.arange(40) % 10).astype(np.int32))
    before = (model / "data.npz").read_bytes()
    folder = tmp_path / "net"
    folder.mkdir()
    (folder / "net.yaml").write_text((LENET / "net.yaml").read_text().replace(
        '"builtin:digits"', "../zoo/lenet/data.npz"))
    shutil.copy(LENET / "model.safetensors", folder / "model.safetensors")
    r = run_toolkit("zoo", "publish", folder, "--to", tmp_path / "zoo", *PUBLISH, "--bundle-data", "--force",
                    memory_mb=3000, timeout=120)
    assert r.status == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith(f"error: --to {tmp_path / 'zoo'}: would write {model / 'data.npz'}, which is "
                                 "train.data.source"), r.err
    assert (model / "data.npz").read_bytes() == before and sorted(p.name for p in model.iterdir()) == ["data.npz"]


def test_a_publish_that_fails_to_write_leaves_the_zoo_folder_as_it_was(tmp_path):
    """A disk that fills while the model is written (files of at most 30 kB; the weights are 55 kB)."""
    (tmp_path / "zoo").mkdir()
    r = run_toolkit("zoo", "publish", LENET, "--to", tmp_path / "zoo", "--name", "mine", *PUBLISH,
                    file_kb=30, memory_mb=3000, timeout=120)
    assert r.status == 2 and len(r.lines) == 1 and "model.safetensors" in r.lines[0], r.err
    assert sorted(p.name for p in (tmp_path / "zoo").iterdir()) == []


def test_publish_refuses_a_net_whose_onnx_model_would_not_travel(tmp_path):
    """An import that stays one ONNX layer names MODEL.onnx beside its net.yaml: a model published
    without it would load nowhere else, so publish says so instead of writing it."""
    pytest.importorskip("onnx")
    from tests.importers.external_data_model import write_model
    write_model(tmp_path / "src")
    assert run_toolkit("import", "onnx", tmp_path / "src" / "m.onnx", "--out", tmp_path / "imp", memory_mb=3000,
                       timeout=120).status == 0
    (tmp_path / "imp" / "README.md").write_text("---\nmetric: {name: accuracy, value: 1.0}\n---\n")
    r = run_toolkit("zoo", "publish", tmp_path / "imp", "--to", tmp_path / "zoo", *PUBLISH, memory_mb=3000,
                    timeout=120)
    assert r.status == 2 and r.lines == [f"error: publish {tmp_path / 'imp'}: the net names m.onnx (layer 'g' file), "
                                         "which the published model would not carry, so it could not be used or "
                                         "verified elsewhere"], r.err
    assert not (tmp_path / "zoo").exists()

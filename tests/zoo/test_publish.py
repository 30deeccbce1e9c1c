"""``toolkit zoo publish`` (a trained net made into a zoo model, its metric measured) and
``toolkit zoo verify`` (card, hashes, net, weights and metric checked, every problem at once)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from zoo_helpers import LENET, NAME, run

from toolkit import settings
from toolkit.weights import load_weights
from toolkit.zoo.card import read_card, sha256_file

TASK = "image classification (10 digits)"
DRAFT = f"""\
---
description: LeNet for the 8x8 digits, trained by me
task: {TASK}
licence: CC0-1.0
---

# mine

Trained with `toolkit train`.
"""


@pytest.fixture
def trained(tmp_path):
    """A folder as a user has it after training: the net, its weights, a draft card."""
    src = tmp_path / "run"
    src.mkdir()
    shutil.copy(LENET / "net.yaml", src / "net.yaml")
    shutil.copy(LENET / "model.safetensors", src / "model.safetensors")
    (src / "README.md").write_text(DRAFT)
    return src


def error_lines(result) -> list[str]:
    assert result.status == 2 and "Traceback" not in result.err, result.err
    return [line for line in result.err.splitlines() if line.strip()]


def test_publish_then_verify(trained, tmp_path):
    zoo = tmp_path / "zoo"
    r = run("zoo", "publish", trained, "--to", zoo, "--name", "mine")
    assert r.status == 0, r.err
    assert r.out.startswith(f"published zoo:mine in {zoo / 'mine'}\n")
    assert "accuracy 0.986072 on 359 test examples (measured)" in r.out
    folder = zoo / "mine"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "model.safetensors", "net.yaml"]
    card, body = read_card(folder / "README.md", expect_name="mine")
    assert (card.description, card.task, card.licence) == ("LeNet for the 8x8 digits, trained by me", TASK, "CC0-1.0")
    assert card.metric.model_dump() == {"name": "accuracy", "value": 0.986072, "split": "test", "tolerance": 0.001}
    assert card.data == "builtin:digits (seeded 20% held-out split, 359 examples)"
    assert (card.reproduce, card.toolkit_version) == ("toolkit train zoo:mine", "0.1.0")
    assert card.config.sha256 == sha256_file(LENET / "net.yaml") and card.config.bytes == 1494
    assert card.weights[0].model_dump() == {"file": "model.safetensors",
                                            "sha256": sha256_file(LENET / "model.safetensors"), "bytes": 55408}
    assert body == "\n# mine\n\nTrained with `toolkit train`.\n"
    index = json.loads((zoo / "index.json").read_text())
    assert index["format"] == 1 and list(index["models"]) == ["mine"]
    assert index["models"]["mine"]["metric"]["value"] == 0.986072 and index["models"]["mine"]["weights_bytes"] == 55408

    r = run("zoo", "verify", folder)
    assert r.status == 0, r.err
    assert r.out.splitlines() == [
        f"ok    card {folder / 'README.md'} (mine, toolkit 0.1.0)",
        f"ok    net.yaml: sha256 {card.config.sha256[:12]}…, 1494 bytes",
        f"ok    model.safetensors: sha256 {card.weights[0].sha256[:12]}…, 55408 bytes",
        "ok    net.yaml loads (net 'lenet')",
        "ok    model.safetensors matches the net (8 arrays)",
        "ok    accuracy 0.986072 on 359 test examples (the card says 0.986072, tolerance 0.001)",
        f"verified {folder}",
    ]
    r = run("zoo", "verify", folder, "--no-test")
    assert r.status == 0 and "skip  accuracy not measured (--no-test)" in r.out

    # the same again changes nothing; a different model of that name needs --force
    r = run("zoo", "publish", trained, "--to", zoo, "--name", "mine")
    assert r.status == 0 and r.out.startswith("unchanged: zoo:mine"), r.out
    r = run("zoo", "publish", trained, "--to", zoo, "--name", "mine", "--task", "digits")
    assert error_lines(r) == [f"error: {folder} already holds a model whose README.md differs from what publish "
                              "would write; pass --force to replace it"]
    r = run("zoo", "publish", trained, "--to", zoo, "--name", "mine", "--task", "digits", "--force")
    assert r.status == 0 and read_card(folder / "README.md")[0].task == "digits"


def test_verify_names_a_changed_byte_and_both_hashes(trained, tmp_path):
    zoo = tmp_path / "zoo"
    assert run("zoo", "publish", trained, "--to", zoo, "--name", "mine").status == 0
    weights = zoo / "mine" / "model.safetensors"
    before = sha256_file(weights)
    data = bytearray(weights.read_bytes())
    data[-2] ^= 0x01                  # one bit of the last float's exponent: still a readable file
    weights.write_bytes(bytes(data))
    after = sha256_file(weights)
    r = run("zoo", "verify", zoo / "mine")
    lines = error_lines(r)
    assert lines[0] == (f"error: {weights}: sha256 is {after}, the card says {before} "
                        "(55408 bytes, the card says 55408)")
    assert "FAIL  model.safetensors: sha256" in r.out and "ok    net.yaml: sha256" in r.out


def test_verify_reports_a_metric_that_does_not_reproduce(trained, tmp_path):
    zoo = tmp_path / "zoo"
    assert run("zoo", "publish", trained, "--to", zoo, "--name", "mine").status == 0
    card = zoo / "mine" / "README.md"
    card.write_text(card.read_text().replace("value: 0.986072", "value: 0.99"))
    r = run("zoo", "verify", zoo / "mine")
    assert error_lines(r) == [f"error: {zoo / 'mine' / 'model.safetensors'}: accuracy is 0.986072 on 359 "
                              "examples, the card says 0.99 (tolerance 0.001)"]
    assert "FAIL  accuracy 0.986072 on 359 test examples (the card says 0.99, tolerance 0.001)" in r.out


def test_publish_needs_a_licence_and_a_task(trained, tmp_path):
    (trained / "README.md").unlink()
    r = run("zoo", "publish", trained, "--to", tmp_path / "zoo")
    assert error_lines(r) == [f"error: publish {trained}: the card needs a licence and a task: pass --licence "
                              f"and --task, or write licence and task in the front matter of {trained / 'README.md'}"]
    assert not (tmp_path / "zoo").exists()
    r = run("zoo", "publish", trained, "--to", tmp_path / "zoo", "--licence", "MIT", "--task", "digits")
    assert r.status == 0, r.err
    card, body = read_card(tmp_path / "zoo" / "lenet" / "README.md")      # named after the net
    assert card.description == "A LeNet-style CNN for the 8x8 handwritten digits that ship with the toolkit."
    assert "- **Metric**: accuracy 0.986072 on 359 test examples" in body


def test_a_draft_that_claims_another_metric_is_refused(trained, tmp_path):
    (trained / "README.md").write_text(DRAFT.replace("licence: CC0-1.0",
                                                     "licence: CC0-1.0\nmetric: {name: accuracy, value: 0.9}"))
    r = run("zoo", "publish", trained, "--to", tmp_path / "zoo")
    assert error_lines(r) == [f"error: {trained / 'README.md'}: the draft card says accuracy 0.9, the test phase "
                              "measures 0.986072 on 359 examples (tolerance 0.001)"]
    (trained / "README.md").write_text(DRAFT.replace("licence:", "licenc:"))
    r = run("zoo", "publish", trained, "--to", tmp_path / "zoo")
    assert error_lines(r) == [f"{trained / 'README.md'}:4:1: error: card: unknown key 'licenc'; "
                              "did you mean 'licence'?"]


def test_npz_weights_are_published_as_safetensors(trained, tmp_path):
    arrays = load_weights(str(trained / "model.safetensors"))
    (trained / "model.safetensors").unlink()
    np.savez(trained / "trained.npz", **arrays)
    r = run("zoo", "publish", trained, "--to", tmp_path / "zoo", "--name", "npz")
    assert r.status == 0, r.err
    published = load_weights(str(tmp_path / "zoo" / "npz" / "model.safetensors"))
    assert published.keys() == arrays.keys()
    assert all(np.array_equal(published[k], arrays[k]) and published[k].dtype == arrays[k].dtype for k in arrays)
    assert run("zoo", "verify", tmp_path / "zoo" / "npz").status == 0


def test_publish_checks_the_weights_against_the_net(trained, tmp_path):
    arrays = load_weights(str(trained / "model.safetensors"))
    del arrays["ip2.bias"]
    (trained / "model.safetensors").unlink()
    np.savez(trained / "model.npz", **arrays)
    r = run("zoo", "publish", trained, "--to", tmp_path / "zoo")
    assert error_lines(r) == [f"error: {trained / 'model.npz'}: missing weight 'ip2.bias' of layer 'ip2', shape [10] "
                              "(pass --allow-missing to copy what matches and start the rest from their fillers)"]
    (trained / "other.yaml").write_text("name: x\n")
    (trained / "net.yaml").rename(trained / "lenet.yaml")
    r = run("zoo", "publish", trained, "--to", tmp_path / "zoo")
    assert error_lines(r) == [f"error: {trained}: several net files (publish takes net.yaml, or the only *.yaml)"]


def test_verify_a_shipped_model_by_name():
    r = run("zoo", "verify", "zoo:mlp")
    assert r.status == 0, r.err
    assert "ok    accuracy 0.97493 on 359 test examples (the card says 0.97493, tolerance 0.001)" in r.out


def test_zoo_nets_run_from_a_source(published, tmp_path):
    """``toolkit test zoo:NAME`` fetches the net and its weights from TOOLKIT_ZOO."""
    with settings.use(zoo=(str(published),)):
        r = run("test", f"zoo:{NAME}")
    assert r.status == 0, r.err
    assert json.loads(r.out) == {"examples": 359, "loss": 0.043202, "accuracy": 0.986072}


def test_publishing_a_model_in_place_refreshes_its_card(tmp_path):
    """After retraining a zoo model, ``toolkit zoo publish zoo/NAME --to zoo`` brings its card up
    to date (no --force: the folder publishes onto itself)."""
    zoo = tmp_path / "zoo"
    shutil.copytree(LENET, zoo / "lenet")
    net = zoo / "lenet" / "net.yaml"
    net.write_text(net.read_text().replace("max_iter: 1200", "max_iter: 1300"))
    r = run("zoo", "verify", zoo / "lenet", "--no-test")
    assert r.status == 2 and f"error: {net}: sha256 is {sha256_file(net)}" in r.err
    r = run("zoo", "publish", zoo / "lenet", "--to", zoo)
    assert r.status == 0 and r.out.startswith(f"published zoo:lenet in {zoo / 'lenet'}"), r.err
    card, body = read_card(zoo / "lenet" / "README.md")
    assert card.config.sha256 == sha256_file(net) and card.description == read_card(LENET / "README.md")[0].description
    assert body == read_card(LENET / "README.md")[1]
    assert run("zoo", "verify", zoo / "lenet").status == 0


def test_a_net_trained_on_files_is_refused_unless_its_data_is_bundled(tmp_path):
    """A run whose net reads a CSV outside the run folder (the published net would point home):
    refused with the way out; with --bundle-data the data travels as data.npz, the net points at
    it, input.json goes along, and verify re-measures the metric from the bundled data alone."""
    from toolkit.training.data import load_digits
    x, y = load_digits()
    header = ",".join([f"p{i}" for i in range(64)] + ["label"])
    (tmp_path / "tab.csv").write_text(header + "\n" + "\n".join(
        ",".join(str(int(v)) for v in x[i].ravel()) + f",{y[i]}" for i in range(300)) + "\n")
    net = tmp_path / "mlp.yaml"
    net.write_text((LENET.parent / "mlp" / "net.yaml").read_text().replace("builtin:digits", "tab.csv"))
    assert run("train", net, "--out", tmp_path / "run", "--set", "train.max_iter=30").status == 0
    r = run("zoo", "publish", tmp_path / "run", "--to", tmp_path / "zoo", "--licence", "MIT", "--task", "digits")
    assert error_lines(r) == [f"error: publish {tmp_path / 'run'}: the net trains on train.data.source ../tab.csv, "
                              "which would not travel with the model, so others could not reproduce or verify it: "
                              "pass --bundle-data to publish the data with it (as .npz), or train on builtin: data"]
    assert not (tmp_path / "zoo").exists()
    r = run("zoo", "publish", tmp_path / "run", "--to", tmp_path / "zoo", "--licence", "MIT", "--task", "digits",
            "--bundle-data")
    assert r.status == 0, r.err
    model = tmp_path / "zoo" / "mlp"
    assert sorted(p.name for p in model.iterdir()) == ["README.md", "data.npz", "input.json", "model.safetensors",
                                                       "net.yaml"]
    card, _ = read_card(model / "README.md")
    assert [f.file for f in card.data_files] == ["data.npz"] and card.input.file == "input.json"
    assert "source: data.npz" in (model / "net.yaml").read_text()
    with np.load(model / "data.npz") as bundled:
        np.testing.assert_array_equal(bundled["data"], x[:300].reshape(300, 64))
        np.testing.assert_array_equal(bundled["label"], y[:300])
    (tmp_path / "tab.csv").unlink()                          # the original is gone: the bundle suffices
    r = run("zoo", "verify", model)
    assert r.status == 0, r.err
    assert "ok    data.npz: sha256" in r.out and f"ok    {card.metric.name} {card.metric.value}" in r.out
    (model / "data.npz").write_bytes(b"changed")
    r = run("zoo", "verify", model, "--no-test")
    assert r.status == 2 and "data.npz" in r.err

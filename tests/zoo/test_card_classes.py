"""A published model carries its class names: input.json holds them (a labels file given at
import, or an image folder's subfolders), the card counts them (``classes``), ``zoo verify``
checks the count against input.json and the net's class scores, ``zoo show`` says it, and
``toolkit infer zoo:NAME --top K`` names the classes from the fetched model alone."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from pydantic import ValidationError
from zoo_helpers import LENET, run

from toolkit import settings
from toolkit.zoo.card import read_card

NAMES = [f"digit {i}" for i in range(10)]
DRAFT = "---\ndescription: LeNet with class names\ntask: digits\nlicence: CC0-1.0\n---\n"


def _model_folder(tmp_path, names):
    src = tmp_path / "run"
    src.mkdir()
    for f in ("net.yaml", "model.safetensors"):
        shutil.copy(LENET / f, src / f)
    (src / "README.md").write_text(DRAFT)
    (src / "input.json").write_text(json.dumps({"classes": names}))
    return src


def test_published_card_counts_the_class_names_and_infer_uses_them(tmp_path):
    zoo = tmp_path / "zoo"
    r = run("zoo", "publish", _model_folder(tmp_path, NAMES), "--to", zoo, "--name", "named")
    assert r.status == 0, r.err
    card, _ = read_card(zoo / "named" / "README.md")
    assert card.classes == 10 and card.input.file == "input.json"
    assert "\nclasses: 10\n" in (zoo / "named" / "README.md").read_text()
    r = run("zoo", "verify", zoo / "named", "--no-test")
    assert r.status == 0 and "ok    input.json names 10 classes, one per class score" in r.out, r.out + r.err
    x = np.random.default_rng(2).random((3, 1, 8, 8)).astype(np.float32) * 16
    np.save(tmp_path / "x.npy", x)
    with settings.use(zoo=(str(zoo),)):
        r = run("zoo", "show", "named")
        assert r.status == 0 and re.search(r"classes:\s+10 names, in input.json", r.out), r.out
        r = run("infer", "zoo:named", "--input", tmp_path / "x.npy", "--top", "1")
    assert r.status == 0, r.err
    import toolkit
    best = toolkit.load("zoo:lenet").infer(data=x)["prob"].argmax(axis=1)
    assert re.findall(r"class (\d+)  (.*)$", r.out, re.M) == [(str(i), NAMES[i]) for i in best]


def test_verify_refuses_names_that_fit_no_output(tmp_path):
    zoo = tmp_path / "zoo"
    r = run("zoo", "publish", _model_folder(tmp_path, NAMES[:9]), "--to", zoo, "--name", "nine")
    assert r.status == 0, r.err
    r = run("zoo", "verify", zoo / "nine", "--no-test")
    assert r.status == 2 and "9 class names, but no output of the net has 9 class scores per example" in r.err, r.err


def test_card_classes_need_the_input_description():
    from schemas.card import ModelCard
    entry = {"file": "net.yaml", "sha256": "0" * 64, "bytes": 1}
    fields = {"name": "m", "description": "d", "task": "t", "data": "d", "licence": "l", "reproduce": "r",
              "toolkit_version": "0.1.0", "metric": {"name": "accuracy", "value": 0.5}, "config": entry,
              "weights": [{**entry, "file": "w.safetensors"}], "classes": 10}
    with pytest.raises(ValidationError, match="the card needs 'input'"):
        ModelCard.model_validate(fields)
    assert ModelCard.model_validate({**fields, "input": {**entry, "file": "input.json"}}).classes == 10

"""The Python API beyond inference: ``toolkit.Net`` from a path, a YAML string or a dict,
``toolkit.train`` returning the run, and every wrong argument a ``toolkit.UserError`` or a
``TypeError`` that names it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

import toolkit
from toolkit.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
LENET_PATH = ROOT / "zoo" / "lenet" / "net.yaml"
LENET_TEXT = LENET_PATH.read_text()


def test_a_net_from_a_path_a_string_or_a_dict_is_the_same_net():
    from_path = toolkit.Net(str(LENET_PATH))
    from_pathlike = toolkit.Net(LENET_PATH)
    from_text = toolkit.Net(LENET_TEXT)
    from_dict = toolkit.Net(yaml.safe_load(LENET_TEXT))
    assert {n.name for n in (from_path, from_pathlike, from_text, from_dict)} == {"lenet"}
    assert from_text.declared == from_path.declared == from_dict.declared
    assert toolkit.Net(from_path) is from_path
    assert toolkit.Net(LENET_TEXT, set={"train.max_iter": 30}).spec.train.max_iter == 30
    assert toolkit.Net(LENET_TEXT, set=["train.max_iter=40"]).spec.train.max_iter == 40


def test_a_broken_string_is_located_in_the_string():
    with pytest.raises(SpecError) as e:
        toolkit.Net("name: x\ninputs: {}\nlayers: []\n")
    assert all(str(p).startswith("<string>:") for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("call, kind, words", [
    (lambda: toolkit.load(123), TypeError, "net: expected a file path"),
    (lambda: toolkit.load(None), TypeError, "not NoneType"),
    (lambda: toolkit.load(""), toolkit.UserError, "net: an empty string"),
    (lambda: toolkit.load(LENET_PATH, weights=3), TypeError, "weights: expected a string or None, not int"),
    (lambda: toolkit.load(LENET_PATH, dtype="int8"), toolkit.UserError, "dtype: 'int8' is not one of"),
    (lambda: toolkit.load(LENET_PATH, disable=[1]), TypeError, "disable: a pass name or a list"),
    (lambda: toolkit.load(LENET_PATH, disable="no_such_pass"), toolkit.UserError, "no_such_pass"),
    (lambda: toolkit.load(LENET_PATH, buckets=[True]), toolkit.UserError, "buckets must be positive integers"),
    (lambda: toolkit.Net(LENET_TEXT, set="train.max_iter=3"), TypeError, "set: a dict"),
    (lambda: toolkit.Net(toolkit.Net(LENET_TEXT), set={"a": 1}), toolkit.UserError, "takes no overrides"),
    (lambda: toolkit.train(), toolkit.UserError, "give a net, or resume="),
    (lambda: toolkit.train(LENET_PATH, device=5), TypeError, "device: expected a string"),
])
def test_every_wrong_argument_names_itself(call, kind, words):
    with pytest.raises(kind) as e:
        call()
    assert words in str(e.value)


def test_one_pass_name_is_one_pass_not_its_letters():
    model = toolkit.load("zoo:lenet", disable="fuse_elementwise")
    assert model.infer(data=np.zeros((1, 1, 8, 8), np.float32))["prob"].shape == (1, 10)


def test_train_returns_the_run_and_resumes_it(tmp_path):
    result = toolkit.train(yaml.safe_load(LENET_TEXT), out=tmp_path / "run", quiet=True,
                           set={"train.max_iter": 40, "train.test_interval": 20})
    assert result.status == 0 and result.iterations == 40 and result.folder == tmp_path / "run"
    assert set(result.metrics) == {"test_loss", "accuracy"}
    assert result.best["metric"] == "accuracy" and result.best["file"].is_file()
    again = toolkit.train(resume=tmp_path / "run", set={"train.max_iter": 60}, quiet=True)
    assert again.iterations == 60 and again.folder == tmp_path / "run"
    model = toolkit.load(tmp_path / "run" / "net.yaml", weights=str(tmp_path / "run" / "model.safetensors"))
    assert model.infer(data=np.zeros((3, 1, 8, 8), np.float32))["prob"].shape == (3, 10)

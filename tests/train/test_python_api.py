"""The Python API beyond inference: ``toolkit.Net`` from a path, a YAML string or a dict,
``toolkit.train`` returning the run, and every wrong argument a ``toolkit.UserError`` or a
``TypeError`` that names it."""
from __future__ import annotations

import copy
import importlib
import inspect
import pydoc
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
    (lambda: toolkit.Net(toolkit.Net(LENET_TEXT), set={"a": 1}), toolkit.UserError, "--set a: unknown key 'a'"),
    (lambda: toolkit.load(LENET_PATH, buckets=4), TypeError, "buckets: expected a list of batch sizes"),
    (lambda: toolkit.load(LENET_PATH, buckets={"N": 4}), TypeError, "buckets N: expected a list of batch sizes"),
    (lambda: toolkit.load(LENET_PATH, warm="yes"), TypeError, "warm: expected True or False, not str"),
    (lambda: toolkit.load(LENET_PATH, optimize_graph=None), TypeError, "optimize_graph: expected True or False"),
    (lambda: toolkit.train(LENET_PATH, quiet=1), TypeError, "quiet: expected True or False, not int"),
    (lambda: toolkit.train(LENET_PATH, allow_missing="no"), TypeError, "allow_missing: expected True or False"),
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


def test_net_is_a_class_that_isinstance_and_help_know():
    net = toolkit.Net(LENET_PATH)
    assert isinstance(toolkit.Net, type) and isinstance(net, toolkit.Net)
    assert "class Net" in pydoc.render_doc(toolkit.Net) and "YAML string" in pydoc.render_doc(toolkit.Net)
    assert toolkit.Net(net) is net
    # a Net takes more overrides on top of its own, and stays as it was
    tighter = toolkit.Net(toolkit.Net(LENET_PATH, set={"train.max_iter": 30}), set={"train.data.batch_size": 16})
    assert (tighter.spec.train.max_iter, tighter.spec.train.data.batch_size) == (30, 16)
    assert net.spec.train.max_iter != 30
    assert copy.deepcopy(tighter).spec.train.max_iter == 30


def test_train_takes_a_net_from_toolkit_net_with_more_settings(tmp_path):
    net = toolkit.Net(LENET_PATH, set={"train.test_interval": 5})
    result = toolkit.train(net, out=tmp_path / "run", set={"train.max_iter": 5}, quiet=True)
    assert result.status == 0 and result.iterations == 5
    recorded = yaml.safe_load((tmp_path / "run" / "net.yaml").read_text())
    assert recorded["train"]["max_iter"] == 5 and recorded["train"]["test_interval"] == 5


def test_dir_lists_the_api_and_train_is_a_function_of_its_own():
    assert {"Net", "load", "train", "Model", "UserError", "__version__"} <= set(dir(toolkit))
    assert inspect.isfunction(toolkit.train) and toolkit.train is toolkit.api.train
    assert "Train a net as ``toolkit train`` does" in pydoc.render_doc(toolkit.train)
    importlib.import_module("toolkit.training.trainer")      # the training package, under its own name
    assert inspect.isfunction(toolkit.train)


TWO_INPUTS = """
name: two
inputs:
  a: {shape: [N, 3], dtype: float32}
  b: {shape: [N, 3], dtype: float32}
layers:
  - {name: sum, type: Eltwise, bottom: [a, b], top: sum, operation: sum}
outputs: [sum]
"""


def test_one_array_positionally_for_a_net_of_one_input():
    model = toolkit.load("zoo:lenet", buckets=[1, 4])
    x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(model.infer(x)["prob"], model.infer(data=x)["prob"])
    with pytest.raises(TypeError, match="infer: 'data' given twice"):
        model.infer(x, data=x)
    with pytest.raises(TypeError, match="infer: expected an array or a dict"):
        model.infer("x.npy")
    with pytest.raises(TypeError, match=r"infer\(\) takes from 1 to 2 positional arguments"):
        model.infer(x, x)


def test_several_inputs_passed_positionally_are_named_in_the_error():
    model = toolkit.load(TWO_INPUTS)
    a, b = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    np.testing.assert_array_equal(model.infer(a=a, b=b)["sum"], a + b)
    with pytest.raises(TypeError) as e:
        model.infer(a)
    assert str(e.value) == "infer: net 'two' has 2 inputs (a, b); pass them by name, infer(a=..., b=...), or as a dict"

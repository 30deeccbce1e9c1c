"""Every rule of the train section is checked when the net file is read: `toolkit check` refuses
what `toolkit train` would, with the message training gave, located at the offending key
(FILE:LINE:COL, exit status 2); `toolkit train` refuses it the same way before it starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.train.train_helpers import cli, make_data

NET = """name: rules
inputs:
  data: {shape: [N, 16], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 4}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss}
  - {name: accuracy, type: Accuracy, bottom: [ip1, label], top: accuracy, phase: test}
train:
  data:
    source: data.npz
    batch_size: 8
  solver:
    base_lr: 0.1
  max_iter: 2
"""

TOKENS = """name: tokens
inputs:
  tokens: {shape: [N, T], dtype: int64}
  label: {shape: [N], dtype: int64}
layers:
  - {name: embed, type: Embed, bottom: tokens, top: emb, input_dim: 10, num_output: 4}
  - {name: rec, type: GRU, bottom: emb, top: h, num_output: 4, return_sequence: false}
  - {name: fc, type: InnerProduct, bottom: h, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
train:
  data:
    source: data.npz
  solver:
    base_lr: 0.1
  max_iter: 2
"""

# (case, net, lines added under `under`, the text the error points at, whether at the value, message)
RULES = [
    ("nesterov without momentum", NET, "  solver:", ["    type: nesterov"], "type: nesterov", False,
     "solver nesterov needs momentum > 0"),
    ("nesterov with momentum 0", NET, "  solver:", ["    type: nesterov", "    momentum: 0.0"], "momentum", False,
     "solver nesterov needs momentum > 0"),
    ("caffe's momentum convention on adam", NET, "  solver:", ["    type: adam", "    momentum_convention: caffe"],
     "momentum_convention", False, "solver.momentum_convention caffe is for sgd and nesterov, not adam"),
    ("momentum on adagrad", NET, "  solver:", ["    type: adagrad", "    momentum: 0.9"], "momentum", False,
     "solver adagrad has no momentum (use betas for adam/adamw, rho for adadelta)"),
    ("a step policy without its step", NET, "  solver:", ["    lr_policy:", "      type: step", "      gamma: 0.1"],
     "type: step", False, "lr_policy step needs step_size"),
    ("a multistep policy without gamma or milestones", NET, "  solver:", ["    lr_policy: {type: multistep}"],
     "type: multistep", False, "lr_policy multistep needs gamma, milestones"),
    ("lengths without a sequence dimension", NET, "  data:", ["    lengths: len"], "lengths", False,
     "train.data.lengths and padding_value are for inputs [N, T, ...] with one symbolic length besides the batch; "
     "the net's inputs have: none"),
    ("padding without a float input along T", TOKENS, "  data:", ["    padding_value: 0"], "padding_value", False,
     "train.data.padding_value needs a float input with the sequence dimension"),
    ("early stopping on a metric not measured", NET, "  max_iter: 2", ["  early_stop: {metric: recall, patience: 2}"],
     "recall", True, "the test phase measures no 'recall' (it measures: test_loss, accuracy)"),
    ("the best model by a metric not measured", NET, "  max_iter: 2", ["  best:", "    metric: top5"],
     "top5", True, "the test phase measures no 'top5' (it measures: test_loss, accuracy)"),
    ("early stopping without test data",
     NET.replace("  max_iter: 2\n", "  max_iter: 2\n  early_stop: {metric: accuracy, patience: 2}\n"),
     "  data:", ["    test_fraction: 0"], "early_stop", False,
     "train.early_stop needs test data and a test metric (train.data.test_fraction or test_source, and an "
     "Accuracy or loss layer in phase test)"),
    ("the best model without test data", NET, "  data:", ["    test_fraction: 0.0"],
     "best", False, "train.best needs test data and a test metric"),
    ("the best model by a metric of a layer not in phase test", NET.replace("  - {name: accuracy", "#"),
     "  max_iter: 2", ["  best: {metric: accuracy}"], "accuracy", True,
     "the test phase measures no 'accuracy' (it measures: test_loss)"),
    ("a pipeline balanced by neither time nor FLOPs", NET, "  max_iter: 2", ["  distributed:", "    balance: fastest"],
     "fastest", True, "bad 'balance': input should be 'time' or 'flops'"),
    ("a pipeline rank's memory limit not positive", NET, "  max_iter: 2",
     ["  distributed:", "    stage_memory_mb: -3"], "-3", True,
     "bad 'stage_memory_mb': input should be greater than 0"),
]


def written(tmp_path: Path, net: str, under: str, lines: list[str], case: str) -> Path:
    text = net.replace(under + "\n", under + "\n" + "".join(f"{line}\n" for line in lines), 1)
    if case == "the best model without test data":
        text += "  best: {metric: accuracy}\n"
    path = tmp_path / "net.yaml"
    path.write_text(text)
    make_data(tmp_path)
    return path


def located(path: Path, needle: str, at_value: bool) -> str:
    """FILE:LINE:COL of ``needle`` in the train section: a value, or a key (``KEY`` or
    ``KEY: VALUE``, where a key is written more than once)."""
    lines = path.read_text().splitlines()
    first = lines.index("train:")
    if not at_value and ":" not in needle:
        needle += ":"
    for number, line in enumerate(lines[first:], first + 1):
        col = line.find(needle)
        if col >= 0:
            return f"{path}:{number}:{col + 1}"
    raise AssertionError(f"{needle} not in {path}")


@pytest.mark.parametrize("case, net, under, lines, needle, at_value, message", RULES, ids=[r[0] for r in RULES])
def test_check_refuses_what_train_would_at_the_key(tmp_path, case, net, under, lines, needle, at_value, message):
    path = written(tmp_path, net, under, lines, case)
    expected = [f"{located(path, needle, at_value)}: error: {message}"]
    checked = cli("check", path)
    assert checked.status == 2 and checked.errors == expected, checked.err
    trained = cli("train", path, "--out", tmp_path / "run")
    assert trained.status == 2 and trained.errors == expected, trained.err
    assert not (tmp_path / "run").exists()


def test_a_rule_broken_by_set_is_the_flags(tmp_path):
    path = written(tmp_path, NET, "  solver:", [], "")
    r = cli("check", path, "--set", "train.solver.type=adam", "--set", "train.solver.momentum=0.9")
    assert r.status == 2 and r.errors == ["error: --set train.solver.momentum: solver adam has no momentum "
                                          "(use betas for adam/adamw, rho for adadelta)"]


def test_every_rule_broken_is_said_at_once(tmp_path):
    path = written(tmp_path, NET, "  solver:", ["    type: adam", "    momentum: 0.9", "    momentum_convention: caffe",
                                                "    lr_policy: {type: exp}"], "")
    r = cli("check", path)
    assert r.status == 2 and [line.split(": error: ")[1] for line in r.errors] == [
        "solver adam has no momentum (use betas for adam/adamw, rho for adadelta)",
        "solver.momentum_convention caffe is for sgd and nesterov, not adam",
        "lr_policy exp needs gamma"]


def test_the_rules_pass_a_good_net_and_one_without_a_train_section(tmp_path):
    path = written(tmp_path, NET, "  solver:", ["    type: nesterov", "    momentum: 0.9"], "")
    assert cli("check", path).status == 0
    path.write_text(NET[:NET.index("train:")])
    assert cli("check", path).status == 0

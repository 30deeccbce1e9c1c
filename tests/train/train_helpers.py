"""Helpers of the training tests, and of the command-line tests that import them: ``cli`` runs
the ``toolkit`` command in this process, ``sets`` spells --set flags, the small nets and the
synthetic data set they train on, and comparisons of runs, checkpoints and files."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path

import numpy as np

from toolkit.cli import main
from toolkit.training.checkpoint import list_checkpoints, read_checkpoint

# ip1 -> BatchNorm -> ReLU -> Dropout -> ip2: every kind of state a resume must carry (weights,
# running statistics, solver slots, the dropout generator). 45 training examples in batches of
# 8: an epoch is 6 iterations, the last one a short batch of 5.
RESUME_NET = """\
name: resumenet
inputs:
  data: {shape: [N, 16], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 24}
  - {name: bn1, type: BatchNorm, bottom: ip1, top: ip1}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: drop1, type: Dropout, bottom: ip1, top: ip1, dropout_ratio: 0.3}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 4}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss, phase: [train, test]}
  - {name: accuracy, type: Accuracy, bottom: [ip2, label], top: accuracy, phase: test}
  - {name: prob, type: Softmax, bottom: ip2, top: prob, phase: infer}
train:
  data: {source: data.npz, test_fraction: 0.25, batch_size: 8, shuffle: true}
  solver: {type: sgd, base_lr: 0.1, momentum: 0.9, weight_decay: 0.001,
           lr_policy: {type: step, gamma: 0.5, step_size: 7}}
  max_iter: 20
  test_interval: 5
  display: 1
  snapshot: 4
  seed: 3
"""

# Softmax regression: deterministic, so its losses and metrics can be recomputed with numpy.
# The loss top is weighted 2 and named 'xent' so that 'loss' (the objective) and 'xent' differ.
SOFTREG_NET = """\
name: softreg
inputs:
  data: {shape: [N, 16], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 4}
  - {name: xent, type: SoftmaxWithLoss, bottom: [ip1, label], top: xent, loss_weight: 2, phase: [train, test]}
  - {name: acc, type: Accuracy, bottom: [ip1, label], top: acc, phase: test}
  - {name: prob, type: Softmax, bottom: ip1, top: prob, phase: infer}
train:
  data: {source: data.npz, test_fraction: 0.25, batch_size: 8, shuffle: true}
  solver: {type: sgd, base_lr: 0.05, lr_policy: {type: step, gamma: 0.5, step_size: 4}}
  max_iter: 10
  test_interval: 4
  display: 1
  snapshot: 2
  keep_last: 10
  seed: 1
"""


class Result:
    def __init__(self, status: int, out: str, err: str):
        self.status, self.out, self.err = status, out, err

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if "error:" in line]


def cli(*args) -> Result:
    """``toolkit ARGS`` in this process; an exception escaping main fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in args])
    return Result(status, out.getvalue(), err.getvalue())


def sets(**kv) -> list[str]:
    """--set arguments from keyword arguments; '__' separates key levels."""
    args = []
    for k, v in kv.items():
        args += ["--set", f"{k.replace('__', '.')}={v}"]
    return args


def make_data(folder: Path, n: int = 60, seed: int = 0) -> None:
    """Four Gaussian blobs in 16 dimensions: learnable in a few steps."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    centres = rng.normal(size=(4, 16)) * 2
    x = (centres[y] + rng.normal(size=(n, 16))).astype(np.float32)
    np.savez(folder / "data.npz", data=x, label=y.astype(np.int64))


def train(net: Path, out: Path, *extra) -> Result:
    r = cli("train", net, "--out", out, *extra)
    assert r.status == 0, r.err
    return r


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert np.array_equal(a[k], b[k]), f"{k} differs (max |diff| {np.max(np.abs(a[k] - b[k]))})"


def assert_same_checkpoints(run_a: Path, run_b: Path) -> None:
    """Same checkpoint iterations; each checkpoint equal bit for bit (arrays and metadata)."""
    ca, cb = list_checkpoints(run_a / "checkpoints"), list_checkpoints(run_b / "checkpoints")
    assert [i for i, _ in ca] == [i for i, _ in cb]
    for (_, pa), (_, pb) in zip(ca, cb):
        a, b = read_checkpoint(pa), read_checkpoint(pb)
        assert a.iteration == b.iteration
        assert_same_arrays(a.arrays, b.arrays)
        assert a.meta == b.meta


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def softmax_xent(w: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of the softmax regression net, in float64."""
    logits = x.astype(np.float64) @ w["ip1.weight"].astype(np.float64).T + w["ip1.bias"]
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean()), float((logits.argmax(axis=1) == y).mean())


def net_data(net_path: Path, *overrides):
    """The net (with overrides), its train/test sets and batch order, as the trainer builds them."""
    from toolkit.frontend import Net
    from toolkit.frontend.spec import parse_overrides
    from toolkit.training.data import BatchOrder
    from toolkit.training.feeding import load_data, train_spec
    net = Net.load(str(net_path), parse_overrides(list(overrides)))
    spec = train_spec(net)
    train_set, test_set = load_data(net, spec)
    order = BatchOrder(len(train_set), spec.data.batch_size, spec.data.shuffle, spec.seed)
    return net, spec, train_set, test_set, order


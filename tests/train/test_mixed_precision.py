"""Mixed-precision training: the autocast rewrite, dynamic loss scaling against PyTorch's
GradScaler rules, skipped steps that change nothing, exactness where no rounding happens, and a
LeNet run that reaches the float32 run's accuracy."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.train.train_helpers import RESUME_NET, cli, make_data
from toolkit import settings
from toolkit.backend.devices import gpu_available
from toolkit.compile import train_graph
from toolkit.frontend import OBJECTIVE, Net
from toolkit.optim.loss_scaling import SCALE, STEPS, TRACKER, MixedPrecision
from toolkit.optim.solvers import SolverConfig, host_values
from toolkit.passes import precision
from toolkit.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def blob_net(tmp_path) -> Path:
    make_data(tmp_path)
    path = tmp_path / "net.yaml"
    dropout = "  - {name: drop1, type: Dropout, bottom: ip1, top: ip1, dropout_ratio: 0.3}\n"
    path.write_text(RESUME_NET.replace(dropout, ""))
    return path


# An overflowing step is what these tests are about: the inf they make (a scale past float16's
# range, an inf in the data) spreads through the backward pass as inf and NaN (inf * 0, inf - inf,
# 1 / 0) until all_finite sees it and the step is skipped. The numpy kernels say so as they go;
# the warnings are expected here, and filtered here only (the generated C kernels, what users get
# by default, say nothing, and the `toolkit` command ignores RuntimeWarning).
OVERFLOWING = (pytest.mark.filterwarnings("ignore:invalid value encountered in:RuntimeWarning"),
               pytest.mark.filterwarnings("ignore:divide by zero encountered in:RuntimeWarning"))


def overflowing(test):
    for mark in OVERFLOWING:
        test = mark(test)
    return test


def load(path: Path, **mixed) -> Net:
    overrides = [(("train", "solver", "mixed_precision"), mixed)] if mixed else []
    return Net.load(str(path), overrides=overrides)


def test_autocast_puts_gemms_in_half_and_keeps_losses_and_master_weights_in_float32():
    net = Net.load(str(ROOT / "zoo" / "lenet" / "net.yaml"))
    graph = train_graph(net, SolverConfig(momentum=0.9, mixed_precision=MixedPrecision("float16")))
    kinds = {}
    for node in graph.nodes:
        kinds.setdefault(node.op, set()).add(node.outputs[0].dtype)
    for op in ("conv2d", "matmul", "conv2d_grad_input", "conv2d_grad_weight", "relu", "max_pool2d"):
        assert kinds[op] == {"float16"}, (op, kinds[op])
    for op in ("log_softmax", "nll_loss", "nll_loss_grad", "all_finite", "select"):
        assert kinds[op] == {"float32"}, (op, kinds[op])
    assert all(w.value.dtype == "float32" for w in graph.weights.values())
    assert all(v.dtype == "float32" for v in graph.updates.values())
    assert graph.outputs[OBJECTIVE].dtype == "float32"
    # the weights are cast once each on the way in, not once per use
    casts = [n for n in graph.nodes if n.op == "cast" and n.inputs[0].name in graph.weights]
    assert len(casts) == len({n.inputs[0].id for n in casts}) == 8


def test_cpu_stores_half_as_float32_and_rounds_where_a_device_would():
    net = Net.load(str(ROOT / "zoo" / "lenet" / "net.yaml"))
    graph = train_graph(net, SolverConfig(mixed_precision=MixedPrecision("bfloat16")))
    precision.store_half_as_float32(graph)
    values = [o for n in graph.nodes for o in n.outputs]
    assert not any(v.dtype in ("float16", "bfloat16") for v in values)
    rounds = [n for n in graph.nodes if n.op == "round_precision"]
    assert {n.attrs["dtype"] for n in rounds} == {"bfloat16"}
    # every GEMM and convolution result goes through a rounding before anything reads it
    consumers = graph.consumers()
    for node in graph.nodes:
        if node.op in ("matmul", "conv2d", "conv2d_grad_input", "conv2d_grad_weight"):
            assert [c.op for c in consumers[node.outputs[0].id]] == ["round_precision"], node


def batch(trainer: Trainer, index: int, step: int, poison: bool = False) -> dict:
    """The feed of one step: the rows of iteration ``index``, the first rate, Adam's step count
    ``step`` (``poison``: one inf in the data, so the step's gradients overflow)."""
    rows = trainer.train_set.take(trainer.order.rows(index))
    feed = {k: v.copy() for k, v in rows.items() if k in trainer.graph.inputs}
    if poison:
        feed["data"][0, 0] = np.inf
    return {**feed, **host_values(trainer.cfg, trainer.lr_at(0), step, "float32")}


def _run(trainer: Trainer, feeds) -> list[dict]:
    out = []
    for feed in feeds:
        r = trainer.train_plans.run(feed)
        out.append({k: float(np.asarray(v)) for k, v in r.items() if np.ndim(v) == 0})
    return out


@overflowing
def test_a_skipped_step_changes_no_weight_slot_or_running_statistic(blob_net, tmp_path):
    """A scale of 1e30 overflows float16 at once: the step keeps every state, the scale halves."""
    trainer = Trainer(load(blob_net, init_scale=1e30), tmp_path / "run")
    before = {k: v.copy() for k, v in trainer.store.items()}
    _run(trainer, [batch(trainer, 0, 1)])
    for k, v in trainer.store.items():
        if k == SCALE:
            assert v == np.float32(1e30) * np.float32(0.5)
        else:
            assert np.array_equal(v, before[k]), k
    assert {"bn1.running_mean", "ip1.weight@momentum"} <= set(before)


@pytest.fixture
def numpy_kernels():
    with settings.use(native=False):
        yield


@overflowing
def test_loss_scaling_without_rounding_is_exact_and_adam_counts_only_taken_steps(blob_net, tmp_path, monkeypatch,
                                                                                 numpy_kernels):
    """With autocast switched off (no op in a half type), loss scaling by powers of two changes
    no bit of SGD's trajectory. A first step that overflows (an inf in its data) is skipped and
    the scale halves to 2**8; Adam then starts as if from step 1, as torch.optim.Adam does
    under GradScaler (its step count does not move on a skipped step)."""
    monkeypatch.setattr(precision, "LOW_OPS", frozenset())
    # bit for bit is the numpy kernels' claim: under TOOLKIT_NATIVE=1 the two trainers' plans
    # (the scaled one has the overflow check and the scale's ops) are compiled to different
    # kernels, and the BatchNorm running mean came out an ulp apart (3e-8): the numpy_kernels fixture
    adam = [(("train", "solver"), {"type": "adam", "base_lr": 0.01, "weight_decay": 0.001})]
    scaled = {"init_scale": 2.0 ** 9, "growth_interval": 3}
    for solver, tol in (([], 0.0), (adam, 2e-6)):
        plain = Trainer(Net.load(str(blob_net), overrides=solver), tmp_path / "plain")
        mixed = Trainer(Net.load(str(blob_net), overrides=solver + [(("train", "solver", "mixed_precision"), scaled)]),
                        tmp_path / "mixed")
        want = _run(plain, [batch(plain, i, i + 1) for i in range(6)])
        got = _run(mixed, [batch(mixed, 0, 1, poison=True)] + [batch(mixed, i, i + 1) for i in range(6)])
        assert got[0]["loss_scale"] == 2.0 ** 8
        for w, g in zip(want, got[1:]):
            assert abs(w["loss"] - g["loss"]) <= tol * abs(w["loss"]), (solver, w, g)
        for k, v in plain.store.items():
            np.testing.assert_allclose(mixed.store[k], v, rtol=tol, atol=tol * 1e-3, err_msg=k)
        if solver:
            assert mixed.store[STEPS] == 6            # 7 steps launched, the first one skipped
        assert got[-1]["loss_scale"] == 2.0 ** 10     # grown after good steps 3 and 6


@overflowing
def test_the_scale_follows_torch_gradscaler(blob_net, tmp_path, monkeypatch):
    """Overflows injected as inf inputs at chosen steps; the scale after each step equals what
    torch._amp_update_scale_ (the kernel behind GradScaler.update) computes for the same
    sequence of found-inf flags."""
    monkeypatch.setattr(precision, "LOW_OPS", frozenset())
    trainer = Trainer(load(blob_net, init_scale=1024.0, backoff_factor=0.25, growth_interval=2), tmp_path / "run")
    overflow = [False, False, True, False, False, False, True, True, False, False, False]
    got = [r["loss_scale"] for r in _run(trainer, [batch(trainer, i, i + 1, bad) for i, bad in enumerate(overflow)])]

    scale, tracker = torch.tensor([1024.0]), torch.tensor([0], dtype=torch.int32)
    want = []
    for bad in overflow:
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(bad)]), 2.0, 0.25, 2)
        want.append(float(scale))
    assert got == want, (got, want)
    assert trainer.store[TRACKER] == float(tracker)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")])])
def test_mixed_precision_lenet_reaches_the_float32_accuracy(tmp_path, monkeypatch, device):
    """`toolkit train --dtype float16` and bfloat16 against float32: the held-out accuracy within
    one point, the loss scale logged. On the CPU float16 and bfloat16 are emulated (stored as
    float32, rounded at casts and accumulations); on a GPU float16 is real, bfloat16 emulated."""
    accuracy = {}
    for dtype in ("float32", "float16", "bfloat16"):
        monkeypatch.setattr("toolkit.errors._noticed", set())      # the notice is said once per process
        out = tmp_path / dtype
        r = cli("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", out, "--dtype", dtype, "--device", device,
                "--set", "train.max_iter=600", "--set", "train.test_interval=600")
        assert r.status == 0, r.err
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        accuracy[dtype] = rows[-1]["accuracy"]
        assert ("loss_scale" in rows[0]) == (dtype != "float32")
        if dtype != "float32" and (device == "cpu" or dtype == "bfloat16"):
            assert f"mixed precision in {dtype} on {device}" in r.err
    assert accuracy["float32"] > 0.95, accuracy
    for dtype in ("float16", "bfloat16"):
        assert abs(accuracy[dtype] - accuracy["float32"]) <= 0.01, accuracy


def test_mixed_precision_settings_are_checked(tmp_path):
    lenet = ROOT / "zoo" / "lenet" / "net.yaml"
    for bad, word in (("train.solver.mixed_precision.dtype=float64", "dtype"),
                      ("train.solver.mixed_precision.backoff_factor=2", "backoff_factor"),
                      ("train.solver.mixed_precision.loss_scale=-1", "loss_scale")):
        r = cli("train", lenet, "--out", tmp_path / "x", "--set", bad)
        assert r.status == 2 and word in r.err and "Traceback" not in r.err, r.err
    # in the net file: FILE:LINE:COL of the bad value
    text = lenet.read_text().replace("solver: {type: sgd,", "solver: {mixed_precision: {dtype: float64}, type: sgd,")
    (tmp_path / "bad.yaml").write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "mixed_precision" in row)
    r = cli("train", tmp_path / "bad.yaml", "--out", tmp_path / "x")
    assert r.status == 2 and f"bad.yaml:{line}:" in r.err and "'float16' or 'bfloat16'" in r.err, r.err

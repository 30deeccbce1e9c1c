"""What training shows tells the truth: the first step's kernel compile on a line of its own
(its time kept out of it/s), it/s over a recent window so that the ETA is sane from the second
line on, the epoch beside the iteration, and a finished run resumed says it is finished and
does nothing (exit status 0)."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

import toolkit
import toolkit.training.plans as plans_module
from toolkit.training.progress import WINDOW_ITERATIONS, Speed

# 100 training rows at batch 32: epochs of 4 iterations (the fourth short, 4 rows)
NET = """
name: blobs
inputs:
  data:  {shape: [N, 16], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip, type: InnerProduct, bottom: data, top: ip, num_output: 4}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss, phase: [train, test]}
  - {name: accuracy, type: Accuracy, bottom: [ip, label], top: accuracy, phase: test}
  - {name: prob, type: Softmax, bottom: ip, top: prob, phase: infer}
outputs: [prob]
train:
  data: {source: train.npz, test_source: test.npz, batch_size: 32}
  solver: {type: sgd, base_lr: 0.1}
  max_iter: 10
  display: 1
"""


@pytest.fixture
def net(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    for name, n in (("train", 100), ("test", 20)):
        y = rng.integers(0, 4, n)
        np.savez(tmp_path / f"{name}.npz", data=(rng.normal(size=(n, 16)) + y[:, None]).astype(np.float32),
                 label=y.astype(np.int64))
    path = tmp_path / "net.yaml"
    path.write_text(NET)
    return path


def test_speed_is_measured_over_the_recent_window():
    speed = Speed(0, now=0.0)
    speed.mark(1, now=10.0)                  # a slow first step (data, caches)
    assert speed.rate() == pytest.approx(0.1)
    for i in range(2, 2 + 3 * WINDOW_ITERATIONS):
        speed.mark(i, now=10.0 + 0.01 * (i - 1))    # then 100 it/s
    assert speed.rate() == pytest.approx(100.0)
    speed.exclude(5.0)                       # a compile: its time is not the steps'
    speed.mark(2 + 3 * WINDOW_ITERATIONS, now=10.0 + 0.01 * (1 + 3 * WINDOW_ITERATIONS) + 5.0)
    assert speed.rate() == pytest.approx(100.0)


def test_steps_read_at_once_share_a_time_and_still_have_a_speed():
    # on a GPU the losses of a display interval are read in one go: many marks, one time
    speed = Speed(0, now=0.0)
    for i in range(1, 51):
        speed.mark(i, now=1.0)
    for i in range(51, 101):
        speed.mark(i, now=2.0)
    assert speed.rate() == pytest.approx(50.0)


def test_the_compile_has_its_own_line_and_stays_out_of_it_per_second(net, tmp_path, monkeypatch, capsys):
    built = plans_module.Plan

    class SlowToBuild(built):                # every plan's build takes 1.5 s longer: a slow compile
        def __init__(self, *args, **kwargs):
            import time
            time.sleep(1.5)
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(plans_module, "Plan", SlowToBuild)
    toolkit.train(net, out=tmp_path / "run")
    lines = capsys.readouterr().err.splitlines()
    compiled = [i for i, line in enumerate(lines) if line.startswith("compiling kernels of the train step ... ")]
    first = next(i for i, line in enumerate(lines) if line.startswith("iter 0 "))
    assert len(compiled) == 1 and compiled[0] < first, lines
    assert float(re.search(r"\.\.\. ([\d.]+) s$", lines[compiled[0]]).group(1)) >= 1.5
    # the second line: the compile (1.5 s or more) would bring it under 1.4 it/s
    second = next(line for line in lines if line.startswith("iter 1 "))
    rate = float(re.search(r" ([\d.]+) it/s ETA ", second).group(1))
    assert rate > 2.0, second
    eta = re.search(r" ETA (\d+):(\d+)$", second)
    assert int(eta.group(1)) * 60 + int(eta.group(2)) <= 8 / 2.0, second
    # the short last batch of an epoch (4 rows) is a plan of its own: its compile is said too
    assert any(line.startswith("compiling kernels of the train step for a batch of 4 ... ") for line in lines), lines
    assert any(line.startswith("compiling kernels of the test pass ... ") for line in lines), lines


def test_the_epoch_stands_beside_the_iteration(net, tmp_path, capsys):
    toolkit.train(net, out=tmp_path / "run")
    shown = {int(m.group(1)): m.group(2) for m in re.finditer(r"^iter (\d+) epoch (\d+/\d+) loss ",
                                                              capsys.readouterr().err, re.M)}
    # 4 iterations an epoch, 10 iterations: 3 epochs, the third partial
    assert shown == {i: f"{i // 4 + 1}/3" for i in range(10)}


def test_the_bar_on_a_terminal_shows_the_epoch_and_a_speed_without_the_compile(monkeypatch):
    import types

    import toolkit.training.progress as progress_module

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    screen = Terminal()
    bar = progress_module.Progress(8, 0, 1, screen, per_epoch=3)
    clock.now = 2.0
    bar.compiled("of the train step", 2.0)          # the first 2 s were the compile
    for i in range(3):
        clock.now += 0.25                           # then 4 steps a second
        bar.update(i, 0.5, 0.1)
    drawn = screen.getvalue()
    assert drawn.startswith("compiling kernels of the train step ... 2.0 s\n")
    assert "] 1/8 epoch 1/3 loss 0.5000 lr 0.1 4.0 it/s ETA 00:01 " in drawn, drawn
    assert "] 3/8 epoch 1/3 loss 0.5000 lr 0.1 4.0 it/s ETA 00:01 " in drawn, drawn


def _history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def test_resuming_a_finished_run_says_so_and_does_nothing(net, tmp_path, capsys):
    run = tmp_path / "run"
    first = toolkit.train(net, out=run, quiet=True)
    assert first.status == 0 and first.iterations == 10
    files = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    again = toolkit.train(resume=run)
    err = capsys.readouterr().err
    assert f"{run}: the run is finished: it reached iteration 10, its last (train.max_iter 10); nothing to train" in err
    assert "compiling kernels" not in err and "test at iteration" not in err, err
    assert again.status == 0 and again.iterations == 10 and again.folder == run
    assert again.metrics == pytest.approx(first.metrics) and again.best["iteration"] == first.best["iteration"]
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == files   # nothing written
    # raised, it trains on
    more = toolkit.train(resume=run, set={"train.max_iter": 12}, quiet=True)
    assert more.iterations == 12 and len(_history(run)) == 2


def test_resuming_an_early_stopped_run_says_so_and_does_nothing(net, tmp_path, capsys):
    run = tmp_path / "run"
    # no test improves accuracy by more than 1: it stops at the second test
    stopped = toolkit.train(net, out=run, quiet=True,
                            set=["train.max_iter=40", "train.test_interval=4",
                                 "train.early_stop={metric: accuracy, patience: 1, min_delta: 1}"])
    assert stopped.iterations == 8
    again = toolkit.train(resume=run)
    err = capsys.readouterr().err
    assert f"{run}: the run is finished: it stopped early at iteration 8 (accuracy had not improved for 1 tests)" in err
    assert "iter " not in err, err
    assert again.status == 0 and again.iterations == 8
    # more patience: it trains on from iteration 8
    more = toolkit.train(resume=run, set={"train.early_stop.patience": 2}, quiet=True)
    assert more.iterations > 8


def test_the_command_says_a_finished_run_is_finished_and_exits_0(net, tmp_path):
    import subprocess
    import sys
    run = tmp_path / "run"
    toolkit.train(net, out=run, quiet=True)
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "train", "--resume", str(run)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "the run is finished: it reached iteration 10" in proc.stderr
    assert "compiling kernels" not in proc.stderr

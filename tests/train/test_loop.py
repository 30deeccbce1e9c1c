"""The training loop end to end, through the ``toolkit`` command: exact resume, SIGINT/SIGTERM,
the NaN guard, metrics.jsonl and the loss plot, ``--set`` overrides, ``--weights`` and ``toolkit
test`` (atomic checkpoints and keep-last-K: test_checkpoints.py).

Every run is tiny (a few dozen iterations on a 60-example synthetic set or on the digits), so
the whole file takes seconds; the numbers are still checked exactly or against numpy.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.train.train_helpers import (
    assert_same_arrays,
    assert_same_checkpoints,
    cli,
    net_data,
    records,
    sets,
    softmax_xent,
    train,
)
from toolkit.training.checkpoint import find_resume_point, list_checkpoints, read_checkpoint, write_checkpoint

# ---------------------------------------------------------------------------------------------
# 1. resume is exact
# ---------------------------------------------------------------------------------------------

ADAM = "{type: adam, base_lr: 0.01, weight_decay: 0.0001, lr_policy: {type: step, gamma: 0.5, step_size: 7}}"


# mixed precision: the loss scale grows every 3 good steps, so it changes across the resume point
MIXED = ["--dtype", "float16", "--set", "train.solver.mixed_precision.growth_interval=3"]


@pytest.mark.parametrize("solver", ["sgd", "adam", "sgd-mixed"])
def test_resume_is_bit_exact(resume_net, tmp_path, solver):
    """2N iterations == N, --resume, N more: every array of the model, of every checkpoint
    (solver slots and running stats included), the checkpoint metadata (rng state) and
    metrics.jsonl. N = 10 is not a multiple of the 6-iteration epoch, the step policy changes
    the rate at 7 and 14, and a test pass runs every 5 iterations."""
    extra = {"sgd": [], "adam": ["--set", f"train.solver={ADAM}"], "sgd-mixed": MIXED}[solver]
    _net, _spec, train_set, _test, order = net_data(resume_net)
    assert len(train_set) == 45 and order.per_epoch == 6 and 10 % order.per_epoch  # N=10 mid-epoch
    full, split = tmp_path / "full", tmp_path / "split"
    train(resume_net, full, *extra)
    train(resume_net, split, *extra, *sets(train__max_iter=10))
    first = read_checkpoint(find_resume_point(str(split)))
    assert first.iteration == 10
    # the net says max_iter 20; the run recorded 10, so the change is named
    train(resume_net, split, "--resume", split, *extra, *sets(train__max_iter=20))

    slots = {"sgd": "@momentum", "adam": "@exp_avg_sq", "sgd-mixed": "amp@growth_tracker"}[solver]
    final = read_checkpoint(split / "checkpoints" / "iter_0000020.safetensors")
    assert final.iteration == 20
    assert any(k.endswith(slots) for k in final.arrays), sorted(final.arrays)
    assert {"bn1.running_mean", "bn1.running_var"} <= set(final.arrays)
    # the running stats moved away from their start (0 and 1), so comparing them means something
    assert np.abs(final.arrays["bn1.running_mean"]).max() > 1e-3
    assert np.abs(final.arrays["bn1.running_var"] - 1).max() > 1e-3

    assert_same_arrays(load_file(full / "model.safetensors"), load_file(split / "model.safetensors"))
    assert "bn1.running_mean" in load_file(full / "model.safetensors")
    assert not any("@" in k for k in load_file(full / "model.safetensors"))   # no solver slots in models
    assert_same_checkpoints(full, split)
    # metrics: identical records; every iteration logged once, in order, losses finite
    rf, rs = records(full), records(split)
    assert rf == rs
    assert [r["iter"] for r in rf if "loss" in r] == list(range(20))
    # the rate followed the step policy across the resume point
    assert [r["lr"] for r in rf if "loss" in r] == pytest.approx(
        [(0.01 if solver == "adam" else 0.1) * 0.5 ** (i // 7) for i in range(20)], rel=1e-12)
    if solver == "sgd-mixed":      # the scale moved: grown after good steps, halved after an overflow
        assert len({r["loss_scale"] for r in rf if "loss" in r}) > 2, rf


def test_resume_restores_the_dropout_generator(resume_net, tmp_path):
    """The control for the test above: the same resume from a checkpoint whose generator state
    was replaced ends elsewhere, so the generator state is what makes dropout repeat."""
    full, split = tmp_path / "full", tmp_path / "split"
    train(resume_net, full)
    train(resume_net, split, *sets(train__max_iter=10))
    path = find_resume_point(str(split))
    ck = read_checkpoint(path)
    ck.meta["rng"] = np.random.default_rng(12345).bit_generator.state
    write_checkpoint(path.parent, ck, keep_last=10)
    train(resume_net, split, "--resume", path, *sets(train__max_iter=20))
    a, b = load_file(full / "model.safetensors"), load_file(split / "model.safetensors")
    assert not np.array_equal(a["ip1.weight"], b["ip1.weight"])


def test_resume_from_a_middle_checkpoint_file_into_a_new_folder(resume_net, tmp_path):
    """--resume FILE --out OTHER: starts at that checkpoint's iteration; same end state."""
    full, other = tmp_path / "full", tmp_path / "other"
    train(resume_net, full, *sets(train__keep_last=10))
    mid = full / "checkpoints" / "iter_0000008.safetensors"
    assert mid.is_file()
    train(resume_net, other, "--resume", mid, *sets(train__keep_last=10))
    assert_same_arrays(load_file(full / "model.safetensors"), load_file(other / "model.safetensors"))
    assert [r["iter"] for r in records(other) if "loss" in r] == list(range(8, 20))
    losses = {r["iter"]: r["loss"] for r in records(full) if "loss" in r}
    assert all(losses[r["iter"]] == r["loss"] for r in records(other) if "loss" in r)


def test_resume_checks_solver_and_missing_checkpoint(resume_net, tmp_path):
    run = tmp_path / "run"
    train(resume_net, run, *sets(train__max_iter=4))
    r = cli("train", resume_net, "--resume", run, "--set", f"train.solver={ADAM}", *sets(train__max_iter=4))
    assert r.status == 2
    assert r.errors and "solver 'sgd'" in r.errors[0] and "'adam'" in r.errors[0]
    r = cli("train", resume_net, "--resume", tmp_path / "nowhere")
    assert r.status == 2 and "no such file or folder" in r.errors[0]
    (tmp_path / "empty").mkdir()
    r = cli("train", resume_net, "--resume", tmp_path / "empty")
    assert r.status == 2 and "no checkpoint" in r.errors[0]
    # a torn file under a checkpoint's name (what a non-atomic writer leaves) is refused cleanly
    torn = tmp_path / "torn" / "checkpoints"
    torn.mkdir(parents=True)
    (torn / "iter_0000004.safetensors").write_bytes((run / "checkpoints" / "iter_0000004.safetensors")
                                                    .read_bytes()[:100])
    r = cli("train", resume_net, "--resume", tmp_path / "torn")
    assert r.status == 2 and "not a readable checkpoint" in r.errors[0]
    assert "Traceback" not in r.err


# ---------------------------------------------------------------------------------------------
# 3. SIGINT / SIGTERM
# ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_with_a_checkpoint_and_resume_continues(resume_net, tmp_path, signum):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "toolkit.cli", "train", str(resume_net), "--out", str(run),
           *sets(train__max_iter=100000, train__snapshot=100000, train__test_interval=100000)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, proc.kill)          # a hung child fails the test, never the suite
    watchdog.start()
    seen = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("iter 3 "):       # the loop is running, its handlers are in place
                break
        assert seen and seen[-1].startswith("iter 3 "), "".join(seen)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = "".join(seen) + err
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    m = re.search(rf"stopped by signal {int(signum)} after iteration (\d+)", err)
    assert m, err
    done = int(m.group(1))
    assert 4 <= done < 100000
    found = list_checkpoints(run / "checkpoints")
    assert [i for i, _ in found] == [done]                     # the signal's checkpoint, only it
    assert read_checkpoint(found[0][1]).iteration == done
    assert (run / "model.safetensors").is_file()
    assert_same_arrays({k: v for k, v in read_checkpoint(found[0][1]).arrays.items() if "@" not in k},
                       load_file(run / "model.safetensors"))
    logged = [r["iter"] for r in records(run) if "loss" in r]
    assert logged == list(range(done))

    # --resume continues to max_iter; the result equals a run that was never stopped
    end = done + 5
    train(resume_net, run, "--resume", run, *sets(train__max_iter=end, train__snapshot=100000,
                                                  train__test_interval=100000))
    assert [i for i, _ in list_checkpoints(run / "checkpoints")][-1] == end
    assert [r["iter"] for r in records(run) if "loss" in r] == list(range(end))
    ref = tmp_path / "ref"
    train(resume_net, ref, *sets(train__max_iter=end, train__snapshot=100000, train__test_interval=100000))
    assert_same_arrays(load_file(ref / "model.safetensors"), load_file(run / "model.safetensors"))
    ref_losses = [r["loss"] for r in records(ref) if "loss" in r]
    assert ref_losses == [r["loss"] for r in records(run) if "loss" in r]


# ---------------------------------------------------------------------------------------------
# 4. NaN guard
# ---------------------------------------------------------------------------------------------

NONFINITE = re.compile(r"^error: the (loss|weights) became (nan|inf|-inf|nan/inf) at iteration (\d+) .*"
                       r"training stopped and the last good checkpoint is (\S+)$")


def test_a_huge_learning_rate_stops_with_one_error_line(resume_net, tmp_path):
    run = tmp_path / "run"
    r = cli("train", resume_net, "--out", run, *sets(train__solver__base_lr=1e6, train__snapshot=1,
                                                     train__keep_last=100, train__display=1000))
    assert r.status == 2
    assert "Traceback" not in r.err
    assert len(r.errors) == 1, r.err
    m = NONFINITE.match(r.errors[0])
    assert m, r.errors[0]
    it, named = int(m.group(3)), Path(m.group(4))
    assert 1 <= it < 20
    # the named checkpoint is the newest, written before the failing iteration, and wholly finite
    found = list_checkpoints(run / "checkpoints")
    assert found and found[-1][1] == named and found[-1][0] == it
    ck = read_checkpoint(named)
    assert all(np.isfinite(v).all() for v in ck.arrays.values()), \
        [k for k, v in ck.arrays.items() if not np.isfinite(v).all()]
    assert not (run / "model.safetensors").exists()
    rec = records(run)                                 # (json.loads would accept NaN: check)
    assert rec and all(np.isfinite(x["loss"]) for x in rec if "loss" in x)
    assert max(x["iter"] for x in rec) < it + 1


def test_the_last_good_checkpoint_stays_untouched(resume_net, tmp_path):
    """The rate jumps from 0.1 to 1e6 at iteration 4; checkpoints 2 and 4 are those of a sane
    run, bit for bit, and nothing later is written."""
    sane, blow = tmp_path / "sane", tmp_path / "blow"
    common = sets(train__snapshot=2, train__keep_last=100, train__display=1000)
    train(resume_net, sane, *common, "--set", "train.solver.lr_policy={type: step, gamma: 1, step_size: 4}")
    r = cli("train", resume_net, "--out", blow, *common,
            "--set", "train.solver.lr_policy={type: step, gamma: 1e7, step_size: 4}")
    assert r.status == 2 and len(r.errors) == 1, r.err
    m = NONFINITE.match(r.errors[0])
    assert m, r.errors[0]
    found = list_checkpoints(blow / "checkpoints")
    assert [i for i, _ in found][:2] == [2, 4]
    assert found[-1][1] == Path(m.group(4))
    for i in (2, 4):
        a = read_checkpoint(blow / "checkpoints" / f"iter_{i:07d}.safetensors")
        b = read_checkpoint(sane / "checkpoints" / f"iter_{i:07d}.safetensors")
        assert_same_arrays(a.arrays, b.arrays)
        assert a.meta == b.meta
    for _, p in found:
        assert all(np.isfinite(v).all() for v in read_checkpoint(p).arrays.values())


# ---------------------------------------------------------------------------------------------
# 5. metrics.jsonl and the plot
# ---------------------------------------------------------------------------------------------

def test_metrics_are_the_batch_loss_before_the_update(softreg_net, tmp_path):
    run = tmp_path / "run"
    r = train(softreg_net, run, *sets(train__snapshot=1))
    net, spec, train_set, test_set, order = net_data(softreg_net)
    rec = records(run)
    steps = [x for x in rec if "loss" in x]
    assert [x["iter"] for x in steps] == list(range(10))
    for x in steps:
        assert set(x) >= {"iter", "loss", "lr", "xent"}
        assert x["lr"] == pytest.approx(0.05 * 0.5 ** (x["iter"] // 4), rel=1e-12)
        assert x["loss"] == pytest.approx(2 * x["xent"], rel=1e-6)     # loss_weight 2
    # the logged loss of iteration i is that of the weights *before* its update, on its batch
    weights = {0: net.init_weights(spec.seed, "float32")}
    for i in range(1, 11):
        weights[i] = read_checkpoint(run / "checkpoints" / f"iter_{i:07d}.safetensors").arrays
    for x in steps:
        i = x["iter"]
        batch = train_set.take(order.rows(i))
        before, _ = softmax_xent(weights[i], batch["data"], batch["label"])
        after, _ = softmax_xent(weights[i + 1], batch["data"], batch["label"])
        assert x["xent"] == pytest.approx(before, rel=1e-5, abs=1e-6), i
        assert abs(after - x["xent"]) > 1e-4, i          # (so the check above can tell them apart)

    # test metrics named after their tops ('xent' is also a train metric, so its test value is
    # 'test_xent'); a test pass at iteration i sees the weights after i updates
    tests = {x["iter"]: x for x in rec if "acc" in x}
    assert sorted(tests) == [4, 8, 10]
    assert "loss" not in tests[10] and "xent" not in tests[10]
    for i, x in tests.items():
        xent, acc = softmax_xent(weights[i], test_set.arrays["data"], test_set.arrays["label"])
        assert x["acc"] == pytest.approx(acc, abs=1e-6)
        assert x["test_xent"] == pytest.approx(xent, rel=1e-5)
    assert_same_arrays({k: v for k, v in weights[10].items() if "@" not in k}, load_file(run / "model.safetensors"))
    assert "acc" in r.out and "test_xent" in r.out


def test_display_logs_every_kth_iteration_and_tests(softreg_net, tmp_path):
    run = tmp_path / "run"
    train(softreg_net, run, *sets(train__display=3))
    assert [x["iter"] for x in records(run)] == [0, 3, 4, 6, 8, 9, 10]
    assert [x["iter"] for x in records(run) if "acc" in x] == [4, 8, 10]


def test_loss_plot_is_written(softreg_net, tmp_path):
    pytest.importorskip("matplotlib", reason="the loss plot needs matplotlib")
    PIL = pytest.importorskip("PIL.Image", reason="reading the plot back needs pillow")
    run = tmp_path / "run"
    train(softreg_net, run)
    png = run / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with PIL.open(png) as img:
        assert img.size[0] >= 200 and img.size[1] >= 100


# ---------------------------------------------------------------------------------------------
# 6. --set, --weights, toolkit test
# ---------------------------------------------------------------------------------------------

def test_set_overrides_scalar_nested_and_layer_by_name(softreg_net, tmp_path):
    run = tmp_path / "run"
    train(softreg_net, run, *sets(train__max_iter=7, train__solver__base_lr=0.123,
                                  train__solver__lr_policy__type="fixed", layers__ip1__num_output=6,
                                  train__snapshot=100))
    steps = [x for x in records(run) if "loss" in x]
    assert [x["iter"] for x in steps] == list(range(7))                       # scalar
    assert all(x["lr"] == pytest.approx(0.123, rel=1e-12) for x in steps)    # nested
    model = load_file(run / "model.safetensors")
    assert model["ip1.weight"].shape == (6, 16)                               # layer by name
    assert [i for i, _ in list_checkpoints(run / "checkpoints")] == [7]
    # a list index works like a name: layers.0 is ip1
    run2 = tmp_path / "run2"
    train(softreg_net, run2, *sets(train__max_iter=1, layers__0__num_output=5))
    assert load_file(run2 / "model.safetensors")["ip1.weight"].shape == (5, 16)


@pytest.mark.parametrize("item, expect", [
    ("train.solver.bogus=1", "unknown key 'bogus'"),
    ("train.solver.base_lr=abc", "base_lr"),
    ("train.solver.base_lr=-1", "base_lr"),
    ("layers.nosuch.num_output=3", "no layer named 'nosuch'"),
    ("layers.ip.num_output=3", "did you mean 'ip1'"),
    ("train.max_iter", "expected KEY=VALUE"),
    ("train.max_iter=[1", "not valid YAML"),
    ("layers.9.num_output=3", "out of range"),
    ("train.max_iter.x=3", "is a value"),
])
def test_bad_set_is_a_user_error(softreg_net, tmp_path, item, expect):
    r = cli("train", softreg_net, "--out", tmp_path / "run", "--set", item)
    assert r.status == 2
    assert "Traceback" not in r.err
    assert r.errors and any(expect in e for e in r.errors), r.err
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_weights_start_and_toolkit_test(softreg_net, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(softreg_net, a)
    trained = load_file(a / "model.safetensors")
    train(softreg_net, b, "--weights", a / "model.safetensors", *sets(train__max_iter=1))
    net, spec, train_set, test_set, order = net_data(softreg_net)
    batch = train_set.take(order.rows(0))
    xent, _ = softmax_xent(trained, batch["data"], batch["label"])
    first = records(b)[0]
    assert first["iter"] == 0 and first["xent"] == pytest.approx(xent, rel=1e-5)
    fresh, _ = softmax_xent(net.init_weights(spec.seed, "float32"), batch["data"], batch["label"])
    assert abs(fresh - xent) > 1e-3                       # so the check above tells them apart

    # toolkit test: JSON metrics over the test split, equal to the run's final record
    r = cli("test", softreg_net, "--weights", a / "model.safetensors")
    assert r.status == 0, r.err
    got = json.loads(r.out)
    assert got["examples"] == len(test_set) == 15
    x_ref, acc_ref = softmax_xent(trained, test_set.arrays["data"], test_set.arrays["label"])
    assert got["acc"] == pytest.approx(acc_ref, abs=1e-6)
    assert got["xent"] == pytest.approx(x_ref, rel=1e-5, abs=1e-6)
    final = records(a)[-1]
    assert final["iter"] == 10
    assert got["acc"] == pytest.approx(final["acc"], abs=1e-6)
    assert got["xent"] == pytest.approx(final["test_xent"], abs=2e-6)


def test_weights_and_test_errors(softreg_net, tmp_path):
    a = tmp_path / "a"
    train(softreg_net, a, *sets(train__max_iter=1))
    # weights of another shape
    r = cli("train", softreg_net, "--out", tmp_path / "b", "--weights", a / "model.safetensors",
            *sets(layers__ip1__num_output=5))
    assert r.status == 2 and any("ip1.weight" in e and "[4, 16]" in e for e in r.errors), r.err
    r = cli("train", softreg_net, "--out", tmp_path / "b", "--weights", tmp_path / "none.safetensors")
    assert r.status == 2 and "no such file" in r.errors[0]
    r = cli("test", softreg_net, "--weights", a / "model.safetensors", *sets(train__data__test_fraction=0))
    assert r.status == 2 and "no test split" in r.errors[0]
    assert "Traceback" not in r.err

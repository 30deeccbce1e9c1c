"""The everyday training workflows through the ``toolkit`` command: fine-tuning from another
model's weights with a new head, run folders that never overwrite each other, resuming from the
run folder alone, and a run you can watch (test metrics printed, the best weights kept, early
stopping, TensorBoard event files)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from tests.train.train_helpers import cli, sets
from toolkit.training.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[2]
LENET = (ROOT / "zoo" / "lenet" / "net.yaml").read_text()
ZOO_WEIGHTS = load_file(str(ROOT / "zoo" / "lenet" / "model.safetensors"))
SHORT = sets(train__max_iter=3, train__test_interval=1000, train__snapshot=1000)


@pytest.fixture
def lenet_with_new_head(tmp_path) -> Path:
    """LeNet with its classifier renamed (Caffe's idiom for a layer trained afresh)."""
    path = tmp_path / "finetune.yaml"
    path.write_text(LENET.replace("{name: ip2, type: InnerProduct", "{name: head, type: InnerProduct"))
    return path


# -- fine-tuning -----------------------------------------------------------------------------
def test_a_renamed_head_is_refused_without_allow_missing_naming_each_weight(lenet_with_new_head, tmp_path):
    r = cli("train", lenet_with_new_head, "--weights", "zoo:lenet", "--out", tmp_path / "run", *SHORT)
    assert r.status == 2 and "Traceback" not in r.err
    assert any("missing weight 'head.weight' of layer 'head', shape [10, 64]" in e for e in r.errors), r.err
    assert any("unexpected weight 'ip2.weight'" in e and "--allow-missing" in e for e in r.errors), r.err
    assert not (tmp_path / "run").exists()


def test_fine_tuning_copies_what_matches_and_starts_the_new_head_from_its_filler(lenet_with_new_head, tmp_path):
    run = tmp_path / "run"
    r = cli("train", lenet_with_new_head, "--weights", "zoo:lenet", "--allow-missing", "--out", run,
            *sets(train__max_iter=1, train__solver__base_lr=1e-12, train__solver__momentum=0,
                  train__solver__weight_decay=0, train__test_interval=1000))
    assert r.status == 0, r.err
    assert "copied 6 of the net's 8 arrays; 2 in the file ignored" in r.err
    table = [line.split() for line in r.err.splitlines() if line.startswith("  ")]
    assert ["head", "head.weight", "-", "[10,", "64]", "new:", "starts", "from", "its", "filler"] in table
    assert ["-", "ip2.weight", "[10,", "64]", "-", "not", "in", "the", "net:", "ignored"] in table
    trained = load_file(str(run / "model.safetensors"))
    # one step at a rate of 1e-12: the copied layers are the zoo's, the new head is not
    for key in ("conv1.weight", "conv2.bias", "ip1.weight"):
        np.testing.assert_allclose(trained[key], ZOO_WEIGHTS[key], rtol=0, atol=1e-9)
    assert trained["head.weight"].shape == (10, 64)
    assert not np.allclose(trained["head.weight"], ZOO_WEIGHTS["ip2.weight"], atol=1e-3)
    assert np.abs(trained["head.bias"]).max() < 1e-9          # InnerProduct's bias filler: constant 0
    assert json.loads((run / "history.jsonl").read_text().splitlines()[0])["weights"] == "zoo:lenet"


def test_a_reshaped_layer_names_the_layer_and_both_shapes(tmp_path):
    net = tmp_path / "narrow.yaml"
    net.write_text(LENET.replace("num_output: 64", "num_output: 32"))
    r = cli("train", net, "--weights", "zoo:lenet", "--out", tmp_path / "run", *SHORT)
    assert r.status == 2
    assert any("weight 'ip1.weight' of layer 'ip1' has shape [64, 128] in the file, the net needs [32, 128]" in e
               for e in r.errors), r.err
    r = cli("train", net, "--weights", "zoo:lenet", "--allow-missing", "--out", tmp_path / "run", *SHORT)
    assert r.status == 0, r.err
    assert "reshaped: starts from its filler" in r.err


def test_allow_missing_needs_weights_and_zoo_weights_work_for_infer(tmp_path):
    r = cli("train", ROOT / "zoo" / "lenet" / "net.yaml", "--allow-missing", "--out", tmp_path / "run", *SHORT)
    assert r.status == 2 and r.errors == ["error: --allow-missing goes with --weights FILE (the weights to copy from)"]
    np.save(tmp_path / "x.npy", np.zeros((2, 1, 8, 8), np.float32))
    r = cli("infer", ROOT / "zoo" / "lenet" / "net.yaml", "--weights", "zoo:lenet", "--input", tmp_path / "x.npy",
            "--output", tmp_path / "y.npy")
    assert r.status == 0, r.err
    assert np.load(tmp_path / "y.npy").shape == (2, 10)


# -- run folders -----------------------------------------------------------------------------
def test_a_second_run_of_a_net_gets_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    net = tmp_path / "lenet.yaml"
    net.write_text(LENET)
    assert cli("train", net, *SHORT).status == 0
    first = (Path("runs/lenet/model.safetensors")).read_bytes()
    r = cli("train", net, *SHORT, *sets(train__seed=1))
    assert r.status == 0, r.err
    assert "runs/lenet holds an earlier run; this run writes to runs/lenet-2" in r.err
    assert Path("runs/lenet/model.safetensors").read_bytes() == first
    assert Path("runs/lenet-2/model.safetensors").is_file()
    r = cli("train", net, "--out", "runs/lenet", *SHORT)
    assert r.status == 2 and r.errors == [
        "error: --out runs/lenet: holds a run already; continue it with `toolkit train --resume runs/lenet`, "
        "or choose another --out"]


@pytest.mark.parametrize("name", [".", ".."])
def test_a_net_named_like_a_path_component_is_refused(tmp_path, name):
    net = tmp_path / "dots.yaml"
    net.write_text(LENET.replace("name: lenet", f"name: '{name}'"))
    r = cli("train", net, *SHORT)
    assert r.status == 2
    assert r.errors == [f"{net}:2:7: error: bad 'name': value error, '{name}' cannot be a net's name: it names "
                        "the run folder runs/NAME"]


def test_resume_from_the_run_folder_alone_and_every_change_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    net = tmp_path / "lenet.yaml"
    net.write_text(LENET)
    assert cli("train", net, *sets(train__max_iter=4, train__test_interval=2, train__snapshot=2)).status == 0
    run = Path("runs/lenet")
    # the run's own net and settings: nothing to retype
    r = cli("train", "--resume", run, *sets(train__max_iter=6))
    assert r.status == 0, r.err
    assert "trained lenet for 6 iterations" in r.out
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert history[1] == {"iteration": 4, "set": ["train.max_iter=6"], "changed": {"train.max_iter": [4, 6]}}
    # the net file says otherwise (max_iter 1200, test_interval 200, snapshot 400): refused, named
    r = cli("train", net, "--resume", run)
    assert r.status == 2 and len(r.errors) == 1
    assert "the net differs from the one the run trained (train.max_iter: 6 -> 1200;" in r.errors[0]
    assert "name each change with --set KEY=VALUE" in r.errors[0]
    r = cli("train", net, "--resume", run, "--set", "train.solver.base_lr=0.01",
            *sets(train__max_iter=8, train__test_interval=2, train__snapshot=2))
    assert r.status == 0, r.err
    last = json.loads((run / "history.jsonl").read_text().splitlines()[-1])
    assert last["changed"] == {"train.solver.base_lr": [0.05, 0.01], "train.max_iter": [6, 8]}
    assert "base_lr: 0.01" in (run / "net.yaml").read_text()
    # a max_iter below where the run stands: refused, and metrics.jsonl never goes back
    before = (run / "metrics.jsonl").read_text()
    r = cli("train", "--resume", run, *sets(train__max_iter=5))
    assert r.status == 2 and "the run is at iteration 8 already and train.max_iter is 5" in r.errors[0]
    assert (run / "metrics.jsonl").read_text() == before
    iters = [json.loads(line)["iter"] for line in before.splitlines()]
    assert iters == sorted(iters)
    r = cli("train")
    assert r.status == 2 and "train needs a net file, or --resume RUN_DIR" in r.errors[0]


def test_a_checkpoint_of_another_net_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    net = tmp_path / "lenet.yaml"
    net.write_text(LENET)
    assert cli("train", net, *SHORT).status == 0
    other = tmp_path / "wide.yaml"
    other.write_text(LENET.replace("num_output: 64", "num_output: 48"))
    r = cli("train", other, "--resume", "runs/lenet/checkpoints", "--out", tmp_path / "fork",
            *SHORT, "--set", "layers.ip1.num_output=48")
    assert r.status == 2
    assert any("a checkpoint of net 'lenet': 'ip1.weight' has shape [64, 128], the net needs [48, 128]" in e
               for e in r.errors), r.err


def test_a_half_written_checkpoint_left_by_a_kill_is_swept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    net = tmp_path / "lenet.yaml"
    net.write_text(LENET)
    assert cli("train", net, *SHORT).status == 0
    stale = Path("runs/lenet/checkpoints/.iter_0000009.safetensors.k3x9a.safetensors")
    stale.write_bytes(b"\0" * 100)
    r = cli("train", "--resume", "runs/lenet", *sets(train__max_iter=4))
    assert r.status == 0, r.err
    assert not stale.exists() and f"removed {stale}" in r.err
    assert [it for it, _ in list_checkpoints(Path("runs/lenet/checkpoints"))] == [3, 4]


# -- a run you can watch ---------------------------------------------------------------------
def test_test_metrics_are_printed_and_the_best_weights_kept(tmp_path):
    run = tmp_path / "run"
    r = cli("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", run,
            *sets(train__max_iter=60, train__test_interval=20, train__solver__base_lr=0.5))
    assert r.status == 0, r.err
    tests = [line for line in r.err.splitlines() if line.startswith("test at iteration")]
    assert [line.split(":")[0] for line in tests] == [f"test at iteration {i}" for i in (20, 40, 60)]
    log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    accuracy = {rec["iter"]: rec["accuracy"] for rec in log if "accuracy" in rec}
    best_iter = max(accuracy, key=lambda i: (accuracy[i], -i))
    with safe_open(str(run / "best.safetensors"), framework="numpy") as f:
        meta = f.metadata()
    assert int(meta["iteration"]) == best_iter and float(meta["accuracy"]) == accuracy[best_iter]
    assert f"best accuracy {accuracy[best_iter]:.4f} at iteration {best_iter}" in r.out


def test_early_stopping_ends_the_run_when_the_metric_stops_improving(tmp_path):
    run = tmp_path / "run"
    # a rate far too high: the test loss climbs after the first test
    r = cli("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", run,
            *sets(train__max_iter=400, train__test_interval=10, train__solver__base_lr=2.0),
            "--set", "train.early_stop={metric: loss, patience: 2}")
    assert r.status == 0, r.err
    stop = [line for line in r.err.splitlines() if line.startswith("early stop at iteration")]
    assert len(stop) == 1 and "test_loss has not improved for 2 tests" in stop[0]
    done = int(stop[0].split()[4].rstrip(":"))
    assert done < 400 and f"trained lenet for {done} iterations" in r.out
    assert list_checkpoints(run / "checkpoints")[-1][0] == done
    r = cli("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", tmp_path / "r2",
            "--set", "train.early_stop={metric: recall, patience: 2}", *SHORT)
    assert r.status == 2 and r.errors == ["error: --set train.early_stop: the test phase measures no 'recall' "
                                          "(it measures: test_loss, accuracy)"]


def test_epochs_and_max_iter_together_are_an_error(tmp_path):
    r = cli("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", tmp_path / "run", *sets(train__epochs=2))
    assert r.status == 2 and len(r.errors) == 1
    assert "give max_iter or epochs, not both" in r.errors[0]


def _event_tags(path: Path) -> set[str]:
    """The scalar tags of a TensorBoard event file (its framing: length, crc, record, crc)."""
    from tensorboardX.proto import event_pb2
    data, pos, tags = path.read_bytes(), 0, set()
    while pos < len(data):
        (n,) = struct.unpack("<Q", data[pos:pos + 8])
        event = event_pb2.Event()
        event.ParseFromString(data[pos + 12:pos + 12 + n])
        tags |= {v.tag for v in event.summary.value}
        pos += 12 + n + 4
    return tags


def test_tensorboard_event_files(tmp_path):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra (tensorboardX) is not installed")
    run = tmp_path / "run"
    r = cli("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", run,
            *sets(train__max_iter=20, train__test_interval=10, train__display=5, train__tensorboard="true"))
    assert r.status == 0, r.err
    (events,) = (run / "tensorboard").iterdir()
    assert _event_tags(events) == {"loss", "lr", "test_loss", "accuracy"}


def test_a_layer_with_lr_mult_0_stays_as_copied(tmp_path):
    """Caffe's way to freeze a layer while fine-tuning the rest."""
    net = tmp_path / "frozen.yaml"
    net.write_text(LENET.replace("kernel_size: 3, pad: 1}", "kernel_size: 3, pad: 1, lr_mult: 0, decay_mult: 0}", 1))
    r = cli("train", net, "--weights", "zoo:lenet", "--out", tmp_path / "run", *sets(train__max_iter=20))
    assert r.status == 0, r.err
    trained = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert np.array_equal(trained["conv1.weight"], ZOO_WEIGHTS["conv1.weight"])
    assert np.array_equal(trained["conv1.bias"], ZOO_WEIGHTS["conv1.bias"])
    assert not np.array_equal(trained["conv2.weight"], ZOO_WEIGHTS["conv2.weight"])

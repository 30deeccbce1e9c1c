"""Checkpoints are atomic: a write that fails (a full disk, a failed rename, a crash inside a
run) leaves the previous checkpoint and model as they were, a leftover temporary is never
resumed from, keep_last keeps the K newest, and a file written atomically gets ordinary permissions."""
from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest
import safetensors.numpy as st_numpy
from safetensors.numpy import load_file

from tests.train.train_helpers import assert_same_arrays, sets, sha, train
from toolkit.cli import main
from toolkit.training.checkpoint import (
    Checkpoint,
    find_resume_point,
    list_checkpoints,
    read_checkpoint,
    write_checkpoint,
)

# ---------------------------------------------------------------------------------------------
# 2. checkpoints are atomic; keep_last
# ---------------------------------------------------------------------------------------------

def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"ip1.weight": rng.normal(size=(32, 16)).astype(np.float32),
            "ip1.weight@momentum": rng.normal(size=(32, 16)).astype(np.float32),
            "ip1.bias": rng.normal(size=(32,)).astype(np.float32)}


def _torn_save_file(tensors, filename, metadata=None):
    """Writes half a file, then fails as a full disk would."""
    with open(filename, "wb") as f:
        f.write(b"\x00" * 64)
        f.flush()
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("failure", ["save_file", "os.replace"])
def test_a_failed_checkpoint_write_leaves_the_previous_one(tmp_path, monkeypatch, failure):
    folder = tmp_path / "checkpoints"
    meta = {"net": "x", "solver": "sgd", "rng": np.random.default_rng(0).bit_generator.state}
    first = write_checkpoint(folder, Checkpoint(4, _state(0), meta), keep_last=1)
    before = sha(first)
    if failure == "save_file":
        monkeypatch.setattr(st_numpy, "save_file", _torn_save_file)
    else:
        def bad_replace(src, dst):
            raise OSError(5, "Input/output error")
        monkeypatch.setattr("toolkit.fileio.os.replace", bad_replace)
    with pytest.raises(OSError):
        write_checkpoint(folder, Checkpoint(8, _state(1), meta), keep_last=1)
    # keep_last=1 must not have removed the previous checkpoint for a write that failed, and no
    # file of the failed write (neither iter_0000008 nor its temporary) is left behind
    assert sorted(p.name for p in folder.iterdir()) == [first.name]
    assert sha(first) == before
    monkeypatch.undo()
    back = read_checkpoint(first)
    assert back.iteration == 4 and back.meta == json.loads(json.dumps(meta))
    assert_same_arrays(back.arrays, _state(0))
    assert find_resume_point(str(tmp_path)) == first


def test_a_crash_during_a_training_checkpoint_then_resume(resume_net, tmp_path, monkeypatch):
    """Inside a run: the checkpoint at 8 fails half written; the one at 4 is intact and resuming
    from it reaches exactly the state of an uninterrupted run."""
    full, run = tmp_path / "full", tmp_path / "run"
    train(resume_net, full, *sets(train__max_iter=12))
    real = st_numpy.save_file
    calls = []

    def flaky(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:                      # the second write is the checkpoint at 8
            _torn_save_file(tensors, filename, metadata)
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(st_numpy, "save_file", flaky)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["train", str(resume_net), "--out", str(run), "--set", "train.max_iter=12"])
    monkeypatch.undo()
    assert status == 2                                         # the machine's fault: a clear line, no traceback
    assert err.getvalue().splitlines()[-1].startswith("error: ") and "Traceback" not in err.getvalue()
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["iter_0000004.safetensors"]              # no iter_0000008, no temporary file
    assert not (run / "model.safetensors").exists()
    assert_same_arrays(read_checkpoint(run / "checkpoints" / names[0]).arrays,
                       read_checkpoint(full / "checkpoints" / names[0]).arrays)
    train(resume_net, run, "--resume", run, *sets(train__max_iter=12))
    assert_same_arrays(load_file(full / "model.safetensors"), load_file(run / "model.safetensors"))


def test_a_failed_model_write_keeps_the_old_model(tmp_path, monkeypatch):
    from toolkit.weights import save_weights
    target = tmp_path / "model.safetensors"
    save_weights(str(target), _state(0))
    before = sha(target)
    monkeypatch.setattr(st_numpy, "save_file", _torn_save_file)
    with pytest.raises(OSError):
        save_weights(str(target), _state(1))
    monkeypatch.undo()
    assert sha(target) == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    assert_same_arrays(load_file(target), _state(0))


def test_leftover_temporary_files_are_not_checkpoints(tmp_path):
    """What a kill -9 between write and rename leaves (a hidden temporary) is never resumed from."""
    folder = tmp_path / "checkpoints"
    meta = {"net": "x", "solver": "sgd", "rng": np.random.default_rng(0).bit_generator.state}
    good = write_checkpoint(folder, Checkpoint(4, _state(0), meta), keep_last=3)
    (folder / ".iter_0000008.safetensors.k3j2h1.safetensors").write_bytes(b"\x00" * 10)
    assert [i for i, _ in list_checkpoints(folder)] == [4]
    assert find_resume_point(str(tmp_path)) == good
    assert find_resume_point(str(folder)) == good
    assert find_resume_point(str(good)) == good


@pytest.mark.parametrize("keep", [1, 3])
def test_keep_last_leaves_the_k_newest(resume_net, tmp_path, keep):
    run = tmp_path / "run"
    train(resume_net, run, *sets(train__max_iter=12, train__snapshot=2, train__keep_last=keep))
    kept = [i for i, _ in list_checkpoints(run / "checkpoints")]
    assert kept == [2, 4, 6, 8, 10, 12][-keep:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        [f"iter_{i:07d}.safetensors" for i in kept]


def test_written_files_get_ordinary_permissions(tmp_path):
    """Atomic writes go through a private temporary file; the result must not stay private."""
    from toolkit.weights import save_weights
    old = os.umask(0o022)
    try:
        save_weights(str(tmp_path / "w.safetensors"), _state(0))
    finally:
        os.umask(old)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o644

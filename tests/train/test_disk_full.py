"""A write that fails (a full disk; here a file-size limit, under which writes fail with EFBIG as
they would with ENOSPC) is one line naming the file, exit status 2, and what was there before
stays: checkpoints, the model, the metrics log, infer's output."""
from __future__ import annotations

import errno
import hashlib
import os

import numpy as np
import pytest

from tests.bounded import ROOT, run_toolkit
from toolkit.fileio import append_line

LENET = ROOT / "zoo" / "lenet" / "net.yaml"


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_checkpoint_that_cannot_be_written_stops_training_and_names_it(tmp_path):
    run = tmp_path / "run"
    first = run_toolkit("train", LENET, "--out", run, "--set", "train.max_iter=40", "--set", "train.snapshot=20")
    assert first.status == 0, first.err
    kept = {p.name: digest(p) for p in [run / "model.safetensors", *sorted((run / "checkpoints").iterdir())]}
    metrics = (run / "metrics.jsonl").read_text()
    # a checkpoint is 111 kB, the model 55 kB: the resumed run's next checkpoint cannot be written
    r = run_toolkit("train", LENET, "--out", run, "--resume", run, "--set", "train.max_iter=80",
                    "--set", "train.snapshot=20", file_kb=64)
    said = [line for line in r.lines if not line.startswith("compiling kernels ")]    # progress, not the error
    assert r.status == 2 and said == [
        f"error: {run / 'checkpoints' / 'iter_0000060.safetensors'}: File too large; training stopped and the last "
        f"good checkpoint is {run / 'checkpoints' / 'iter_0000040.safetensors'}"], r.err
    assert {p.name: digest(p) for p in [run / "model.safetensors", *sorted((run / "checkpoints").iterdir())]} == kept
    assert not [p for p in run.rglob(".*") if p.is_file()]                 # no temporary file left
    assert all(line.startswith("{") and line.endswith("}") for line in (run / "metrics.jsonl").read_text().splitlines())
    assert (run / "metrics.jsonl").read_text() in metrics                   # the resume point's records only


def test_an_output_that_cannot_be_written_is_named_and_the_old_one_kept(tmp_path):
    data = tmp_path / "held.npz"
    assert run_toolkit("data", LENET, "--split", "test", "--out", data).status == 0
    out = tmp_path / "prob.npz"
    out.write_bytes(b"the previous output")
    r = run_toolkit("infer", "zoo:lenet", "--input", data, "--output", out, file_kb=4)
    errors = [line for line in r.lines if not line.startswith("inputs are transformed as in training")]
    assert r.status == 2 and errors == [f"error: {out}: File too large"], r.err
    assert out.read_bytes() == b"the previous output" and sorted(os.listdir(tmp_path)) == ["held.npz", "prob.npz"]


def test_an_append_cut_short_is_undone(tmp_path, monkeypatch):
    """The metrics log takes whole lines only: a short write (the disk filled during it) is cut
    back, and the error names the file."""
    log = tmp_path / "metrics.jsonl"
    append_line(log, '{"iter": 0}')
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:5]))
    with pytest.raises(OSError) as info:
        append_line(log, '{"iter": 1, "loss": 0.5}')
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(log)
    monkeypatch.undo()
    assert log.read_text() == '{"iter": 0}\n'
    append_line(log, '{"iter": 1}')
    assert log.read_text().splitlines() == ['{"iter": 0}', '{"iter": 1}']
    assert np.array_equal(np.frombuffer(log.read_bytes()[-1:], np.uint8), [10])

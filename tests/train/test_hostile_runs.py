"""Run folders that try to harm a resume: a FIFO in place of a checkpoint, net.yaml, metrics.jsonl
or history.jsonl, a checkpoints/ that links to another run's, checkpoints whose metadata lies
(an iteration 'abc', no generator state, a best-model state of another type), a metrics line
that is not a record, a net.yaml that is not YAML or expands without bound. Each ends within
seconds in one `error:` line, exit 2, in bounded memory, and nothing outside the run is touched."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from tests.bounded import ROOT, run_toolkit
from tests.train.train_helpers import cli, sets

LENET = (ROOT / "zoo" / "lenet" / "net.yaml").read_text()
MEMORY_MB = 1000
SHORT = sets(train__max_iter=4, train__test_interval=2, train__snapshot=2)
ON = sets(train__max_iter=8, train__test_interval=2, train__snapshot=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A LeNet run of 4 iterations with checkpoints at 2 and 4, trained once for the module."""
    folder = tmp_path_factory.mktemp("trained")
    (folder / "lenet.yaml").write_text(LENET)
    r = cli("train", folder / "lenet.yaml", "--out", folder / "run", *SHORT)
    assert r.status == 0, r.err
    return folder / "run"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run, to spoil."""
    shutil.copytree(trained, tmp_path / "run", symlinks=True)
    (tmp_path / "lenet.yaml").write_text(LENET)
    return tmp_path / "run"


def resume(run: Path, *extra, net: bool = False):
    """``toolkit train [lenet.yaml] --resume run`` from the run's parent folder (so that the
    messages name run/...), training on to iteration 8."""
    args = ["train", *(["lenet.yaml"] if net else []), "--resume", run.name, *ON, *extra]
    return run_toolkit(*args, memory_mb=MEMORY_MB, timeout=30, cwd=run.parent)


def refused(r, *said: str) -> None:
    assert r.status == 2 and len(r.lines) == 1 and r.lines[0].startswith("error: "), r.err
    assert all(s in r.lines[0] for s in said), r.err
    assert r.seconds < 30


def newest(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("iter_*.safetensors"))[-1]


def edit_checkpoint(path: Path, **changes) -> None:
    """Rewrite a checkpoint with some of its metadata changed: a key of ``meta`` (the JSON) set,
    or removed where the value is None; 'iteration' is the file's own field."""
    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
    about = json.loads(meta["meta"])
    for key, value in changes.items():
        if key == "iteration":
            meta["iteration"] = value
        elif value is None:
            about.pop(key)
        else:
            about[key] = value
    meta["meta"] = json.dumps(about)
    save_file(load_file(str(path)), str(path), metadata=meta)


@pytest.mark.parametrize("name, net", [("net.yaml", False), ("net.yaml", True), ("metrics.jsonl", False),
                                       ("history.jsonl", False), ("newest checkpoint", False)])
def test_a_fifo_in_the_run_is_refused_at_once(run, name, net):
    target = run / "checkpoints" / "iter_0000006.safetensors" if name == "newest checkpoint" else run / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    refused(resume(run, net=net), f"{target.relative_to(run.parent)}: is not a regular file (it is a FIFO)")


def test_checkpoints_linked_to_another_runs_are_refused_and_that_run_keeps_its_own(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    kept = sorted(p.name for p in (other / "checkpoints").iterdir())
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(other / "checkpoints")
    r = resume(run, "--set", "train.keep_last=1")
    refused(r, "run/checkpoints: a symbolic link; a run keeps its checkpoints in its own folder")
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == kept


def test_a_run_file_linked_elsewhere_is_refused_and_not_written_through(run, tmp_path):
    elsewhere = tmp_path / "notes.txt"
    elsewhere.write_text("mine\n")
    (run / "history.jsonl").unlink()
    (run / "history.jsonl").symlink_to(elsewhere)
    refused(resume(run), "run/history.jsonl: a symbolic link")
    assert elsewhere.read_text() == "mine\n"


@pytest.mark.parametrize("changes, said", [
    ({"iteration": "abc"}, "its iteration 'abc' is not a whole number"),
    ({"rng": None}, "it holds no random generator state"),
    ({"rng": {"bit_generator": "PCG64", "state": 3}}, "its random generator state is not one numpy's PCG64 takes"),
    ({"watch": {"best": "x"}}, "its 'watch.best' is not a mapping"),
    ({"watch": {"best": {"best": "x", "best_iter": 2}}}, "its 'watch.best.best' is \"x\", not a number"),
    ({"watch": {"early_stop": {"since": -1}}}, "its 'watch.early_stop.since' is -1, not a whole number"),
    ({"watch": [1]}, "its 'watch' (the best-model and early-stop states) is not a mapping"),
])
def test_a_checkpoint_whose_metadata_lies_is_refused_naming_the_field(run, changes, said):
    path = newest(run)
    edit_checkpoint(path, **changes)
    refused(resume(run), f"run/checkpoints/{path.name}: not a readable checkpoint ({said}")


def test_metrics_lines_that_are_no_records_are_dropped_and_the_run_goes_on(run):
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'[1, 2]\n7\n{"iter": "abc"}\n\xff\xfe not UTF-8\n')
    r = resume(run)
    assert r.status == 0, r.err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(rec, dict) and isinstance(rec["iter"], int) for rec in records)
    assert [rec["iter"] for rec in records if "test_loss" in rec] == [2, 4, 6, 8]


def test_a_recorded_net_that_is_not_yaml_is_located(run):
    (run / "net.yaml").write_text("name: [lenet\n")
    r = resume(run, net=True)
    assert r.status == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith("run/net.yaml:2:1: error: YAML syntax:"), r.err


def test_a_recorded_net_of_aliases_that_expand_without_bound_is_refused(run):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    with open(run / "net.yaml", "a") as f:
        f.write("\n".join(lines) + "\n")
    r = resume(run, net=True)
    assert r.status == 2 and len(r.lines) == 1 and r.seconds < 30, r.err[:2000]
    assert r.lines[0].startswith("run/net.yaml:1:1: error: the YAML expands to more than"), r.err[:2000]

"""A data-parallel run chooses its folder once: rank 0 looks at the disk (a named ``--out`` that
holds a run is refused, the default ``runs/NAME`` moves on to ``runs/NAME-K``) and tells the
other ranks, which never look for themselves. A rank that looked for itself after rank 0 had begun
writing the folder refused it as another run's ("holds a run already"), about one job in four.

Checked three ways: with a stand-in communicator (rank 1 of 2, rank 0's run already on disk), by
many folder choices in a row under ``mpiexec -n 2`` and ``-n 3`` where the ranks other than 0 are
made late on purpose, and by real ``toolkit train`` jobs under both launchers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_helpers import HAVE_MPI, MPIEXEC, ROOT, TOOLKIT  # noqa: F401

from toolkit.distributed.comm import Solo
from toolkit.errors import UserError
from toolkit.training.start import choose_run_folder

needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="the dist extra (mpi4py and an MPI wheel) is not installed")


class LateRank(Solo):
    """Rank 1 of 2, reached after rank 0 decided ``decided`` and began writing there."""
    rank, size = 1, 2

    def __init__(self, decided):
        super().__init__()
        self.decided = decided

    def share(self, value):
        assert value is None            # only rank 0's value counts: this rank has none to give
        return self.decided


def _start_run(folder: Path) -> None:
    """What rank 0 writes first into a new run's folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "net.yaml").write_text("name: net\n")


def test_a_late_rank_takes_rank_0s_folder_even_when_it_holds_rank_0s_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _start_run(tmp_path / "out")
    assert choose_run_folder("net", "out", LateRank(("out", None, []))) == (Path("out"), None)
    _start_run(tmp_path / "runs" / "net")
    notice = "runs/net holds an earlier run; this run writes to runs/net-2"
    assert choose_run_folder("net", None, LateRank(("runs/net-2", notice, []))) == (Path("runs/net-2"), notice)
    with pytest.raises(UserError, match="holds a run already") as e:      # rank 0's refusal, on every rank
        choose_run_folder("net", "out", LateRank((None, None, UserError("--out out: holds a run already").problems)))
    assert len(e.value.problems) == 1
    # one process: the disk decides, as before
    with pytest.raises(UserError, match="--out out: holds a run already"):
        choose_run_folder("net", "out", None)
    assert choose_run_folder("net", None, None)[0] == Path("runs/net-2")


# Each rank chooses ROUNDS folders in a row; rank 0 starts writing each one at once, and the other
# ranks come late (as a rank does whose imports or compile took longer), so that a rank that looked
# at the disk itself would find rank 0's run there every time.
CHOOSER = r"""
import json, sys, time
from pathlib import Path
from toolkit.distributed.launcher import world
from toolkit.errors import UserError
from toolkit.training.start import choose_run_folder
comm = world()
rounds = int(sys.argv[1])
chosen = []
for k in range(rounds):
    if comm.rank:
        time.sleep(0.02)
    out = f"named/{k}" if k % 2 else None
    try:
        folder, notice = choose_run_folder("net", out, comm)
    except UserError as e:
        chosen.append(f"refused: {e}")
        continue
    if comm.rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "net.yaml").write_text("name: net\n")
    chosen.append(str(folder))
# a file per rank: the launcher forwards the ranks' stdout with lines of two ranks run together
Path(f"answer-{comm.rank}.json").write_text(json.dumps(chosen))
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_"))}


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_gets_rank_0s_folder_many_times_in_a_row(tmp_path, ranks):
    rounds = 40
    proc = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, "-c", CHOOSER, str(rounds)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**_clean_env(), "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    answers = {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in tmp_path.glob("answer-*.json")}
    # the default folder moves on each time (rank 0's run is there); a named one is each round's own
    expected = [f"named/{k}" if k % 2 else ("runs/net" if k == 0 else f"runs/net-{k // 2 + 1}") for k in range(rounds)]
    assert sorted(answers) == list(range(ranks))
    for rank, chosen in answers.items():
        assert chosen == expected, (rank, [c for c, e in zip(chosen, expected) if c != e][:3])


def _train(cwd: Path, ranks: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(MPIEXEC), "-n", str(ranks), *TOOLKIT, "train", str(ROOT / "zoo" / "mlp" / "net.yaml"),
           "--set", "train.max_iter=2", "--set", "train.test_interval=2", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**_clean_env(), "PYTHONPATH": str(ROOT)})


@needs_mpi
def test_toolkit_train_under_mpiexec_takes_a_named_folder_once(tmp_path):
    named = _train(tmp_path, 3, "--out", "named")
    assert named.returncode == 0, named.stderr[-2000:]
    assert "data-parallel over 3 ranks" in named.stderr
    assert (tmp_path / "named" / "model.safetensors").is_file()
    again = _train(tmp_path, 3, "--out", "named")              # refused, for every rank by rank 0
    assert again.returncode == 2 and "holds a run already; continue it with" in again.stderr, again.stderr[-2000:]
    assert "Traceback" not in again.stderr


@needs_mpi
def test_toolkit_train_under_mpiexec_moves_past_an_earlier_run_once(tmp_path):
    (tmp_path / "runs" / "mlp").mkdir(parents=True)
    (tmp_path / "runs" / "mlp" / "metrics.jsonl").write_text("")        # an earlier run
    default = _train(tmp_path, 2)
    assert default.returncode == 0, default.stderr[-2000:]
    assert "data-parallel over 2 ranks" in default.stderr
    assert default.stderr.count("runs/mlp holds an earlier run; this run writes to runs/mlp-2") == 1
    assert (tmp_path / "runs" / "mlp-2" / "model.safetensors").is_file()
    assert not (tmp_path / "runs" / "mlp-3").exists()

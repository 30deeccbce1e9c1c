"""Data-parallel training under `mpiexec` (docs/spec.md section 8), started by the tests themselves: K
ranks at batch B give the weights and every logged loss of one process at K x B (2 ranks, and 3
so that the split is uneven and the last short batch leaves a rank without rows), BatchNorm with
sync_batchnorm included; resume under mpiexec is bit-exact; a rank killed with SIGKILL stops the
job. Each run is a few dozen iterations of the zoo's digit nets."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_helpers import HAVE_MPI, MPIEXEC, ROOT, TOOLKIT  # noqa: F401
from safetensors.numpy import load_file

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="the dist extra (mpi4py and an MPI wheel) is not installed")


def train(out: Path, net: str, batch: int, ranks: int = 1, *sets: str, check=True) -> subprocess.CompletedProcess:
    cmd = [*TOOLKIT, "train", net, "--out", str(out), "--set", f"train.data.batch_size={batch}",
           "--set", "train.display=1", *[a for s in sets for a in ("--set", s)]]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_"))}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def losses(run: Path) -> list[tuple[int, float]]:
    return [(r["iter"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def assert_same_training(one: Path, many: Path, rtol: float = 1e-5) -> None:
    a, b = load_file(str(one / "model.safetensors")), load_file(str(many / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        scale = np.abs(a[k]).max() + 1e-12
        assert np.abs(a[k] - b[k]).max() / scale < rtol, k
    la, lb = losses(one), losses(many)
    assert [i for i, _ in la] == [i for i, _ in lb] and len(la) > 20
    for (i, x), (_, y) in zip(la, lb):
        assert abs(x - y) <= rtol * abs(x), (i, x, y)


@pytest.mark.parametrize("ranks,batch", [(2, 32), (3, 21)])
def test_k_ranks_give_one_process_at_k_times_the_batch(tmp_path, ranks, batch):
    # 1438 training rows: the 23rd global batch is short (30 rows at 64: rank 1 gets none;
    # 52 at 63: rank 2 gets 10), and 30 iterations run into the second epoch
    sets = ("train.max_iter=30", "train.test_interval=15")
    train(tmp_path / "one", "zoo/lenet/net.yaml", ranks * batch, 1, *sets)
    proc = train(tmp_path / "many", "zoo/lenet/net.yaml", batch, ranks, *sets)
    assert f"data-parallel over {ranks} ranks" in proc.stderr
    assert_same_training(tmp_path / "one", tmp_path / "many")
    one = [json.loads(r) for r in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    many = [json.loads(r) for r in (tmp_path / "many" / "metrics.jsonl").read_text().splitlines()]
    tests_one = [r["accuracy"] for r in one if "accuracy" in r]
    tests_many = [r["accuracy"] for r in many if "accuracy" in r]
    assert len(tests_one) == 2 and np.allclose(tests_one, tests_many, rtol=0, atol=1e-6)   # float32 per-batch means


def test_sync_batchnorm_gives_one_process_with_batchnorm(tmp_path):
    sets = ("train.max_iter=8",)
    train(tmp_path / "one", "zoo/resnet/net.yaml", 32, 1, *sets)
    train(tmp_path / "many", "zoo/resnet/net.yaml", 16, 2, *sets, "train.distributed.sync_batchnorm=true")
    a = load_file(str(tmp_path / "one" / "model.safetensors"))
    assert any("running_mean" in k for k in a)       # the running statistics are compared too
    la = losses(tmp_path / "one")
    assert len(la) == 8
    for (_, x), (_, y) in zip(la, losses(tmp_path / "many")):
        assert abs(x - y) <= 1e-5 * abs(x)
    b = load_file(str(tmp_path / "many" / "model.safetensors"))
    for k in a:
        assert np.abs(a[k] - b[k]).max() / (np.abs(a[k]).max() + 1e-12) < 1e-5, k


def test_resume_under_mpiexec_is_bit_exact(tmp_path):
    sets = ("train.max_iter=30", "train.snapshot=15")
    train(tmp_path / "whole", "zoo/lenet/net.yaml", 32, 2, *sets)
    train(tmp_path / "part", "zoo/lenet/net.yaml", 32, 2, *sets)
    ckpt = tmp_path / "part" / "checkpoints"
    from toolkit.training.checkpoint import PATTERN
    for extra in [p for p in ckpt.iterdir() if int(PATTERN.match(p.name).group(1)) != 15]:
        extra.unlink()                       # back to iteration 15
    proc = subprocess.run([str(MPIEXEC), "-n", "2", *TOOLKIT, "train", "zoo/lenet/net.yaml", "--resume",
                           str(tmp_path / "part"), "--set", "train.data.batch_size=32", "--set", "train.display=1",
                           *[a for s in sets for a in ("--set", s)]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "model.safetensors"))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def long_job(out: Path, snapshot: int, written) -> tuple[subprocess.Popen, list[str]]:
    """A 2-rank run of 100,000 iterations, returned once ``written(out)`` holds (at most 120 s),
    with the list its stderr lines arrive in."""
    cmd = [str(MPIEXEC), "-n", "2", *TOOLKIT, "train", "zoo/lenet/net.yaml", "--out", str(out),
           "--set", "train.data.batch_size=32", "--set", "train.max_iter=100000", "--set", f"train.snapshot={snapshot}"]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)     # its own process group, for the kill below
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True).start()
    deadline = time.monotonic() + 120
    while not written(out) and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    return job, lines


def finish(job: subprocess.Popen, lines: list[str]) -> str:
    """The job's output once it has ended (killed, and the test failed, if it has not within
    60 s: a job whose ranks disagree about stopping hangs in a collective)."""
    try:
        job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        pytest.fail("the job did not end within 60 s of the signal:\n" + "".join(lines)[-2000:])
    time.sleep(0.2)                        # the reader's last lines
    return "".join(lines)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rank supervision uses Linux's parent-death signal")
def test_a_killed_rank_stops_the_job_naming_it(tmp_path):
    out = tmp_path / "killed"
    job, lines = long_job(out, 50, lambda out: any((out / "checkpoints").glob("*")))
    pids = re.search(r"rank 0 pid (\d+), rank 1 pid (\d+)", "".join(lines))
    assert pids, lines
    os.kill(int(pids.group(2)), signal.SIGKILL)             # the rank the job's first line names
    killed = time.monotonic()
    said = finish(job, lines)
    assert time.monotonic() - killed < 60 and job.returncode != 0, said[-2000:]
    assert f"error: rank 1 of 2 (pid {pids.group(2)}) was killed by SIGKILL" in said, said[-2000:]
    # no rank outlives the job (one whose parent died may stay a zombie until init reaps it)
    time.sleep(0.5)
    assert not [p for p in pids.groups() if _running(int(p))]
    # the last checkpoint and metrics.jsonl stay whole
    from toolkit.training.checkpoint import find_resume_point, read_checkpoint
    assert read_checkpoint(find_resume_point(str(out))).iteration % 50 == 0
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line)


def test_toolkit_test_shares_the_test_set_out(tmp_path):
    train(tmp_path / "run", "zoo/lenet/net.yaml", 64, 1, "train.max_iter=20")
    weights = str(tmp_path / "run" / "model.safetensors")
    one = subprocess.run([*TOOLKIT, "test", "zoo/lenet/net.yaml", "--weights", weights], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    many = subprocess.run([str(MPIEXEC), "-n", "3", *TOOLKIT, "test", "zoo/lenet/net.yaml", "--weights", weights],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert one.returncode == 0 and many.returncode == 0, many.stderr
    a, b = json.loads(one.stdout), json.loads(many.stdout)       # one line: rank 0's
    assert a["examples"] == b["examples"] == 359
    for k in ("loss", "accuracy"):
        assert abs(a[k] - b[k]) < 1e-5, (k, a, b)


def test_ctrl_c_to_the_launcher_checkpoints_once_and_exits(tmp_path):
    out = tmp_path / "stopped"
    job, lines = long_job(out, 100000, lambda out: (out / "metrics.jsonl").exists())
    time.sleep(1.0)
    job.send_signal(signal.SIGINT)
    said = finish(job, lines)
    assert job.returncode == 130, said[-2000:]
    assert said.count("stopped by signal 2") == 1                      # rank 0 alone says it
    from toolkit.training.checkpoint import find_resume_point, read_checkpoint
    ckpts = list((out / "checkpoints").iterdir())
    assert len(ckpts) == 1 and read_checkpoint(find_resume_point(str(out))).iteration > 0


def test_resume_under_another_rank_count_continues_at_the_same_sample(tmp_path):
    train(tmp_path / "run", "zoo/lenet/net.yaml", 32, 2, "train.max_iter=16", "train.snapshot=8")
    # 16 global batches of 64 rows = 1024 samples = 32 batches of one process at 32
    proc = subprocess.run([*TOOLKIT, "train", "zoo/lenet/net.yaml", "--resume", str(tmp_path / "run"),
                           "--set", "train.data.batch_size=32", "--set", "train.max_iter=40",
                           "--set", "train.display=1", "--set", "train.snapshot=8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    iters = [i for i, _ in losses(tmp_path / "run")]
    assert iters[:16] == list(range(16)) and iters[16:] == list(range(32, 40)), iters


def test_a_rank_that_fails_stops_the_job_naming_the_rank(tmp_path):
    start = time.monotonic()
    proc = subprocess.run([str(MPIEXEC), "-n", "2", *TOOLKIT, "train", "zoo/lenet/net.yaml",
                           "--out", str(tmp_path / "x"), "--weights", str(tmp_path / "missing.safetensors")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60 and proc.returncode == 2, proc.stderr
    assert re.search(r"^error: rank [01] of 2: .*missing\.safetensors", proc.stderr, re.M), proc.stderr
    assert "Traceback" not in proc.stderr

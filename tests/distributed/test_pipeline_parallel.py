"""Pipeline-parallel training under `mpiexec` (docs/spec.md section 8), started by the tests
themselves: K stages with M micro-batches give the weights and every logged loss of one process
at the same batch over 30 steps (LeNet and an MLP, K = 2 and 3, M = 1, 2 and 4, GPipe and 1F1B), rank 0 writes
the whole model, each rank holds its stage's weights, a killed rank stops the job, and what a
pipeline cannot do ends the job with one line and exit 2."""
from __future__ import annotations

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
from test_data_parallel import _running, assert_same_training, finish, train

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="the dist extra (mpi4py and an MPI wheel) is not installed")

MLP = """
name: mlp
inputs:
  data:  {shape: [N, 1, 8, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 128}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 128}
  - {name: relu2, type: ReLU, bottom: ip2, top: ip2}
  - {name: ip3, type: InnerProduct, bottom: ip2, top: ip3, num_output: 128}
  - {name: relu3, type: ReLU, bottom: ip3, top: ip3}
  - {name: ip4, type: InnerProduct, bottom: ip3, top: ip4, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip4, label], top: loss, phase: train}
train:
  data: {source: "builtin:digits"}
  solver: {type: sgd, base_lr: 0.05, momentum: 0.9, weight_decay: 0.0005}
"""


def net_file(name: str, tmp_path: Path) -> str:
    if name == "mlp":
        path = tmp_path / "mlp.yaml"
        path.write_text(MLP)
        return str(path)
    return "zoo/lenet/net.yaml"


# 1438 training rows: at batch 32 the 45th batch is the epoch's last, 30 rows, which 4
# micro-batches do not divide (it runs as 3); 50 iterations run past it
# K = 2 and 3, both schedules, in the whole suite; the other mixes are the longer run (make test-slow)
@pytest.mark.parametrize("net,stages,micro,steps,schedule", [
    ("lenet", 2, 2, 30, "gpipe"), pytest.param("lenet", 2, 4, 50, "gpipe", marks=pytest.mark.slow),
    pytest.param("mlp", 2, 4, 30, "gpipe", marks=pytest.mark.slow), ("mlp", 3, 2, 30, "gpipe"),
    pytest.param("lenet", 2, 1, 30, "gpipe", marks=pytest.mark.slow),
    pytest.param("lenet", 2, 8, 30, "gpipe", marks=pytest.mark.slow), ("lenet", 2, 4, 50, "1f1b"),
    ("mlp", 3, 4, 30, "1f1b")])
def test_k_stages_give_one_process_at_the_same_batch(tmp_path, net, stages, micro, steps, schedule):
    path = net_file(net, tmp_path)
    sets = (f"train.max_iter={steps}",)
    train(tmp_path / "one", path, 32, 1, *sets)
    proc = train(tmp_path / "many", path, 32, stages, *sets, f"train.distributed.stages={stages}",
                 f"train.distributed.micro_batches={micro}", f"train.distributed.schedule={schedule}")
    said = re.search(rf"pipeline of {stages} stages, {micro} micro-batches \({schedule}, bubble ([\d.]+)",
                     proc.stderr)
    assert said and float(said.group(1)) == pytest.approx((stages - 1) / (micro + stages - 1), abs=0.005)
    assert_same_training(tmp_path / "one", tmp_path / "many")
    # the whole model, checkpoint included, though each rank held a part
    ckpt = load_file(str(next((tmp_path / "many" / "checkpoints").iterdir())))
    assert {k for k in ckpt if k.endswith("@momentum")} == {f"{k}@momentum" for k in
                                                           load_file(str(tmp_path / "one" / "model.safetensors"))}


def test_rank_0_names_the_stages_consecutive_runs_of_layers_covering_the_net(tmp_path):
    proc = train(tmp_path / "run", net_file("mlp", tmp_path), 32, 2, "train.max_iter=2",
                 "train.distributed.stages=2", "train.distributed.micro_batches=2")
    stages = re.findall(r"stage (\d): (\w+)\.\.(\w+) \((\d+) layers", proc.stderr)
    assert [s[0] for s in stages] == ["0", "1"]
    assert stages[0][1] == "ip1" and stages[1][2] == "loss"
    assert int(stages[0][3]) + int(stages[1][3]) == 8
    assert "trained mlp for 2 iterations; not tested (pipeline stages);" in proc.stdout


def run_job(args: list[str], ranks: int) -> subprocess.CompletedProcess:
    cmd = [*TOOLKIT, *args]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_"))}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("ranks,sets,message", [
    (1, ["train.distributed.stages=2"], "a pipeline runs one stage a rank, under `mpiexec -n 2"),
    (3, ["train.distributed.stages=2"], "train.distributed.stages is 2, which does not divide the job's 3 ranks "
                                        "(the ranks are stages x replicas)"),
    (2, ["train.distributed.stages=2", "train.distributed.micro_batches=3"],
     "train.distributed.micro_batches is 3, which does not divide train.data.batch_size (32)"),
    (2, ["train.distributed.stages=2", "train.distributed.sync_batchnorm=true"], "sync_batchnorm is for data-parallel"),
])
def test_what_a_pipeline_cannot_do_ends_the_job_with_one_line(tmp_path, ranks, sets, message):
    args = ["train", "zoo/lenet/net.yaml", "--out", str(tmp_path / "run"), "--set", "train.data.batch_size=32",
            "--set", "train.max_iter=2", *[a for s in sets for a in ("--set", s)]]
    proc = run_job(args, ranks)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors and message in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rank supervision uses Linux's parent-death signal")
def test_a_killed_stage_stops_the_job_naming_it(tmp_path):
    out = tmp_path / "killed"
    cmd = [str(MPIEXEC), "-n", "2", *TOOLKIT, "train", "zoo/lenet/net.yaml", "--out", str(out),
           "--set", "train.data.batch_size=32", "--set", "train.max_iter=100000", "--set", "train.snapshot=50",
           "--set", "train.distributed.stages=2", "--set", "train.distributed.micro_batches=2"]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True).start()
    deadline = time.monotonic() + 120
    while not any((out / "checkpoints").glob("*")) and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    pids = re.search(r"rank 0 pid (\d+), rank 1 pid (\d+)", "".join(lines))
    assert pids, lines
    os.kill(int(pids.group(2)), signal.SIGKILL)           # the last stage, mid-step
    said = finish(job, lines)
    assert job.returncode != 0
    assert f"error: rank 1 of 2 (pid {pids.group(2)}) was killed by SIGKILL" in said, said[-2000:]
    time.sleep(0.5)
    assert not [p for p in pids.groups() if _running(int(p))]
    from toolkit.training.checkpoint import find_resume_point, read_checkpoint
    assert read_checkpoint(find_resume_point(str(out))).iteration % 50 == 0


def test_resume_of_a_pipeline_under_mpiexec_is_bit_exact_even_where_the_cut_moves(tmp_path):
    """The cut depends on the machine (measured time, the memory available), so a run may resume
    under another cut: here the FLOPs' cut after pool1, then under a memory limit that moves it
    after conv2 and makes the stages sum their gradients as they come. The weights are those of
    the run never stopped, bit for bit: a node computes the same wherever the cut puts it."""
    sets = ("train.max_iter=30", "train.snapshot=15", "train.distributed.stages=2", "train.distributed.micro_batches=4",
            "train.distributed.balance=flops")
    train(tmp_path / "whole", "zoo/lenet/net.yaml", 32, 2, *sets)
    train(tmp_path / "part", "zoo/lenet/net.yaml", 32, 2, *sets)
    from toolkit.training.checkpoint import PATTERN
    ckpt = tmp_path / "part" / "checkpoints"
    for extra in [p for p in ckpt.iterdir() if int(PATTERN.match(p.name).group(1)) != 15]:
        extra.unlink()                       # back to iteration 15
    moved = (*sets, "train.distributed.stage_memory_mb=0.28")
    again = ["train", "zoo/lenet/net.yaml", "--resume", str(tmp_path / "part"), "--set", "train.data.batch_size=32",
             "--set", "train.display=1", *[a for s in moved for a in ("--set", s)]]
    proc = run_job(again, 2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "stage 0: conv1..conv2 (4 layers" in proc.stdout + proc.stderr
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)

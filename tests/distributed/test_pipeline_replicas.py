"""Data-parallel replicas of a pipeline under `mpiexec` (docs/spec.md section 8): 2 stages x 2
replicas on 4 ranks give the weights and every logged loss of one process at the global batch
over 30 and more steps (GPipe and 1F1B, a short last batch that leaves one replica without rows),
a BatchNorm net the weights of one pipeline over all the replicas' micro-batches, resume is
bit-exact, and a killed rank stops the job. Each run is a tiny MLP: 4 ranks share 2 cores."""
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
from mpi_helpers import HAVE_MPI, MPIEXEC, ROOT, TOOLKIT
from safetensors.numpy import load_file
from test_data_parallel import _running, assert_same_training, finish, losses, train
from test_pipeline_parallel import run_job

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="the dist extra (mpi4py and an MPI wheel) is not installed")

MLP = """
name: mlp
inputs:
  data:  {shape: [N, 1, 8, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 32}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 32}
  - {name: relu2, type: ReLU, bottom: ip2, top: ip2}
  - {name: ip3, type: InnerProduct, bottom: ip2, top: ip3, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip3, label], top: loss, phase: train}
train:
  data: {source: "builtin:digits"}
  solver: {type: sgd, base_lr: 0.05, momentum: 0.9, weight_decay: 0.0005}
"""

BATCHNORM = """
name: mlpbn
inputs:
  data:  {shape: [N, 1, 8, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 32}
  - {name: bn1, type: BatchNorm, bottom: ip1, top: bn1}
  - {name: relu1, type: ReLU, bottom: bn1, top: bn1}
  - {name: ip2, type: InnerProduct, bottom: bn1, top: ip2, num_output: 32}
  - {name: bn2, type: BatchNorm, bottom: ip2, top: bn2}
  - {name: relu2, type: ReLU, bottom: bn2, top: bn2}
  - {name: ip3, type: InnerProduct, bottom: bn2, top: ip3, num_output: 10}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip3, label], top: loss, phase: train}
train:
  data: {source: "builtin:digits"}
  solver: {type: sgd, base_lr: 0.05, momentum: 0.9}
"""


def net_file(tmp_path: Path, text: str = MLP) -> str:
    path = tmp_path / "net.yaml"
    path.write_text(text)
    return str(path)


# 1438 training rows. At 16 a replica (global 32) 30 steps stay in the first epoch; at 21 a
# replica (global 42) the 35th batch is the epoch's last, 10 rows: replica 0 runs them as 2
# micro-batches of 5, replica 1 has none (one placeholder row that weighs nothing)
@pytest.mark.parametrize("batch,micro,steps,schedule", [(16, 2, 30, "gpipe"), (21, 3, 40, "1f1b")])
def test_two_stages_times_two_replicas_give_one_process_at_the_global_batch(tmp_path, batch, micro, steps, schedule):
    path = net_file(tmp_path)
    sets = (f"train.max_iter={steps}",)
    train(tmp_path / "one", path, 2 * batch, 1, *sets)
    proc = train(tmp_path / "many", path, batch, 4, *sets, "train.distributed.stages=2",
                 f"train.distributed.micro_batches={micro}", f"train.distributed.schedule={schedule}")
    assert ("2 data-parallel replicas of the pipeline (replica 0: ranks 0, 1; replica 1: ranks 2, 3)"
            in proc.stderr), proc.stderr[-2000:]
    assert "(stage 0: ranks 0, 2; stage 1: ranks 1, 3)" in proc.stderr
    assert_same_training(tmp_path / "one", tmp_path / "many")
    # the checkpoint holds the whole model and its solver state, though each rank held a stage
    ckpt = load_file(str(next((tmp_path / "many" / "checkpoints").iterdir())))
    model = load_file(str(tmp_path / "one" / "model.safetensors"))
    assert set(ckpt) == set(model) | {f"{k}@momentum" for k in model}


def test_batchnorm_replicas_train_as_one_pipeline_over_all_their_micro_batches(tmp_path):
    """BatchNorm normalises each micro-batch by its own statistics, in each replica: 2 replicas
    of 2 micro-batches of 8 rows are the weights of one 2-stage pipeline of 4 micro-batches of 8
    rows (replica r's micro-batch m is its micro-batch 2r + m). The running statistics are each
    replica's own (moved by its micro-batches alone), so they are left out."""
    path = net_file(tmp_path, BATCHNORM)
    sets = ("train.max_iter=30", "train.distributed.stages=2")
    train(tmp_path / "one", path, 32, 2, *sets, "train.distributed.micro_batches=4")
    train(tmp_path / "many", path, 16, 4, *sets, "train.distributed.micro_batches=2")
    a = load_file(str(tmp_path / "one" / "model.safetensors"))
    b = load_file(str(tmp_path / "many" / "model.safetensors"))
    assert a.keys() == b.keys() and any("bn1" in k for k in a)
    for k in a:
        if k in ("ip1.bias", "ip2.bias"):        # BatchNorm takes out their gradient: rounding noise
            assert np.abs(a[k]).max() < 1e-7 and np.abs(b[k]).max() < 1e-7, k
        elif k.startswith("ip"):
            assert np.abs(a[k] - b[k]).max() / (np.abs(a[k]).max() + 1e-12) < 1e-5, k
    la, lb = losses(tmp_path / "one"), losses(tmp_path / "many")
    assert len(la) == len(lb) == 30
    for (i, x), (_, y) in zip(la, lb):
        assert abs(x - y) <= 1e-5 * abs(x), (i, x, y)


def test_resume_of_replicas_of_a_pipeline_is_bit_exact(tmp_path):
    path = net_file(tmp_path)
    sets = ("train.max_iter=30", "train.snapshot=15", "train.distributed.stages=2",
            "train.distributed.micro_batches=2")
    train(tmp_path / "whole", path, 16, 4, *sets)
    train(tmp_path / "part", path, 16, 4, *sets)
    from toolkit.training.checkpoint import PATTERN
    ckpt = tmp_path / "part" / "checkpoints"
    for extra in [p for p in ckpt.iterdir() if int(PATTERN.match(p.name).group(1)) != 15]:
        extra.unlink()                       # back to iteration 15
    again = ["train", path, "--resume", str(tmp_path / "part"), "--set", "train.data.batch_size=16",
             "--set", "train.display=1", *[a for s in sets for a in ("--set", s)]]
    proc = run_job(again, 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert losses(tmp_path / "whole")[15:] == losses(tmp_path / "part")[15:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rank supervision uses Linux's parent-death signal")
def test_a_killed_rank_of_a_replica_stops_the_job_naming_it(tmp_path):
    out = tmp_path / "killed"
    cmd = [str(MPIEXEC), "-n", "4", *TOOLKIT, "train", net_file(tmp_path), "--out", str(out),
           "--set", "train.data.batch_size=16", "--set", "train.max_iter=1000000", "--set", "train.snapshot=50",
           "--set", "train.distributed.stages=2", "--set", "train.distributed.micro_batches=2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_"))}
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True, env=env)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True).start()
    deadline = time.monotonic() + 120
    while not any((out / "checkpoints").glob("*")) and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    pids = re.search(r"rank 0 pid (\d+), rank 1 pid (\d+), rank 2 pid (\d+), rank 3 pid (\d+)", "".join(lines))
    assert pids, lines
    os.kill(int(pids.group(3)), signal.SIGKILL)        # replica 1's first stage, mid-step
    said = finish(job, lines)
    assert job.returncode != 0
    assert f"error: rank 2 of 4 (pid {pids.group(3)}) was killed by SIGKILL" in said, said[-2000:]
    time.sleep(0.5)
    assert not [p for p in pids.groups() if _running(int(p))]
    from toolkit.training.checkpoint import find_resume_point, read_checkpoint
    assert read_checkpoint(find_resume_point(str(out))).iteration % 50 == 0

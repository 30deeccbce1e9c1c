"""Data-parallel training on GPUs (docs/spec.md section 8): `mpiexec -n K toolkit train NET --device
gpu`, one GPU per rank, the gradient buckets summed by NCCL on a stream of their own.

Without a GPU the ranks run on the numpy stand-in for CuPy with a host stand-in for its NCCL
binding (tests/runtime/fake_nccl.py), put into every process of the job (the launcher's
supervisors and the rank processes alike) by a ``sitecustomize`` module on PYTHONPATH: K = 2 and
3 ranks equal one process at K x the batch over 30 steps, sync BatchNorm included; two ranks on
one GPU, or a CuPy without NCCL, sum through host memory after one line saying so; the stand-in
refuses calls out of order, of other counts, on the wrong stream, from a communicator not made
from rank 0's id, and a bucket read before its wait reads NaN. On a GPU (``-m gpu``): a
one-rank NCCL communicator in-process, and two ranks on one GPU under mpiexec."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from mpi_helpers import HAVE_MPI, MPIEXEC, ROOT, TOOLKIT
from safetensors.numpy import load_file

from toolkit.backend.devices import gpu_available

sys.path.insert(0, str(ROOT))
from tests.runtime.gpu_stand_in import CXX, emulation_folder, fake_cublas, fake_cudnn  # noqa: E402

needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="the dist extra (mpi4py and an MPI wheel) is not installed")
needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")

# every process of the job starts with the stand-ins in place: CuPy, its GPUs, NCCL
SITECUSTOMIZE = textwrap.dedent("""
    import os, sys
    if os.environ.get("STAND_IN_GPUS"):
        sys.path.insert(0, os.environ["STAND_IN_ROOT"])
        from tests.runtime.gpu_stand_in import STAND_IN, RAW_MODULE
        exec(STAND_IN + RAW_MODULE)
        from tests.runtime import fake_nccl
        fake_nccl.install(sys.modules["cupy"], int(os.environ["STAND_IN_GPUS"]),
                          nccl=os.environ.get("STAND_IN_NCCL") != "0")
        rank = os.environ.get("PMI_RANK", "solo")
        broken = os.environ.get("STAND_IN_BREAK")
        if broken == "init":                                # NCCL refuses to start (as it would everywhere)
            def refuse(ndev, uid, nccl_rank):
                raise RuntimeError("NCCL_ERROR_SYSTEM_ERROR: unhandled system error")
            fake.cuda.nccl.NcclCommunicator = refuse
        elif broken:                                        # a deliberate mistake the stand-in must catch
            from toolkit.distributed import nccl as sums
            if broken == "no_wait":
                sums.DeviceSums.wait = lambda self, bucket: self.pending.pop(bucket)[0]
            elif broken == "compute_stream":
                def on_compute(self, send, recv, all_reduce=sums.DeviceSums._all_reduce):
                    self.stream, kept = self.cp.cuda.get_current_stream(), self.stream
                    try:
                        all_reduce(self, send, recv)
                    finally:
                        self.stream = kept
                sums.DeviceSums._all_reduce = on_compute
            elif broken == "count" and rank == "1":
                def short(self, send, recv, all_reduce=sums.DeviceSums._all_reduce):
                    all_reduce(self, send[:-1], recv[:-1])
                sums.DeviceSums._all_reduce = short
""")


def stand_in_env(tmp_path: Path, gpus: int, nccl: bool = True, broken: str | None = None) -> dict:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), STAND_IN_ROOT=str(ROOT), STAND_IN_GPUS=str(gpus),
               STAND_IN_NCCL="1" if nccl else "0", CUDA_EMULATION_DIR=str(emulation_folder(tmp_path)),
               CXX_FOR_CUDA_EMULATION=CXX or "c++", TOOLKIT_CUBLAS_LIBRARY=fake_cublas(tmp_path),
               TOOLKIT_CUBLASLT_LIBRARY=fake_cublas(tmp_path), TOOLKIT_CUDNN_LIBRARY=fake_cudnn(tmp_path))
    if broken:
        env["STAND_IN_BREAK"] = broken
    return env


def train(out: Path, env: dict, net: str, batch: int, ranks: int, *sets: str,
          check=True) -> subprocess.CompletedProcess:
    cmd = [*TOOLKIT, "train", net, "--device", "gpu", "--out", str(out), "--set", f"train.data.batch_size={batch}",
           "--set", "train.display=1", *[a for s in sets for a in ("--set", s)]]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses(run: Path) -> list[tuple[int, float]]:
    return [(r["iter"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def assert_same_training(one: Path, many: Path, steps: int, rtol: float = 1e-5) -> None:
    a, b = load_file(str(one / "model.safetensors")), load_file(str(many / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert np.abs(a[k] - b[k]).max() / (np.abs(a[k]).max() + 1e-12) < rtol, k
    la, lb = losses(one), losses(many)
    assert [i for i, _ in la] == [i for i, _ in lb] == list(range(steps))
    for (i, x), (_, y) in zip(la, lb):
        assert abs(x - y) <= rtol * abs(x), (i, x, y)


NCCL_LINE = "gradients summed by NCCL 2.27.3 on the GPUs, one per rank, on a stream of their own"


@needs_mpi
@needs_cxx
# three ranks split unevenly on the CPU path in the whole suite (test_data_parallel.py); over
# NCCL's stand-in that is the longer run (make test-slow)
@pytest.mark.parametrize("ranks,batch", [(2, 32), pytest.param(3, 21, marks=pytest.mark.slow)])
def test_k_ranks_over_nccl_give_one_process_at_k_times_the_batch(tmp_path, ranks, batch):
    # as on the CPU (test_data_parallel.py): the 23rd global batch is short, and 3 ranks split unevenly
    env = stand_in_env(tmp_path, gpus=ranks)
    sets = ("train.max_iter=30", "train.test_interval=15")
    train(tmp_path / "one", env, "zoo/lenet/net.yaml", ranks * batch, 1, *sets)
    proc = train(tmp_path / "many", env, "zoo/lenet/net.yaml", batch, ranks, *sets)
    assert f"data-parallel over {ranks} ranks" in proc.stderr
    assert proc.stderr.count(NCCL_LINE) == 1, proc.stderr[-3000:]           # rank 0 says it, once
    assert "through host memory" not in proc.stderr
    assert_same_training(tmp_path / "one", tmp_path / "many", 30)


@needs_mpi
@needs_cxx
@pytest.mark.slow          # the small ResNet on three emulated processes: the longest of the file
def test_sync_batchnorm_sums_its_statistics_over_nccl(tmp_path):
    env = stand_in_env(tmp_path, gpus=2)
    sets = ("train.max_iter=6", "train.test_interval=1000")
    train(tmp_path / "one", env, "zoo/resnet/net.yaml", 16, 1, *sets)
    proc = train(tmp_path / "many", env, "zoo/resnet/net.yaml", 8, 2, *sets, "train.distributed.sync_batchnorm=true")
    assert NCCL_LINE in proc.stderr
    a = load_file(str(tmp_path / "one" / "model.safetensors"))
    assert any("running_mean" in k for k in a)        # the running statistics are compared too
    assert_same_training(tmp_path / "one", tmp_path / "many", 6)


@needs_mpi
@needs_cxx
@pytest.mark.parametrize("gpus,nccl,broken,why", [
    (1, True, None, "ranks 0, 1 share one GPU (0000:01:00.0 on "),
    # the other two reasons take the same fallback: the longer runs (make test-slow)
    pytest.param(2, False, None, "this CuPy has no NCCL (install the gpu extra's nvidia-nccl wheel)",
                 marks=pytest.mark.slow),
    pytest.param(2, True, "init", "NCCL failed to start on rank 0 (RuntimeError: NCCL_ERROR_SYSTEM_ERROR: unhandled "
                 "system error)", marks=pytest.mark.slow),
])
def test_where_nccl_cannot_run_the_sums_stage_through_host_memory_said_in_one_line(tmp_path, gpus, nccl, broken, why):
    env = stand_in_env(tmp_path, gpus=gpus, nccl=nccl, broken=broken)
    sets = ("train.max_iter=6", "train.test_interval=1000")
    train(tmp_path / "one", env, "zoo/lenet/net.yaml", 32, 1, *sets)
    proc = train(tmp_path / "many", env, "zoo/lenet/net.yaml", 16, 2, *sets)
    said = [line for line in proc.stderr.splitlines() if "gradients summed" in line]
    assert len(said) == 1 and said[0].startswith("gradients summed through host memory over MPI, not NCCL: " + why), \
        proc.stderr[-3000:]
    assert_same_training(tmp_path / "one", tmp_path / "many", 6)


@needs_mpi
@needs_cxx
@pytest.mark.parametrize("broken,said", [
    # the update reads the bucket before its wait (with overlap off, no later sum on the NCCL
    # stream is waited for in between, which would order the bucket's sum before it, as on a GPU)
    ("no_wait", "the loss became nan"),
    ("compute_stream", "NCCL stand-in: rank 0's call 0 is on stream 0"),     # the trainer computes on stream 0
    ("count", "NCCL stand-in: call 0 differs between the ranks"),
])
def test_a_sum_that_breaks_what_nccl_requires_stops_the_job(tmp_path, broken, said):
    env = stand_in_env(tmp_path, gpus=2, broken=broken)
    proc = train(tmp_path / "many", env, "zoo/lenet/net.yaml", 16, 2, "train.max_iter=3",
                 "train.distributed.overlap=false", check=False)
    # every rank breaks the rule alike, and whichever rank's refusal is printed first stops the job
    assert proc.returncode != 0 and any(said.replace("rank 0's", f"rank {r}'s") in proc.stderr for r in (0, 1)), \
        proc.stderr[-3000:]


@needs_mpi
@needs_cxx
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rank supervision uses Linux's parent-death signal")
def test_a_killed_rank_stops_the_gpu_job_naming_it(tmp_path):
    out = tmp_path / "killed"
    cmd = [str(MPIEXEC), "-n", "2", *TOOLKIT, "train", "zoo/lenet/net.yaml", "--device", "gpu", "--out", str(out),
           "--set", "train.data.batch_size=16", "--set", "train.max_iter=100000", "--set", "train.snapshot=5"]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True, env=stand_in_env(tmp_path, gpus=2))
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True).start()
    deadline = time.monotonic() + 180
    while not any((out / "checkpoints").glob("*")) and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    pids = re.search(r"rank 0 pid (\d+), rank 1 pid (\d+)", "".join(lines))
    assert pids and job.poll() is None, "".join(lines)[-3000:]
    os.kill(int(pids.group(2)), signal.SIGKILL)
    try:
        job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        pytest.fail("the job did not end within 60 s of the kill:\n" + "".join(lines)[-3000:])
    time.sleep(0.2)
    said = "".join(lines)
    assert job.returncode != 0, said[-3000:]
    assert f"error: rank 1 of 2 (pid {pids.group(2)}) was killed by SIGKILL" in said, said[-3000:]


# which GPU each rank trains on, and whether its train step is captured whole
PLACES = textwrap.dedent("""
    import hashlib, sys
    from pathlib import Path
    from toolkit.distributed.comm import MpiCommunicator, use
    from toolkit.frontend import Net
    from toolkit.training.trainer import Trainer
    comm = MpiCommunicator()
    sets = [(("train", "max_iter"), 3), (("train", "test_interval"), 100), (("train", "data", "batch_size"), 16)]
    with use(comm):
        trainer = Trainer(Net.load("zoo/lenet/net.yaml", overrides=sets), Path(sys.argv[1]), device=sys.argv[2],
                          comm=comm)
        assert trainer.run() == 0
    plan, = trainer.train_plans.plans.values()
    print(f"rank {comm.rank}: {trainer.device}, captured {plan.graph_run is not None and plan.graph_run.captured}, "
          f"{plan.capture_blocker}")
    state = b"".join(v.tobytes() for _, v in sorted(trainer.host_store().items()))
    print("state", hashlib.sha256(state).hexdigest(), file=sys.stderr)
""")


@needs_mpi
@needs_cxx
@pytest.mark.parametrize("gpus,device,said", [
    (2, "gpu", ["rank 0: gpu, captured True, None", "rank 1: gpu:1, captured True, None"]),
    (1, "gpu", [f"rank {r}: gpu, captured False, layer 'data_parallel': its allreduce_start kernel stages its values "
                "through host memory" for r in (0, 1)]),
    # a GPU named by its index is every rank's: they share it, and the sums go through the host
    pytest.param(2, "gpu:1", [f"rank {r}: gpu:1, captured False, layer 'data_parallel': its allreduce_start kernel "
                              "stages its values through host memory" for r in (0, 1)], marks=pytest.mark.slow),
])
def test_each_rank_takes_its_own_gpu_and_its_train_step_is_captured_with_the_sums(tmp_path, gpus, device, said):
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", PLACES, str(tmp_path / "run"), device],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=stand_in_env(tmp_path, gpus=gpus))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(proc.stdout.strip().splitlines()) == said, proc.stdout
    states = re.findall(r"^state (\w+)$", proc.stderr, re.M)     # every rank holds the same weights and slots
    assert len(states) == 2 and states[0] == states[1], proc.stderr[-3000:]


# the stand-in itself, called as the toolkit calls CuPy's binding: each rule broken on purpose
REFUSALS = textwrap.dedent("""
    import sys
    import numpy as np
    import cupy as cp
    from mpi4py import MPI
    nccl = cp.cuda.nccl
    rank = MPI.COMM_WORLD.Get_rank()
    refused = []
    def expect_refusal(name, call):
        try:
            call()
        except nccl.NcclStandInError as e:
            refused.append((name, str(e)))
        else:
            raise SystemExit(f"{name}: not refused")
    own = nccl.get_unique_id()
    expect_refusal("own id", lambda: nccl.NcclCommunicator(2, own, rank))
    uid = MPI.COMM_WORLD.bcast(nccl.get_unique_id() if rank == 0 else None)
    expect_refusal("swapped ranks", lambda: nccl.NcclCommunicator(2, uid, 1 - rank))
    comm = nccl.NcclCommunicator(2, uid, rank)
    cp.cuda.Stream(non_blocking=True).__enter__()        # the compute stream: not stream 0
    stream = cp.cuda.Stream(non_blocking=True)
    a, b = np.full(8, rank + 1.0, np.float32), np.full(4, rank + 1.0, np.float32)
    def reduce(x, on=None, count=None, dtype=nccl.NCCL_FLOAT32):
        on = stream if on is None else on
        on.wait_event(cp.cuda.get_current_stream().record())
        comm.allReduce(x.ctypes.data, x.ctypes.data, x.size if count is None else count, dtype, nccl.NCCL_SUM, on.ptr)
    # the buckets in another order on rank 1, another count, another type, other streams
    expect_refusal("order", lambda: reduce(a if rank == 0 else b))
    expect_refusal("count", lambda: reduce(a, count=8 - rank))
    expect_refusal("type", lambda: reduce(a, dtype=7 if rank == 0 else 8))
    expect_refusal("stream 0", lambda: comm.allReduce(a.ctypes.data, a.ctypes.data, 8, 7, 0, 0))
    expect_refusal("compute stream", lambda: reduce(a, on=cp.cuda.get_current_stream()))
    unordered = cp.cuda.Stream(non_blocking=True)
    expect_refusal("not after compute",
                   lambda: comm.allReduce(a.ctypes.data, a.ctypes.data, 8, 7, 0, unordered.ptr))
    # done right: nothing to read before the wait, the sum after it
    reduce(a)
    assert np.isnan(a).all(), a
    cp.cuda.get_current_stream().wait_event(stream.record())
    assert (a == 3.0).all(), a
    print(rank, " | ".join(f"{name}: {why}" for name, why in refused))
""")


@needs_mpi
def test_the_nccl_stand_in_refuses_what_a_communicator_would_not(tmp_path):
    env = stand_in_env(tmp_path, gpus=2)
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", REFUSALS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = sorted(proc.stdout.strip().splitlines())
    assert len(lines) == 2 and lines[0].split(" | ")[1:] == lines[1].split(" | ")[1:], lines    # alike on both
    said = lines[0]
    for expected in ("own id: NCCL stand-in: the ranks passed different unique ids",
                     "swapped ranks: NCCL stand-in: MPI rank 0 made its communicator as rank 1 of 2",
                     "order: NCCL stand-in: call 0 differs between the ranks: "
                     "rank 0: allReduce(count 8, type 7, op 0); rank 1: allReduce(count 4, type 7, op 0)",
                     "count: NCCL stand-in: call 1 differs", "type: NCCL stand-in: call 2 differs",
                     "stream 0: NCCL stand-in: rank 0's call 3 is on stream 0",
                     "compute stream: NCCL stand-in: rank 0's call 4 is on the compute stream",
                     "not after compute: NCCL stand-in: rank 0's call 5 is on a stream that did not first wait"):
        assert expected in said, said


# -- on a GPU ----------------------------------------------------------------------------------------
def three_steps(graph, net, batch: dict, device: str) -> dict[str, np.ndarray]:
    """The weights after three train steps of ``graph`` on ``device`` (captured from the second
    on where the plan can be), and the last loss."""
    from toolkit.backend.devices import parse_device, to_host
    from toolkit.compile import solver_config
    from toolkit.ir.binding import bind_symbols
    from toolkit.optim.data_parallel import DIST_WEIGHT
    from toolkit.optim.solvers import host_values, initial_state
    from toolkit.runtime.plan import Plan, RuntimeState
    store = {k: np.array(v, order="C") for k, v in net.init_weights(0).items()}
    for name, w in graph.weights.items():
        store.setdefault(name, initial_state(w))
    store = {k: parse_device(device).to_device(store[k]) for k in graph.weights}
    feed = {k: v for k, v in batch.items() if k in graph.inputs}
    feed.update(host_values(solver_config(net), 0.05, 1, "float32"))
    if DIST_WEIGHT in graph.inputs:
        feed[DIST_WEIGHT] = np.float32(1.0)
    plan = Plan(graph, bind_symbols(graph, {k: np.shape(v) for k, v in feed.items()}), store, device,
                RuntimeState(np.random.default_rng(0)))
    for _ in range(3):
        outs = plan.run(feed)
    return {**{k: to_host(v) for k, v in store.items()}, "loss": to_host(outs["@objective"]),
            "captured": plan.graph_run is not None and plan.graph_run.captured, "why": plan.capture_blocker}


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_a_one_rank_nccl_communicator_steps_like_the_plain_train_step():
    import cupy

    from toolkit.compile import optimize, train_graph
    from toolkit.distributed.comm import Solo, use
    from toolkit.distributed.nccl import nccl_module, start_device_sums
    from toolkit.frontend import Net
    from toolkit.optim.data_parallel import DataParallel, bucket_summary
    if nccl_module(cupy) is None:
        pytest.skip("this CuPy has no NCCL (cupy.cuda.nccl): install nvidia-nccl-cu12 or -cu13")
    comm = Solo()
    sums, line = start_device_sums(comm, cupy, 0)        # a unique id made in this process, one rank
    assert sums is not None, line
    comm.device_sums = sums
    net = Net.load(str(ROOT / "zoo/resnet/net.yaml"))
    rng = np.random.default_rng(3)
    batch = {"data": rng.standard_normal((16, 1, 8, 8)).astype(np.float32),
             "label": rng.integers(0, 10, 16).astype(np.int64), "@dist_row_mask": np.ones(16, np.float32)}
    plain = three_steps(optimize(train_graph(net), device="gpu"), net, batch, "gpu")
    with use(comm):       # the plan's kernels find the NCCL sums on the current communicator
        graph = optimize(train_graph(net, data_parallel=DataParallel(bucket_mb=0.004, sync_batchnorm=True)),
                         device="gpu")
        assert len(bucket_summary(graph)) > 1
        summed = three_steps(graph, net, batch, "gpu")
    worst = max(float(np.abs(summed[k] - plain[k]).max() / (np.abs(plain[k]).max() + 1e-12))
                for k in plain if k not in ("captured", "why"))
    print(f"{line} | captured: {summed['captured']} ({summed['why']}) | largest relative difference {worst:.2e}")
    assert summed["why"] is None or "NCCL" in summed["why"], summed["why"]     # never the host-staged path
    for k in plain:
        if k not in ("captured", "why"):
            np.testing.assert_allclose(summed[k], plain[k], rtol=1e-5, atol=1e-6, err_msg=k)


# the dist extra's launcher, else one on PATH; either needs mpi4py in this Python
try:
    import mpi4py  # noqa: F401
    MPIEXEC_ANY = str(MPIEXEC) if MPIEXEC.exists() else shutil.which("mpiexec")
except ImportError:
    MPIEXEC_ANY = None


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
@pytest.mark.skipif(MPIEXEC_ANY is None, reason="no mpiexec or no mpi4py here (pip install 'yamlnet-toolkit[dist]')")
def test_two_ranks_on_one_gpu_stage_through_host_memory_after_one_line(tmp_path):
    import cupy
    if cupy.cuda.runtime.getDeviceCount() != 1:
        pytest.skip("two ranks share one GPU only on a machine with one")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")     # should it be Open MPI's, as root
    if not (shutil.which("ssh") or shutil.which("rsh")):
        # Open MPI refuses to start without a remote shell even for ranks on this host alone
        # (open-mpi/ompi#12386); no remote launch happens here, so any agent on PATH will do
        env.setdefault("OMPI_MCA_plm_rsh_agent", "sh")
    sets = ["--set", "train.max_iter=20", "--set", "train.display=1", "--set", "train.test_interval=1000"]
    one = subprocess.run([*TOOLKIT, "train", "zoo/lenet/net.yaml", "--device", "gpu", "--out", str(tmp_path / "one"),
                          "--set", "train.data.batch_size=64", *sets], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    many = subprocess.run([MPIEXEC_ANY, "-n", "2", *TOOLKIT, "train", "zoo/lenet/net.yaml", "--device", "gpu",
                           "--out", str(tmp_path / "many"), "--set", "train.data.batch_size=32", *sets], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)
    assert many.returncode == 0, many.stderr[-3000:]
    said = [line for line in many.stderr.splitlines() if "gradients summed" in line]
    assert len(said) == 1 and re.match(r"gradients summed through host memory over MPI, not NCCL: ranks 0, 1 share "
                                       r"one GPU", said[0]), many.stderr[-3000:]
    # cuDNN and cuBLAS sum a batch of 64 and two of 32 in other orders: float32 roundings, 20 steps on
    assert_same_training(tmp_path / "one", tmp_path / "many", 20, rtol=1e-4)

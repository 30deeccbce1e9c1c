"""A resumed GPU run takes the routes its first run measured (kernels/gpu/dnn_routes.py,
backend/measured.py), on the numpy stand-in for CuPy with the host build of cuDNN.

Each start is a process of its own, whose timer (the stand-in has no clock: the tests replace
``seconds_on_device``) is told which route is faster. LeNet trains 6 iterations with cuDNN and
the fused epilogue measured faster, checkpointing at 3; a new process whose timer would pick
im2col and the two kernels resumes at 3: it times nothing, takes the recorded routes, and ends
with the uninterrupted run's weights bit for bit. Without cuDNN the resume says in one line
that it is not exact; a checkpoint whose recorded routes are corrupt or foreign is refused in one
line (exit 2); a resume on the CPU ignores them. The ``gpu`` test does the first on a device.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, ROOT, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available

needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")

TRAIN_SCRIPT = textwrap.dedent("""
    import json, sys
    from toolkit.backend.registry import load_device
    from toolkit.cli import main
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, dnn_routes
    faster = sys.argv[1]                 # "cudnn" (and the fused epilogue) or "im2col" (and two kernels)
    timed = []
    def fake_timer(run, shapes, out_shape, dtype):
        name = run.__qualname__
        if "epilogue_convolution" in name:
            route = "cudnn"
        elif "_gradient" in name:
            route = "cudnn"
        else:
            route = "im2col"
        timed.append(name)
        return 1.0 if route == faster else 2.0
    dnn_routes.seconds_on_device = fake_timer
    status = main(sys.argv[2:])
    print(json.dumps({"status": status, "timed": len(timed),
                      "weight_gradients": sorted({r for r, _why in dnn_routes.WEIGHT_GRADIENT_ROUTES.values()}),
                      "fused": sorted(set(dnn_routes.FUSED_ROUTES.values())),
                      "chosen": sorted(f"{how} {what}" for how, what in dnn.CHOSEN)}))
""")

SETTINGS = ["--set", "train.max_iter=6", "--set", "train.snapshot=3", "--set", "train.test_interval=100",
            "--set", "train.display=1", "--set", "train.data.batch_size=16"]


def _train(tmp_path, faster: str, *argv, **env) -> tuple[dict, str]:
    result = run_stand_in(STAND_IN + RAW_MODULE + TRAIN_SCRIPT, tmp_path, faster, "train", *argv, "--device", "gpu",
                          env_extra=env)
    assert result.stdout.strip(), result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def _weights(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(str(path))


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> Path:
    """LeNet's uninterrupted run, with cuDNN's weight gradients and the fused epilogue faster."""
    tmp = tmp_path_factory.mktemp("routes")
    report, err = _train(tmp, "cudnn", str(ROOT / "zoo" / "lenet" / "net.yaml"), "--out", str(tmp / "whole"),
                         *SETTINGS)
    assert report["status"] == 0, err[-3000:]
    assert report["weight_gradients"] == ["cudnn"] and report["fused"] == [True] and report["timed"] > 0, report
    return tmp / "whole"


def _checkpoint(run: Path) -> Path:
    return run / "checkpoints" / "iter_0000003.safetensors"


@needs_cxx
def test_a_resumed_gpu_run_takes_the_recorded_routes_and_ends_bit_for_bit_as_the_uninterrupted_run(
        whole_run, tmp_path):
    meta = _meta(_checkpoint(whole_run))
    recorded = meta["routes"]["convolution_routes"]
    assert {route for _key, route, _why in recorded["weight_gradients"]} == {"cudnn"}, recorded
    assert len(recorded["weight_gradients"]) == 2 and recorded["cudnn_unavailable"] is None, recorded
    # a fresh process would take the other routes: its timer says im2col and two kernels are faster
    fresh, err = _train(tmp_path, "im2col", str(ROOT / "zoo" / "lenet" / "net.yaml"), "--out",
                        str(tmp_path / "fresh"), *SETTINGS)
    assert fresh["weight_gradients"] == ["im2col"] and fresh["fused"] == [False], (fresh, err[-2000:])
    resumed, err = _train(tmp_path, "im2col", "--resume", str(_checkpoint(whole_run)), "--out",
                          str(tmp_path / "resumed"))
    assert resumed["status"] == 0, err[-3000:]
    # the recorded routes, none measured anew
    assert resumed["weight_gradients"] == ["cudnn"] and resumed["fused"] == [True], resumed
    assert resumed["timed"] == 0 and "cudnn conv2d_grad_weight" in resumed["chosen"], resumed
    want, got = _weights(whole_run / "model.safetensors"), _weights(tmp_path / "resumed" / "model.safetensors")
    assert sorted(want) == sorted(got)
    for name in want:
        assert np.array_equal(want[name], got[name]), name
    assert "not exact" not in err, err


@needs_cxx
def test_a_resume_without_cudnn_says_in_one_line_that_it_is_not_exact(whole_run, tmp_path):
    resumed, err = _train(tmp_path, "im2col", "--resume", str(_checkpoint(whole_run)), "--out",
                          str(tmp_path / "resumed"), TOOLKIT_CUDNN="0")
    assert resumed["status"] == 0, err[-3000:]
    lines = [line for line in err.splitlines() if "not exact" in line]
    assert len(lines) == 1 and "cuDNN, which cannot run now (TOOLKIT_CUDNN=0)" in lines[0], err[-3000:]
    assert resumed["chosen"] == ["im2col TOOLKIT_CUDNN=0"], resumed


def _meta(path: Path) -> dict:
    from safetensors import safe_open
    with safe_open(str(path), framework="numpy") as f:
        return json.loads(f.metadata()["meta"])


def _rewritten(source: Path, target: Path, change) -> Path:
    """A copy of the checkpoint ``source`` with its metadata's routes changed by ``change``."""
    from safetensors import safe_open
    from safetensors.numpy import save_file
    with safe_open(str(source), framework="numpy") as f:
        metadata = dict(f.metadata())
    about = json.loads(metadata["meta"])
    change(about)
    metadata["meta"] = json.dumps(about)
    target.parent.mkdir(parents=True)
    save_file(_weights(source), str(target), metadata=metadata)
    return target


def _set_route(about):
    about["routes"]["convolution_routes"]["weight_gradients"][0][1] = "fastest"


def _set_shape(about):
    about["routes"]["convolution_routes"]["weight_gradients"][0][0][0] = [1, "2", 3, 4]


def _set_foreign(about):
    about["routes"] = {"tensorrt_tactics": []}


def _set_list(about):
    about["routes"] = ["cudnn"]


@needs_cxx
@pytest.mark.parametrize("change, says", [
    (_set_route, "a weight gradient's entry is not [key, 'cudnn' or 'im2col', why]"),
    (_set_shape, "a key's shape is not four sizes"),
    (_set_foreign, "measured routes of 'tensorrt_tactics', which no gpu kernel takes"),
    (_set_list, "its measured routes are not a mapping"),
])
def test_a_checkpoint_with_corrupt_or_foreign_routes_is_refused_in_one_line(whole_run, tmp_path, change, says):
    import shutil
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(whole_run / "net.yaml", run / "net.yaml")
    bad = _rewritten(_checkpoint(whole_run), run / "checkpoints" / "iter_0000003.safetensors", change)
    report, err = _train(tmp_path, "im2col", "--resume", str(bad), "--out", str(tmp_path / "resumed"))
    assert report["status"] == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{bad}: not a readable checkpoint (" in lines[0], err[-3000:]
    assert lines[0].endswith(f"{says})"), lines


@needs_cxx
def test_a_resume_on_the_cpu_ignores_the_recorded_routes(whole_run, tmp_path):
    from toolkit.cli import main
    assert main(["train", "--resume", str(_checkpoint(whole_run)), "--out", str(tmp_path / "cpu")]) == 0
    assert (tmp_path / "cpu" / "model.safetensors").is_file()


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_a_resumed_run_takes_the_recorded_routes_on_the_device(tmp_path):
    """On the device: the first run's timer says cuDNN (and the fused call) is faster, the resumed
    process's says im2col (and two kernels); it takes the recorded routes and ends with the
    uninterrupted run's weights bit for bit."""
    import os
    import subprocess
    import sys

    def train(faster, *argv):
        result = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, faster, "train", *argv, "--device", "gpu"],
                                capture_output=True, text=True, cwd=ROOT, timeout=600, env=dict(os.environ))
        assert result.stdout.strip(), result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr
    whole, err = train("cudnn", str(ROOT / "zoo" / "lenet" / "net.yaml"), "--out", str(tmp_path / "whole"), *SETTINGS)
    assert whole["status"] == 0, err[-3000:]
    if whole["weight_gradients"] != ["cudnn"]:
        pytest.skip(f"cuDNN did not take the weight gradients here: {whole}")
    resumed, err = train("im2col", "--resume", str(_checkpoint(tmp_path / "whole")), "--out", str(tmp_path / "resumed"))
    assert resumed["status"] == 0, err[-3000:]
    assert resumed["weight_gradients"] == ["cudnn"] and resumed["fused"] == whole["fused"], resumed
    assert resumed["timed"] == 0, resumed
    want, got = _weights(tmp_path / "whole" / "model.safetensors"), _weights(tmp_path / "resumed" / "model.safetensors")
    differ = {k: float(np.abs(want[k].astype(np.float64) - got[k]).max()) for k in want
              if not np.array_equal(want[k], got[k])}
    assert not differ, differ

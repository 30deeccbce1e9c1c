"""Convolutions through cuDNN (kernels/gpu/dnn.py).

Unmarked tests run them on the numpy stand-in for CuPy with a host build of the cuDNN entry
points (tests/runtime/fake_cudnn.c), which checks every descriptor against the others and ranks a
non-deterministic algorithm first: every convolution case of the op table, in float32, float64
and float16, equals the CPU kernel through cuDNN; ``TOOLKIT_CUDNN=0`` and a library that cannot
be loaded fall back to the im2col kernels, which equal it too; LeNet trains to the CPU's losses
with its forward and input-gradient convolutions on cuDNN and its weight gradients on im2col (the
default), captured or not. The ``gpu`` test does the same on a device."""
from __future__ import annotations

import textwrap

import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available

needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")

CASES_SCRIPT = textwrap.dedent("""
    import sys
    from tests.runtime.gpu_stand_in import compare_case
    from tests.ops.op_cases import CASES, feeds, one_node_graph
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn
    dnn.CUDNN_OPS = set(dnn.BUILDERS)          # the weight gradient's cuDNN kernel too
    dtypes = sys.argv[1].split(",")
    ran, failures = 0, []
    for dtype in dtypes:
        for case in CASES:
            if not case.op.startswith("conv2d"):
                continue
            try:
                compare_case(case, dtype, feeds, one_node_graph)
            except Exception as e:
                failures.append(f"{dtype} {case.id}: {type(e).__name__}: {str(e)[:300]}")
            ran += 1
    assert not failures, "\\n".join(failures)
    print("chosen", sorted((k, v) for k, v in dnn.CHOSEN.items()))
    print("ran", ran)
""")


def _cases(tmp_path, dtypes: str, **env):
    result = run_stand_in(STAND_IN + RAW_MODULE + CASES_SCRIPT, tmp_path, dtypes, env_extra=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines()[-2:])
    return eval(lines["chosen"]), int(lines["ran"])


@needs_cxx
def test_every_convolution_case_through_cudnn_equals_the_cpu_kernel(tmp_path):
    chosen, ran = _cases(tmp_path, "float32,float64,float16")
    assert ran == 3 * 69           # 64 NCHW cases, and the 5 of the blocked layout (its im2col kernel)
    assert all(how == "cudnn" for (how, _op), _n in chosen), chosen
    assert {op for (_how, op), _n in chosen} == {"conv2d", "conv2d_grad_input", "conv2d_grad_weight",
                                                 "conv2d_max_pool2d"}


@needs_cxx
def test_the_switch_and_a_missing_library_fall_back_to_im2col(tmp_path):
    # "no", as any off word of docs/settings.md: only "0" switched cuDNN off before the settings table
    chosen, _ran = _cases(tmp_path, "float32", TOOLKIT_CUDNN="no")
    assert chosen == [(("im2col", "TOOLKIT_CUDNN=0"), 64)], chosen
    chosen, _ran = _cases(tmp_path, "float32", TOOLKIT_CUDNN_LIBRARY=str(tmp_path / "no-such-libcudnn.so"))
    assert len(chosen) == 1 and chosen[0][0][0] == "im2col" and "cuDNN cannot be loaded" in chosen[0][0][1], chosen


LENET_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn
    lenet = Net.load(sys.argv[1])
    runs = {}
    for device, capture in (("cpu", None), ("gpu", None), ("gpu", False)):
        plan, inputs = bench_plan(lenet, 4, True, device=device, capture=capture)
        runs[device, capture] = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(3)]
        if device == "gpu":
            assert plan.captured == (capture is None), plan.capture_blocker
    for a, b in zip(runs["gpu", None], runs["gpu", False]):
        for k in b:
            assert np.array_equal(a[k], b[k]), k                     # captured == kernel by kernel
    for step, (want, got) in enumerate(zip(runs["cpu", None], runs["gpu", None])):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=f"{step} {k}")
    assert {k for k in dnn.CHOSEN if k[0] == "im2col"} == {("im2col", dnn.WEIGHT_GRADIENT_REASON)}, dnn.CHOSEN
    print("ok", sorted(dnn.CHOSEN.items()))
""")


@needs_cxx
def test_lenet_trains_to_the_cpu_losses_with_cudnn_convolutions_captured_or_not(tmp_path):
    from tests.runtime.gpu_stand_in import ROOT
    result = run_stand_in(STAND_IN + RAW_MODULE + LENET_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml")
    assert result.returncode == 0 and result.stdout.strip().startswith("ok"), result.stderr[-3000:]
    assert ("('cudnn', 'conv2d_grad_input')" in result.stdout
            and "'conv2d_grad_weight'" not in result.stdout), result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_every_convolution_case_through_cudnn_on_the_device(dtype, monkeypatch):
    from tests.ops.op_cases import CASES, feeds, one_node_graph
    from tests.runtime.gpu_stand_in import compare_case
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn
    if dnn.unavailable():
        pytest.skip(dnn.unavailable())
    dnn.CHOSEN.clear()
    monkeypatch.setattr(dnn, "CUDNN_OPS", set(dnn.BUILDERS))
    for case in CASES:
        if case.op.startswith("conv2d"):
            compare_case(case, dtype, feeds, one_node_graph)
    fell_back = {k: v for k, v in dnn.CHOSEN.items() if k[0] == "im2col"}
    assert not fell_back, fell_back

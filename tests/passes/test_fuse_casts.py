"""The GPU's fused kernels take in a mixed-precision step's casts (passes/fuse_casts.py) and
BatchNorm's spread mean gradients (passes/fuse.py's spread_mean_gradients): fewer passes over
memory, the same values bit for bit. Run on the CuPy stand-in (tests/runtime/gpu_stand_in.py),
whose CUDA kernels are compiled for the host; on a GPU the same script runs on the device."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, ROOT, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available
from toolkit.frontend import Net

needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
RESNET = ROOT / "zoo" / "resnet" / "net.yaml"

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.ops.verify import verify
    import toolkit.passes.fuse as fuse

    def _host(a):
        return a.get() if hasattr(a, "get") else np.array(a)

    def activation(v):            # a value with the batch's symbolic size: an activation, not a weight
        return bool(v.shape) and not isinstance(v.shape[0], int)

    def steps(path, batch, dtype, disable=()):
        plan, inputs = bench_plan(Net.load(path), batch, True, dtype=dtype, device="gpu", disable=disable)
        verify(plan.graph)
        nodes = plan.graph.nodes
        counts = {"casts": sum(n.op == "cast" and activation(n.inputs[0]) for n in nodes),
                  "stored": sum("compute" in n.attrs for n in nodes),
                  "spreads": sum(n.op == "reduce_mean_grad" for n in nodes),
                  "kernels": len(nodes)}
        losses = [float(_host(plan.run(inputs)["loss"])) for _ in range(3)]
        weights = {k: _host(plan.memory.storage_of[w.value.id].external) for k, w in plan.graph.weights.items()}
        return counts, losses, weights

    path, batch, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    taken = steps(path, batch, dtype)
    kept = steps(path, batch, dtype, disable=("fuse_casts",))
    real_spread = fuse.spread_mean_gradients
    fuse.spread_mean_gradients = lambda graph, ctx: False
    unspread = steps(path, batch, dtype)
    fuse.spread_mean_gradients = real_spread
    print("counts", taken[0], kept[0], unspread[0])
    if dtype == "float16":
        # the casts of the BatchNorms' inputs, outputs and gradients are in fused kernels (four stay:
        # around the max pooling and the classifier); with the pass off none is
        assert taken[0]["casts"] <= 4 and kept[0]["casts"] >= 20 and taken[0]["stored"] >= 20, (taken[0], kept[0])
        assert taken[0]["kernels"] <= kept[0]["kernels"] - 20, (taken[0], kept[0])
    # one spread stays: the global average pooling's gradient, which a relu_grad reads whole
    assert taken[0]["spreads"] <= 1 and unspread[0]["spreads"] >= 13, (taken[0], unspread[0])
    for other in (kept, unspread):
        assert taken[1] == other[1], (taken[1], other[1])
        assert taken[2].keys() == other[2].keys() and taken[2]
        for k in taken[2]:
            np.testing.assert_array_equal(taken[2][k], other[2][k], err_msg=k)
    print("losses", taken[1])
    print("ok")
""")


@needs_cxx
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_casts_and_spreads_taken_into_fused_kernels_train_bit_for_bit_alike_on_the_stand_in(tmp_path, dtype):
    result = run_stand_in(STAND_IN + RAW_MODULE + SCRIPT, tmp_path, RESNET, 4, dtype)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_casts_and_spreads_taken_into_fused_kernels_train_bit_for_bit_alike_on_the_device(dtype):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(RESNET), "32", dtype], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_the_cpu_keeps_its_casts_and_its_mean_gradients_give_the_same_step():
    """The CPU's kernels compute in one dtype: its graphs keep their casts. Its fused groups do
    take the spread, and a train step gives the values the unfused graph gives."""
    from toolkit.benchmarking import bench_plan
    net = Net.load(str(RESNET))
    fused, inputs = bench_plan(net, 4, True, device="cpu")
    plain, _ = bench_plan(net, 4, True, device="cpu", disable=("fuse_elementwise",))
    assert not any("compute" in n.attrs for n in fused.graph.nodes)
    # the BatchNorms' spreads go; the global average pooling's, read whole by a relu_grad, stays
    assert sum(n.op == "reduce_mean_grad" for n in fused.graph.nodes) == 1
    assert sum(n.op == "reduce_mean_grad" for n in plain.graph.nodes) >= 13
    np.testing.assert_allclose(float(fused.run(inputs)["loss"]), float(plain.run(inputs)["loss"]), rtol=1e-6)
    for name, w in fused.graph.weights.items():
        np.testing.assert_allclose(fused.memory.storage_of[w.value.id].external,
                                   plain.memory.storage_of[plain.graph.weights[name].value.id].external,
                                   rtol=1e-5, atol=1e-7, err_msg=name)

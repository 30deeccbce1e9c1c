"""The GPU back end. Marked ``gpu``: every op with a GPU kernel equals the CPU kernel on a real
device (skipped where CuPy or a device is missing). Unmarked: the same back end's Python paths
(registration, device arenas, transfers both ways, placement of layers on the GPU) run in a
subprocess against a numpy stand-in for CuPy, so they are checked on every machine."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from toolkit.runtime.devices import gpu_available

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = textwrap.dedent("""
    import sys, types, contextlib, numpy
    fake = types.ModuleType("cupy")
    fake.__dict__.update({k: getattr(numpy, k) for k in dir(numpy) if not k.startswith("__")})
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1)
    fake.cuda = types.SimpleNamespace(runtime=runtime, Device=lambda i: contextlib.nullcontext())
    sys.modules["cupy"] = fake
""")

SCRIPT = STAND_IN + textwrap.dedent("""
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.commands.bench import bench_plan
    from toolkit.kernels.registry import KERNELS, KernelMissing, load_device
    load_device("gpu")
    import toolkit.kernels.gpu as gpu
    registered = {op for (op, dev, _t) in KERNELS.entries if dev == "gpu"}
    cpu_ops = {op for (op, dev, _t) in KERNELS.entries if dev == "cpu"}
    assert cpu_ops - registered == set(gpu.MISSING), sorted(cpu_ops - registered)
    net_text = open(sys.argv[1]).read()
    results = {}
    for name, text in (("cpu", net_text.replace("DEVICE", "")),
                       ("gpu", net_text.replace("DEVICE", "")),
                       ("placed", net_text.replace("DEVICE", ", device: gpu"))):
        path = sys.argv[2] + f"/{name}.yaml"
        open(path, "w").write(text)
        plan, inputs = bench_plan(Net.load(path), 5, False, device="gpu" if name == "gpu" else "cpu")
        results[name] = {k: np.array(v) for k, v in plan.run(inputs).items()}
        if name == "placed":
            moves = [n for n in plan.graph.nodes if n.op == "transfer"]
            assert {(n.attrs["src"], n.attrs["dst"]) for n in moves} == {("cpu", "gpu"), ("gpu", "cpu")}, moves
        if name == "gpu":
            assert not any(n.op.startswith("fused") for n in plan.graph.nodes)   # none registered on gpu
    for name in ("gpu", "placed"):
        for k, v in results["cpu"].items():
            np.testing.assert_allclose(results[name][k], v, rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")
    # a net that needs a kernel the GPU lacks fails when the plan is built, naming it
    try:
        bench_plan(Net.load(sys.argv[3]), 2, False, device="gpu")
    except KernelMissing as e:
        assert "on device 'gpu'" in str(e) and "conv2d" in str(e), e
    else:
        raise AssertionError("a conv net built a gpu plan")
    print("ok")
""")

MLP = """\
name: mlp
inputs:
  data: {shape: [N, 12], dtype: float32}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 16DEVICE}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1DEVICE}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 5}
  - {name: prob, type: Softmax, bottom: ip2, top: prob}
outputs: [prob]
"""


def test_gpu_back_end_paths_against_a_numpy_stand_in(tmp_path):
    (tmp_path / "mlp.txt").write_text(MLP)
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "mlp.txt"), str(tmp_path),
                             str(ROOT / "zoo" / "lenet" / "net.yaml")],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_gpu_kernel_equals_the_cpu_kernel(dtype):
    from tests.ops.test_op_table import CASES, feeds, one_node_graph
    from toolkit.kernels.registry import KERNELS, load_device
    from toolkit.runtime.plan import Plan, RuntimeState
    load_device("gpu")
    ran = 0
    for case in CASES:
        if not KERNELS.has(case.op, "gpu", dtype) or case.op == "transfer":
            continue
        arrays = case.inputs(dtype)
        outs = {}
        for device in ("cpu", "gpu"):
            graph, _vals, y = one_node_graph(case, arrays, case.attrs_for(dtype))
            graph.outputs["y"] = y
            plan = Plan(graph, {}, {}, device, RuntimeState(np.random.default_rng(0)), native=False)
            out = plan.run(feeds(arrays))["y"]
            outs[device] = out.get() if hasattr(out, "get") else np.array(out)
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(outs["gpu"], outs["cpu"], rtol=tol, atol=tol, err_msg=case.id)
        ran += 1
    assert ran > 50

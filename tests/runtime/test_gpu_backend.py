"""The GPU back end. Marked ``gpu``: every op with a GPU kernel equals the CPU kernel on a real
device (skipped where CuPy or a device is missing). Unmarked: the same back end's Python paths
(registration, device arenas, transfers both ways, placement of layers on the GPU) run in a
subprocess against a numpy stand-in for CuPy, so they are checked on every machine."""
from __future__ import annotations

import subprocess
import textwrap

import numpy as np
import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, ROOT, STAND_IN, compare_every_op, run_stand_in
from toolkit.backend.devices import gpu_available

SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.backend.registry import KERNELS, load_device
    load_device("gpu")
    from tests.runtime.gpu_stand_in import compare_every_op
    registered = {op for (op, dev, _t) in KERNELS.entries if dev == "gpu"}
    cpu_ops = {op for (op, dev, _t) in KERNELS.entries if dev == "cpu"}
    # pipeline stages run on the CPU only (train.distributed.stages refuses a GPU device)
    cpu_only = {"send", "recv"}
    assert cpu_ops - registered == cpu_only, sorted(cpu_ops - registered)
    ran = {dtype: compare_every_op(dtype) for dtype in ("float32", "float64", "float16")}
    assert min(ran.values()) > 80, ran
    print("op cases:", ran)

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
        if name == "gpu":       # the GEMM + bias + ReLU group is one fused epilogue on the GPU too
            assert any(n.op == "fused_epilogue" for n in plan.graph.nodes), [n.op for n in plan.graph.nodes]
    for name in ("gpu", "placed"):
        for k, v in results["cpu"].items():
            np.testing.assert_allclose(results[name][k], v, rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")

    # LeNet (convolution, pooling, fused groups, the loss): infer outputs and three train steps' losses
    lenet = Net.load(sys.argv[3])
    for train in (False, True):
        runs = {}
        for device in ("cpu", "gpu"):
            plan, inputs = bench_plan(lenet, 4, train, device=device)
            if device == "gpu":
                fused = {n.op for n in plan.graph.nodes if n.op.startswith(("fused", "conv2d_max"))}
                assert fused, "no fused op in the GPU plan"
            runs[device] = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(3 if train else 1)]
        for step, (want, got) in enumerate(zip(runs["cpu"], runs["gpu"])):
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=f"train={train} {step} {k}")
    print("fused on the GPU:", sorted(fused))
    print("ok")
""")

# the GPU's dropout: reproducible per seed, masks of 0 and 1/(1-ratio) kept at the right rate
DROPOUT_SCRIPT = STAND_IN + textwrap.dedent("""
    import numpy as np
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.ir.graph import Graph, TensorType, Value
    from toolkit.ops import Builder
    from toolkit.runtime.plan import Plan, RuntimeState
    def masks(seed, calls):
        g = Graph("dropout")
        x = g.inputs["x"] = Value(TensorType((64, 1000), "float32"), name="x")
        g.outputs["y"] = Builder(g, "drop").op("dropout_mask", x, ratio=0.3)
        plan = Plan(g, {}, {}, "gpu", RuntimeState(np.random.default_rng(seed)), native=False)
        return [np.array(plan.run({"x": np.zeros((64, 1000), np.float32)})["y"]) for _ in range(calls)]
    a, b, c = masks(0, 2) + masks(1, 1)
    again = masks(0, 2)
    assert all(np.array_equal(u, v) for u, v in zip((a, b), again)), "not reproducible"
    assert not np.array_equal(a, b) and not np.array_equal(a, c), "masks repeat across calls or seeds"
    scale = np.float32(1 / 0.7)
    for m in (a, b, c):
        assert set(np.unique(m).tolist()) == {0.0, float(scale)}, np.unique(m)
        kept = float(np.mean(m > 0))
        assert abs(kept - 0.7) < 0.01, kept          # 64000 draws: 5 standard deviations is 0.009
    # neighbouring elements are not correlated (a counter hash that failed to mix would be)
    flat = (a.ravel() > 0).astype(float)
    r = np.corrcoef(flat[:-1], flat[1:])[0, 1]
    assert abs(r) < 0.02, r
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


@pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
def test_gpu_back_end_paths_against_a_numpy_stand_in(tmp_path):
    (tmp_path / "mlp.txt").write_text(MLP)
    result = run_stand_in(SCRIPT, tmp_path, tmp_path / "mlp.txt", tmp_path, ROOT / "zoo" / "lenet" / "net.yaml")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_gpu_dropout_is_reproducible_and_keeps_the_right_fraction(tmp_path):
    result = run_stand_in(DROPOUT_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


# float16 on the GPU: LeNet's infer outputs against the CPU's float32; a mixed-precision train
# step with real float16 arrays against the CPU's (float16 stored as float32, rounded at casts)
HALF_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    lenet = Net.load(sys.argv[1])
    gpu_plan, gpu_in = bench_plan(lenet, 4, False, dtype="float16", device="gpu")
    cpu_plan, cpu_in = bench_plan(lenet, 4, False, device="cpu")
    halves = [v for n in gpu_plan.graph.nodes for v in n.outputs if v.dtype == "float16"]
    assert len(halves) >= 5, "the GPU infer plan does not compute in float16"
    got = np.array(gpu_plan.run({k: v.astype(np.float16) for k, v in cpu_in.items()})["prob"])
    want = cpu_plan.run(cpu_in)["prob"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, atol=5e-3)
    from toolkit.kernels.gpu import cuda
    halves = [src for src, _name in cuda._FUNCTIONS if "tk_f2h(" in src]
    assert halves, "no fused group was rendered to CUDA in float16"
    print("float16 CUDA units:", len(halves))
    # bench's inputs are unit normal where LeNet's data lie in [0, 1]: the gradients are large, and
    # a loss scale of 65536 overflows float16 in both runs (every step skipped), 256 does not
    for scale in (256.0, 65536.0):
        net = Net.load(sys.argv[1], overrides=[(("train", "solver", "mixed_precision"), {"init_scale": scale})])
        losses = {}
        for device in ("cpu", "gpu"):
            plan, inputs = bench_plan(net, 8, True, dtype="float16", device=device)
            ops = {(n.op, n.outputs[0].dtype) for n in plan.graph.nodes if n.outputs}
            if device == "gpu":
                assert any(t == "float16" and op.startswith(("conv2d", "fused", "matmul")) for op, t in ops), ops
            else:
                assert not any(t == "float16" for _op, t in ops), ops
            losses[device] = [float(plan.run(inputs)["loss"]) for _ in range(3)]
        np.testing.assert_allclose(losses["gpu"], losses["cpu"], rtol=2e-3, err_msg=str(scale))
        skipped = losses["gpu"][0] == losses["gpu"][1] == losses["gpu"][2]
        assert skipped == (scale == 65536.0) and skipped == (losses["cpu"][0] == losses["cpu"][2]), (scale, losses)
    print("ok")
""")


@pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
def test_float16_on_the_gpu_path_matches_float32_and_the_emulation(tmp_path):
    result = run_stand_in(HALF_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_every_gpu_kernel_equals_the_cpu_kernel(dtype):
    assert compare_every_op(dtype) > 80


# `toolkit train` on the GPU (the stand-in): the same metrics as on the CPU, the step scalars read
# back once per display interval, never every step
TRAIN_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import json
    from pathlib import Path
    from toolkit.frontend import Net
    from toolkit.training import scalars
    from toolkit.training.trainer import Trainer
    reads = []
    drain = scalars.StepScalars.drain
    def counted(self):
        reads.append(len(self.pending))
        return drain(self)
    scalars.StepScalars.drain = counted
    settings = {"max_iter": 7, "display": 3, "test_interval": 100, "snapshot": 100}
    net = Net.load(sys.argv[1], overrides=[(("train", k), v) for k, v in settings.items()]
                   + [(("train", "data", "batch_size"), 16)])
    logs = {}
    for device in ("cpu", "gpu"):
        reads.clear()
        out = Path(sys.argv[2]) / device
        assert Trainer(net, out, device=device).run() == 0
        logs[device] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        if device == "gpu":
            assert [r for r in reads if r] == [1, 3, 3], reads   # iterations 0, 1-3, 4-6
    assert [r["iter"] for r in logs["gpu"]] == [r["iter"] for r in logs["cpu"]], logs
    for want, got in zip(logs["cpu"], logs["gpu"]):
        for k, v in want.items():
            assert abs(got[k] - v) <= 1e-5 * max(1.0, abs(v)), (k, got, want)
    print("ok")
""")


@pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
def test_training_on_the_gpu_reads_the_loss_once_per_display_interval(tmp_path):
    result = run_stand_in(TRAIN_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml", tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.skipif(CXX is None, reason="compiling the conversions needs a C++ compiler (g++ or c++)")
def test_half_conversions_of_the_cuda_dialect_equal_numpy(tmp_path):
    """The portable float16 <-> float32 conversions the CUDA dialect falls back to off the device
    (where the tests run it): every one of the 65536 half bit patterns read, and float32 values
    across the range written (ties, subnormals, overflow to inf, nan), against numpy's."""
    import ctypes

    from toolkit.codegen.render import HALF_HELPERS
    source = ("#include <math.h>\n" + HALF_HELPERS +
              'extern "C" void read_all(const unsigned short *h, float *f, long n) '
              "{ for (long i = 0; i < n; i++) f[i] = tk_h2f(h[i]); }\n"
              'extern "C" void write_all(const float *f, unsigned short *h, long n) '
              "{ for (long i = 0; i < n; i++) h[i] = tk_f2h(f[i]); }\n")
    lib_path = tmp_path / "half.so"
    subprocess.run([CXX, "-O1", "-shared", "-fPIC", "-x", "c++", "-", "-o", str(lib_path)], input=source,
                   text=True, check=True)
    lib = ctypes.CDLL(str(lib_path))
    bits = np.arange(65536, dtype=np.uint16)
    got = np.empty(65536, np.float32)
    lib.read_all(ctypes.c_void_p(bits.ctypes.data), ctypes.c_void_p(got.ctypes.data), ctypes.c_long(65536))
    want = bits.view(np.float16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()

    rng = np.random.default_rng(0)
    halves = bits.view(np.float16).astype(np.float32)
    finite = halves[np.isfinite(halves)]
    middles = (finite[:-1] + np.diff(np.sort(finite))[:1]).astype(np.float32)    # exact ties
    values = np.concatenate([finite, np.sort(finite)[:-1] / 2 + np.sort(finite)[1:] / 2, middles,
                             rng.standard_normal(20000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 20000),
                             np.array([65504, 65519.99, 65520, 70000, 1e30, 3e-8, 2.9e-8, 6e-8, np.inf, -np.inf,
                                       np.nan], np.float32)]).astype(np.float32)
    out = np.empty(values.size, np.uint16)
    lib.write_all(ctypes.c_void_p(values.ctypes.data), ctypes.c_void_p(out.ctypes.data), ctypes.c_long(values.size))
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    nan = np.isnan(values)
    assert np.array_equal(out[~nan], expected.view(np.uint16)[~nan])
    assert np.isnan(out[nan].view(np.float16)).all()


# causal attention over a symbolic length on the GPU path: the mask's positions (iota) are computed
# when the plan binds T, on the host, and copied to the device once; infer and a train step
CAUSAL_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import sys
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    net = Net.load(sys.argv[1])
    for train in (False, True):
        for steps in (3, 6):
            runs = {}
            for device in ("cpu", "gpu"):
                plan, inputs = bench_plan(net, 2, train, device=device, dims={"T": steps})
                runs[device] = {k: np.array(v) for k, v in plan.run(inputs).items()}
            for k, want in runs["cpu"].items():
                np.testing.assert_allclose(runs["gpu"][k], want, rtol=2e-5, atol=1e-6, err_msg=f"{train} T={steps} {k}")
    # buckets over T: the session pads, the graph masks by the lengths, on the device as on the host
    from toolkit.runtime.session import InferSession
    bucketed = net.graph("infer", bucketed=frozenset({"T"}))
    weights = net.init_weights(seed=0)
    sessions = {d: InferSession(bucketed, weights, d, buckets=(1, 4), dim_buckets={"T": (4, 8)})
                for d in ("cpu", "gpu")}
    for steps in (3, 7):
        x = np.random.default_rng(steps).standard_normal((3, steps, 8)).astype(np.float32)
        want, got = (sessions[d].run({"data": x}) for d in ("cpu", "gpu"))
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=f"buckets T={steps} {k}")
    print("ok")
""")

CAUSAL_NET = """\
name: decoder
inputs:
  data: {shape: [N, T, 8], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: attn, type: MultiHeadAttention, bottom: data, top: att, num_heads: 2, causal: true}
  - {name: feat, type: Permute, bottom: att, top: feat, order: [0, 2, 1]}
  - {name: pool, type: Reduction, bottom: feat, top: pooled, operation: mean, axis: 2}
  - {name: fc, type: InnerProduct, bottom: pooled, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: fc, top: prob, phase: infer}
outputs: [prob]
"""


@pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
def test_causal_attention_over_a_symbolic_length_on_the_gpu_path(tmp_path):
    (tmp_path / "decoder.yaml").write_text(CAUSAL_NET)
    result = run_stand_in(CAUSAL_SCRIPT, tmp_path, tmp_path / "decoder.yaml")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]

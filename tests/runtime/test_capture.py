"""Captured GPU plans (runtime/capture.py) and the GEMMs a graph can capture (kernels/gpu/blas.py).

Unmarked tests run the GPU back end on the numpy stand-in for CuPy (gpu_stand_in.py), its
GEMMs on a host build of the cuBLAS entry points (fake_cublas.c) and its graphs on the graph
simulator (graph_simulator.py): a captured plan equals the same plan run kernel by kernel, bit
for bit, over several train steps (weights, momentum, dropout masks drawn anew each step); a plan
whose kernel reads the device from the host is refused at build time or at capture, says why,
and still runs. The ``gpu`` tests do the same on a real device."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, ROOT, STAND_IN, run_stand_in
from toolkit import settings
from toolkit.backend.devices import gpu_available

needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")

DROPOUT_NET = """\
name: dropmlp
inputs:
  data: {shape: [N, 12], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 16}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: drop, type: Dropout, bottom: ip1, top: ip1, dropout_ratio: 0.5}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 5}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: ip2, top: prob, phase: infer}
outputs: [prob]
train:
  solver: {type: sgd, base_lr: 0.1, momentum: 0.9}
"""

# Both plans from the same seed: the captured one is warmed (run 1), captured and launched
# (run 2), then replayed; every output and every weight after every step equals the plan run
# kernel by kernel, bit for bit
EQUAL_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from tests.runtime.graph_simulator import SimulatedGraphs
    for path, train, steps in ((sys.argv[1], True, 5), (sys.argv[1], False, 3), (sys.argv[2], True, 5)):
        net = Net.load(path)
        runs = {}
        for capture in (None, False):
            SimulatedGraphs.made.clear()
            plan, inputs = bench_plan(net, 4, train, device="gpu", capture=capture)
            start = {k: np.array(plan.memory.storage_of[w.value.id].external) for k, w in plan.graph.weights.items()}
            outs = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(steps)]
            weights = {k: np.array(plan.memory.storage_of[w.value.id].external) for k, w in plan.graph.weights.items()}
            runs[capture] = (outs, weights)
            if capture is None:
                assert plan.captured, (path, train, plan.capture_blocker)
                (backend,) = SimulatedGraphs.made
                assert backend.warmed == 1 and len(backend.graphs) == 1, (backend.warmed, backend.graphs)
                assert backend.graphs[0].launches == steps - 1
            else:
                assert not plan.captured and plan.capture_blocker == "capture is off for this plan"
        (got, got_weights), (want, want_weights) = runs[None], runs[False]
        for step, (a, b) in enumerate(zip(got, want)):
            for k in b:
                assert np.array_equal(a[k], b[k]), (path, train, step, k)
        assert got_weights.keys() == want_weights.keys()
        for k in want_weights:
            assert np.array_equal(got_weights[k], want_weights[k]), (path, k)
        if train:                       # the steps moved the weights (the comparison is not of starts)
            assert any(not np.array_equal(got_weights[k], start[k]) for k in start), path
        if train:
            if "dropmlp" in path:       # a new mask every step, not the one the capture saw
                losses = [float(o["loss"]) for o in got]
                assert len(set(losses)) == len(losses), losses
        print(path.rsplit("/", 1)[-1], "train" if train else "infer", "equal over", steps, "runs")
    print("ok")
""")


@needs_cxx
def test_a_captured_plan_equals_the_plan_run_kernel_by_kernel(tmp_path):
    (tmp_path / "dropmlp.yaml").write_text(DROPOUT_NET)
    result = run_stand_in(EQUAL_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml", tmp_path / "dropmlp.yaml")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


# An embedding checks its indices on the host: its plan is not captured, says so, and runs. A
# kernel that reads the device from the host only when it runs (no flag at build time) fails
# the capture: the plan says why once, runs kernel by kernel, and its values are right.
REFUSED_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import numpy as np
    from toolkit.backend.devices import to_host
    from toolkit.backend.registry import KERNELS, KernelEntry, load_device
    from toolkit.ir.graph import Graph, TensorType, Value
    from toolkit.ops import Builder
    from toolkit.runtime.plan import Plan, RuntimeState
    load_device("gpu")

    g = Graph("embed")
    table = g.inputs["table"] = Value(TensorType((10, 4), "float32"), name="table")
    index = g.inputs["index"] = Value(TensorType((6,), "int64"), name="index")
    g.outputs["y"] = Builder(g, "lookup").op("embedding", table, index, layer="lookup")
    plan = Plan(g, {}, {}, "gpu", RuntimeState(np.random.default_rng(0)), native=False)
    assert plan.capture_blocker == ("layer 'lookup': its embedding kernel checks its indices against the "
                                    "table on the host"), plan.capture_blocker
    t, i = np.arange(40, dtype=np.float32).reshape(10, 4), np.array([1, 3, 5, 7, 9, 0])
    for _ in range(3):
        assert np.array_equal(np.array(plan.run({"table": t, "index": i})["y"]), t[i])
    assert not plan.captured

    entry = KERNELS.entries[("exp", "gpu", "*")]
    def peeking(ctx):
        inner = entry.factory(ctx)
        def run(ins, outs):
            to_host(ins[0])                    # a host read in the middle of the run
            inner(ins, outs)
        return run
    KERNELS.entries[("exp", "gpu", "*")] = KernelEntry(peeking, entry.inplace)
    g = Graph("peek")
    x = g.inputs["x"] = Value(TensorType((3,), "float32"), name="x")
    g.outputs["y"] = Builder(g, "peek").op("exp", x)
    plan = Plan(g, {}, {}, "gpu", RuntimeState(np.random.default_rng(0)), native=False)
    assert plan.capture_blocker is None
    for value in (0.0, 1.0, 2.0):
        got = np.array(plan.run({"x": np.full(3, value, np.float32)})["y"])
        assert np.allclose(got, np.exp(value)), (value, got)
    assert not plan.captured and "reads a device value on the host" in plan.graph_run.failed

    # a kernel that writes a buffer the plan does not hold: freed after the capture, the next
    # launch would write into memory handed out since, and the simulator says so
    held = []
    def scratch_writer(ctx):
        inner = entry.factory(ctx)
        held.append(np.zeros(3, np.float32))
        def run(ins, outs, scratch=None):
            inner(ins, outs)
            np.copyto(held[0], outs[0])
        return run
    KERNELS.entries[("exp", "gpu", "*")] = KernelEntry(scratch_writer, entry.inplace)
    plan = Plan(g, {}, {}, "gpu", RuntimeState(np.random.default_rng(0)), native=False)
    for value in (0.0, 1.0):
        plan.run({"x": np.full(3, value, np.float32)})
    assert plan.captured
    held.clear()
    try:
        plan.run({"x": np.zeros(3, np.float32)})
    except AssertionError as e:
        assert "was freed while the graph lives" in str(e), e
    else:
        raise AssertionError("a launch after a written buffer was freed went unnoticed")
    print("ok")
""")


@needs_cxx
def test_a_plan_that_reads_the_device_from_the_host_is_not_captured_and_says_why(tmp_path):
    result = run_stand_in(REFUSED_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    assert "could not be captured as a CUDA graph (reads a device value on the host" in result.stderr


# blas.matmul on the host build of cuBLAS's entry points: numpy's matmul for transposed views,
# column and row slices, broadcast and flattened batches, one-row and one-column operands, an
# empty inner dimension, and each dtype
MATMUL_SCRIPT = STAND_IN + textwrap.dedent("""
    import numpy as np
    from toolkit.kernels.gpu import blas
    rng = np.random.default_rng(0)
    def check(a, b, dtype, tol):
        a, b = a.astype(dtype), b.astype(dtype)
        out = np.full(np.matmul(a, b).shape, np.nan, dtype)
        blas.matmul(a, b, out)
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        assert np.allclose(out, want, rtol=tol, atol=tol), (a.shape, a.strides, b.shape, b.strides, dtype)
    cases = []
    for m, k, n in ((3, 5, 4), (1, 7, 1), (6, 1, 2), (5, 4, 1), (1, 3, 8)):
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        cases += [(a, b), (np.ascontiguousarray(a.T).T, b), (a, np.ascontiguousarray(b.T).T),
                  (np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T)]
        wide = rng.standard_normal((m, k + 3))
        cases.append((wide[:, 1:k + 1], b))                               # a column slice: ld > k
        cases.append((rng.standard_normal((3, m, k)), b))                 # a batch against one matrix
        cases.append((a, rng.standard_normal((2, 3, k, n))))              # one matrix against a 2-d batch
        cases.append((rng.standard_normal((2, 1, m, k)), rng.standard_normal((3, k, n))))   # broadcast batches
        cases.append((rng.standard_normal((4, k, m)).swapaxes(-1, -2), rng.standard_normal((4, n, k)).swapaxes(-1, -2)))
    cases.append((rng.standard_normal((3, 0)), rng.standard_normal((0, 4))))   # k = 0: zeros
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12), (np.float16, 2e-2)):
        for a, b in cases:
            check(a, b, dtype, tol)
    # row-major out with a leading dimension (a column slice of a wider buffer)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    wide = np.zeros((3, 9), np.float32)
    blas.matmul(a, b, wide[:, 2:7])
    assert np.allclose(wide[:, 2:7], a @ b, atol=1e-5) and not wide[:, :2].any() and not wide[:, 7:].any()
    print("ok", len(cases))
""")


# A GEMM with its bias (and ReLU) in cuBLASLt's epilogue, on the host build of its entry points:
# every transpose pair and dtype against numpy; programs that are not exactly h + b or
# relu(h + b) keep their separate epilogue kernel
LT_SCRIPT = STAND_IN + textwrap.dedent("""
    import numpy as np
    from toolkit.kernels.gpu import lt
    rng = np.random.default_rng(0)
    m, k, n = 5, 7, 3
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12), (np.float16, 2e-2)):
        for ta in (False, True):
            for tb in (False, True):
                for epilogue, relu in ((lt.EPILOGUE_BIAS, False), (lt.EPILOGUE_RELU_BIAS, True)):
                    x = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
                    w = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
                    b = rng.standard_normal(n).astype(dtype)
                    out = np.full((m, n), np.nan, dtype)
                    lt.LtGemm(x.shape, w.shape, ta, tb, dtype, epilogue)(x, w, b, out)
                    want = (x.T if ta else x).astype(np.float64) @ (w.T if tb else w).astype(np.float64) + b
                    want = np.maximum(want, 0) if relu else want
                    assert np.allclose(out, want, rtol=tol, atol=tol), (dtype, ta, tb, relu)
    h, x2 = ("h",), ("x", 2)
    assert lt.bias_epilogue((("add", (h, x2), ()),), (0,), (), 3) == (lt.EPILOGUE_BIAS, 2)
    assert lt.bias_epilogue((("add", (x2, h), ()),), (0,), (), 3) == (lt.EPILOGUE_BIAS, 2)
    add_relu = (("add", (h, x2), ()), ("relu", (("t", 0),), ()))
    assert lt.bias_epilogue(add_relu, (1,), (), 3) == (lt.EPILOGUE_RELU_BIAS, 2)
    assert lt.bias_epilogue(add_relu, (0, 1), (), 3) is None   # h + b leaves too
    assert lt.bias_epilogue((("mul", (h, x2), ()),), (0,), (), 3) is None
    assert lt.bias_epilogue((("add", (h, x2), ()),), (0,), ((), (), (1, 0, 4)), 3) is None              # a view
    assert lt.bias_epilogue((("add", (h, x2), ()), ("exp", (("t", 0),), ())), (1,), (), 3) is None
    print("ok")
""")


@needs_cxx
def test_a_gemm_with_its_bias_and_relu_in_one_cublaslt_call_equals_numpy(tmp_path):
    result = run_stand_in(LT_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@needs_cxx
def test_gemms_through_our_cublas_handle_equal_numpy(tmp_path):
    result = run_stand_in(MATMUL_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().startswith("ok"), result.stderr[-3000:]


def test_a_gemm_before_the_workspace_is_set_after_the_stream_fails(tmp_path):
    """The host build of cuBLAS refuses a GEMM on a handle whose workspace was not set after its
    stream (cuBLAS would then allocate inside a captured graph): the order blas.py keeps is the
    one the stand-in checks on every GEMM of every test."""
    import ctypes

    from tests.runtime.gpu_stand_in import fake_cublas
    if CXX is None:
        pytest.skip("building the stand-in cuBLAS needs a C compiler")
    lib = ctypes.CDLL(fake_cublas(tmp_path))
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    a, c, workspace = np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32), np.zeros(16, np.uint8)
    one, zero = ctypes.c_float(1), ctypes.c_float(0)
    ptr, out = ctypes.c_void_p(a.ctypes.data), ctypes.c_void_p(c.ctypes.data)

    def gemm():
        return lib.cublasGemmEx(handle, 0, 0, 2, 2, 2, ctypes.byref(one), ptr, 0, 2, ptr, 0, 2,
                                ctypes.byref(zero), out, 0, 2, 68, -1)
    lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.ctypes.data), ctypes.c_size_t(16))
    lib.cublasSetStream_v2(handle, ctypes.c_void_p(0))
    assert gemm() == 15 and not c.any()        # the stream was set after the workspace
    lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.ctypes.data), ctypes.c_size_t(16))
    assert gemm() == 0 and np.all(c == 2)


def test_capture_is_off_on_the_host_and_with_the_switch():
    from toolkit.backend.devices import CPU, CudaDevice
    from toolkit.runtime import capture
    assert capture.capture_blocker([CPU, CudaDevice()], [], {}) == "it runs on cpu, which has no CUDA graphs"
    with settings.use(cuda_graphs=False):
        assert capture.capture_blocker([CudaDevice()], [], {}) == "TOOLKIT_CUDA_GRAPHS=0"
    with settings.use(cuda_graphs=True):
        assert capture.capture_blocker([CudaDevice()], [], {}) is None


DEVICE_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    for path, train in ((sys.argv[1], True), (sys.argv[1], False), (sys.argv[2], True)):
        net = Net.load(path)
        runs = {}
        for capture in (None, False):
            plan, inputs = bench_plan(net, 16, train, device="gpu", capture=capture)
            runs[capture] = [{k: np.asarray(v.get()) for k, v in plan.run(inputs).items()} for _ in range(4)]
            assert plan.captured == (capture is None), plan.capture_blocker
        for a, b in zip(runs[None], runs[False]):
            for k in b:
                assert np.array_equal(a[k], b[k]), (path, train, k)
    print("ok")
""")


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
@pytest.mark.skipif(os.environ.get("TOOLKIT_CUDA_GRAPHS", "1") == "0",
                    reason="TOOLKIT_CUDA_GRAPHS=0: nothing is captured, so there is nothing to compare")
def test_captured_plans_equal_eager_plans_on_a_device(tmp_path):
    (tmp_path / "dropmlp.yaml").write_text(DROPOUT_NET)
    result = subprocess.run([sys.executable, "-c", DEVICE_SCRIPT, str(ROOT / "zoo" / "lenet" / "net.yaml"),
                             str(tmp_path / "dropmlp.yaml")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


EMBED_NET = """\
name: embednet
inputs:
  words: {shape: [N, 5], dtype: int64}
  label: {shape: [N], dtype: int64}
layers:
  - {name: embed, type: Embed, bottom: words, top: vectors, num_output: 4, input_dim: 20}
  - {name: fc, type: InnerProduct, bottom: vectors, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss, phase: train}
outputs: [fc]
train:
  solver: {type: sgd, base_lr: 0.1}
"""

EXPLAIN_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    from toolkit.cli import main
    for path in sys.argv[1:]:
        for phase in ("infer", "train"):
            assert main(["compile", path, "--device", "gpu", "--phase", phase, "--explain"]) == 0
""")


@needs_cxx
def test_compile_explain_says_whether_a_gpu_plan_is_captured_and_why_not(tmp_path):
    (tmp_path / "embed.yaml").write_text(EMBED_NET)
    result = run_stand_in(EXPLAIN_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml", tmp_path / "embed.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("CUDA graph:")]
    assert lines[:2] == ["CUDA graph: captured after the first run, then one launch per run"] * 2, lines
    want = ("CUDA graph: not captured, the run is kernel by kernel: layer 'embed': its embedding kernel checks "
            "its indices against the table on the host")
    assert lines[2:] == [want] * 2, lines


# toolkit.load(..., warm=True) on the GPU: every bucket's plan is captured before the first
# request, and requests of every size (padded to a bucket, or cut into chunks) give the CPU's rows
WARM_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import numpy as np
    import toolkit
    from tests.runtime.graph_simulator import SimulatedGraphs
    gpu = toolkit.load(sys.argv[1], device="gpu", buckets=[1, 4, 16], warm=True)
    cpu = toolkit.load(sys.argv[1], buckets=[1, 4, 16])
    plans = list(gpu.session.plans.values())
    assert len(plans) == 3 and all(p.captured for p in plans), [(p.bindings, p.capture_blocker) for p in plans]
    launches = sum(g.launches for b in SimulatedGraphs.made for g in b.graphs)
    rng = np.random.default_rng(0)
    for rows in (1, 3, 4, 9, 16, 21):
        x = rng.random((rows, 1, 8, 8), dtype=np.float32)
        np.testing.assert_allclose(gpu.infer(data=x)["prob"], cpu.infer(data=x)["prob"], rtol=2e-5, atol=1e-6)
    assert sum(g.launches for b in SimulatedGraphs.made for g in b.graphs) > launches
    assert len(gpu.session.plans) == 3
    print("ok")
""")


@needs_cxx
def test_warm_buckets_on_the_gpu_are_captured_before_the_first_request(tmp_path):
    result = run_stand_in(WARM_SCRIPT, tmp_path, "zoo:lenet")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_the_bias_gradient_op_on_the_cpu_equals_numpy_and_is_never_made_there():
    from toolkit.benchmarking import bench_plan
    from toolkit.frontend import Net
    from toolkit.ir.graph import Graph, TensorType, Value
    from toolkit.ops import Builder
    from toolkit.runtime.plan import Plan, RuntimeState
    rng = np.random.default_rng(0)
    g_, x_ = rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    for keepdims in (True, False):
        graph = Graph("bias_grad")
        g = graph.inputs["g"] = Value(TensorType((6, 4), "float64"), name="g")
        x = graph.inputs["x"] = Value(TensorType((6, 3), "float64"), name="x")
        weight, bias = Builder(graph, "ip").op_multi("matmul_bias_gradient", g, x, keepdims=keepdims)
        graph.outputs.update({"w": weight, "b": bias})
        out = Plan(graph, {}, {}, "cpu", RuntimeState(np.random.default_rng(0))).run({"g": g_, "x": x_})
        np.testing.assert_allclose(out["w"], g_.T @ x_, rtol=1e-12)
        np.testing.assert_allclose(out["b"], g_.sum(0, keepdims=keepdims), rtol=1e-12)
    plan, _ = bench_plan(Net.load(str(ROOT / "zoo" / "lenet" / "net.yaml")), 4, True)
    assert not any(n.op == "matmul_bias_gradient" for n in plan.graph.nodes)


# On the GPU (the stand-in, its cuBLASLt the host build): the pass makes LeNet's two InnerProduct
# weight and bias gradients one BGRADB call each, and three train steps equal the same plan with
# the pass off (the sums are taken in another order: equal within float32 rounding)
BIAS_GRAD_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.kernels.gpu import lt
    calls = []
    real = lt.LtGemm.__call__
    def counted(self, *args):
        calls.append(self.epilogue)
        return real(self, *args)
    lt.LtGemm.__call__ = counted
    net = Net.load(sys.argv[1])
    runs = {}
    for disable in ((), ("fuse_bias_gradient",)):
        plan, inputs = bench_plan(net, 4, True, disable=disable, device="gpu")
        fused = [n for n in plan.graph.nodes if n.op == "matmul_bias_gradient"]
        assert len(fused) == (0 if disable else 2), [n.op for n in plan.graph.nodes]
        calls.clear()
        runs[disable] = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(3)]
        runs[disable].append({k: np.array(plan.memory.storage_of[w.value.id].external)
                              for k, w in plan.graph.weights.items()})
        assert (calls.count(lt.EPILOGUE_BGRADB) > 0) == (not disable), calls
    for a, b in zip(runs[()], runs[("fuse_bias_gradient",)]):
        for k in b:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    print("ok")
""")


@needs_cxx
def test_the_bias_gradient_is_one_cublaslt_call_on_the_gpu_and_equals_the_two_ops(tmp_path):
    result = run_stand_in(BIAS_GRAD_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]

"""Generated native kernels against the numpy kernels, and the compiler cache and fallbacks.

The op table (tests/ops) and the differential sweep (tests/passes) already run every plan with
native kernels where a compiler is present; here each op case and each zoo net is run both ways
and compared, and the toolchain's cache, atomic publication and no-compiler path are checked.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.codegen.tiny_kernels import fill_kernel
from toolkit import settings
from toolkit.benchmarking import bench_plan
from toolkit.codegen import toolchain
from toolkit.codegen.loops import Buf, For, Kernel, Names, Store, lift
from toolkit.codegen.render import CDialect, CudaDialect
from toolkit.errors import UserError
from toolkit.frontend import Net
from toolkit.runtime.plan import Plan, RuntimeState

ROOT = Path(__file__).resolve().parents[2]
HAVE_CC = toolchain.compiler() is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler on this machine (cc, gcc or clang, or $CC)")


@pytest.fixture(autouse=True)
def native_on():
    """The suite runs numpy kernels by default (tests/conftest.py); these tests need both."""
    with settings.use(native=True):
        yield
TOL = {"float32": 1e-5, "float64": 1e-12}


def _close(a, b, dtype, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(1.0, float(np.max(np.abs(b), initial=0.0)))
    np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype] * scale, err_msg=what)


def _op_cases():
    from tests.ops.op_cases import DETERMINISTIC
    from toolkit.backend.registry import KERNELS
    return [c for c in DETERMINISTIC if KERNELS.native(c.op, "cpu") is not None]


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_op_case_native_equals_numpy(dtype):
    from tests.ops.op_cases import feeds, one_node_graph
    ran_native = 0
    for case in _op_cases():
        arrays = case.inputs(dtype)
        graph, _, y = one_node_graph(case, arrays, case.attrs_for(dtype))
        graph.outputs["y"] = y
        outs = {}
        for native in (True, False):
            plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(0)), native=native)
            outs[native] = np.array(plan.run(feeds(arrays))["y"])
            ran_native += native and plan.impls.count("native")
        if outs[False].dtype.kind == "f":
            _close(outs[True], outs[False], str(outs[False].dtype), case.id)
        else:
            np.testing.assert_array_equal(outs[True], outs[False], err_msg=case.id)
    assert ran_native >= len(_op_cases()) // 2, "native builders declined most cases"


SPECIAL = [np.nan, 0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 2.5, -2.5]


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op,attrs,arity", [
    ("maximum", {}, 2), ("relu", {}, 1),
    ("max_pool2d", {"kernel": (3, 3), "stride": (2, 2), "pad": (0, 0), "ceil_mode": False}, 1)])
def test_native_max_min_keep_numpy_nan_and_signed_zero(op, attrs, arity, dtype):
    """The generated max/min (a select and a NaN test, vectorised) give numpy's results bit for
    bit on NaN, infinities and signed zeros: NaN from either side wins, ties keep the first."""
    from tests.ops.op_cases import Case, feeds, one_node_graph
    rng = np.random.default_rng(3)
    values = np.array(SPECIAL, dtype)
    if op == "max_pool2d":
        arrays = [rng.choice(values, (2, 3, 9, 9))]
    else:                                  # every pair of special values, 37 per row for the tail
        a, b = np.meshgrid(values, values)
        arrays = [np.tile(a.ravel(), 3)[:, None].repeat(37, 1), np.tile(b.ravel(), 3)[:, None].repeat(37, 1)][:arity]
    arrays = [x.astype(dtype) for x in arrays]
    graph, _, y = one_node_graph(Case(op, op, None, None), arrays, attrs)
    graph.outputs["y"] = y
    outs = {}
    for native in (True, False):
        plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(0)), native=native)
        outs[native] = np.array(plan.run(feeds(arrays))["y"])
        assert ("native" in plan.impls) == native
    np.testing.assert_array_equal(outs[True], outs[False])
    np.testing.assert_array_equal(np.signbit(outs[True]), np.signbit(outs[False]))
    assert np.isnan(outs[True]).any()


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("exponent", [2.0, 0.5, -0.5, 0.75, -0.75, 1.5])
def test_native_power_by_square_roots_is_within_three_ulp_of_numpy(exponent, dtype):
    """LRN's x^-0.75 and the other square-root exponents, generated as square roots: within 3 ulp
    of numpy's power on 1000 values (x^-0.75 rounds four times), and the same NaNs, infinities and
    signed zeros on the special values (-inf, -0, 0, tiny inputs, the largest finite)."""
    from tests.ops.op_cases import Case, feeds, one_node_graph
    special = np.array([-np.inf, -2.0, -0.0, 0.0, 1e-30, 1e-8, 0.3, 1.0, 2.5, 1e8, 3e38, np.inf, np.nan], dtype)
    values = np.concatenate([special, np.random.default_rng(5).uniform(0, 100, 1000).astype(dtype)])
    graph, _, y = one_node_graph(Case("power", "power", None, None), [values], {"exponent": exponent})
    graph.outputs["y"] = y
    plan = Plan(graph, {}, {}, native=True)
    got = np.array(plan.run(feeds([values]))["y"])
    assert plan.impls == ["native"]
    with np.errstate(all="ignore"):
        want = np.power(values, values.dtype.type(exponent))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    special_got, special_want = got[:special.size], want[:special.size]
    exact = ~np.isfinite(special_want) | (special_want == 0)
    np.testing.assert_array_equal(special_got[exact], special_want[exact])
    np.testing.assert_array_equal(np.signbit(special_got[exact]), np.signbit(special_want[exact]))
    finite = np.isfinite(want) & (want != 0)
    ulps = np.abs(got[finite] - want[finite]) / (np.spacing(np.abs(want[finite])))
    assert ulps.max() <= 3.0, ulps.max()


ZOO = sorted(p.parent.name for p in (ROOT / "zoo").glob("*/net.yaml"))
# Entries whose gradient is zero in exact arithmetic: an attention's key bias adds the same
# q.b_k to every score of a query, which softmax ignores. Adam divides the rounding noise left
# there by its own square root, a full-size step whose sign is the noise's, so two correct
# summation orders disagree on those entries and agree on the rest.
ZERO_GRADIENT_ENTRIES = {("transformer_digits", "attn.in_proj_bias"): slice(32, 64)}


@needs_cc
@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("batch,train", [(1, False), (5, False), (8, True)])
def test_zoo_net_native_equals_numpy(name, batch, train):
    """Inference outputs, and after a train step the loss and every updated weight and slot."""
    net = Net.load(str(ROOT / "zoo" / name / "net.yaml"))
    results = {}
    for native in (True, False):
        plan, inputs = bench_plan(net, batch, train)
        plan = _fresh_plan(plan, native)
        outs = {k: np.array(v) for k, v in plan.run(inputs).items()}
        weights = {k: np.array(plan.memory.storage_of[v.value.id].external) for k, v in plan.graph.weights.items()}
        results[native] = (outs, weights, plan.impls)
    assert "native" in results[True][2] and "native" not in results[False][2]
    for k in results[False][0]:
        _close(results[True][0][k], results[False][0][k], "float32", f"{name} output {k}")
    for k in results[False][1]:
        ours, theirs = results[True][1][k], results[False][1][k]
        noise = ZERO_GRADIENT_ENTRIES.get((name, k))
        if noise is not None:
            keep = np.ones(theirs.shape[0], bool)
            keep[noise] = False
            ours, theirs = ours[keep], theirs[keep]
        _close(ours, theirs, "float32", f"{name} weight {k}")


# MobileNet's building blocks at a small size: depthwise 3x3 (stride 1 and 2, a channel
# multiplier of 2) with BatchNorm + Scale + ReLU folded into the kernel's epilogue at inference,
# pointwise 1x1, an inverted-residual add, global pooling and a classifier
DEPTHWISE_NET = """\
name: dwnet
inputs:
  data: {shape: [N, 4, 12, 12], dtype: float32}
  label: {shape: [N], dtype: int64}
layers:
  - {name: dw1, type: Convolution, bottom: data, top: dw1, num_output: 4, kernel_size: 3, pad: 1, group: 4,
     bias_term: false}
  - {name: dw1_bn, type: BatchNorm, bottom: dw1, top: dw1, affine: false}
  - {name: dw1_scale, type: Scale, bottom: dw1, top: dw1, bias_term: true}
  - {name: dw1_relu, type: ReLU, bottom: dw1, top: dw1}
  - {name: pw1, type: Convolution, bottom: dw1, top: pw1, num_output: 4, kernel_size: 1, bias_term: false}
  - {name: add1, type: Eltwise, bottom: [data, pw1], top: add1}
  - {name: dw2, type: Convolution, bottom: add1, top: dw2, num_output: 8, kernel_size: 3, pad: 1, stride: 2, group: 4}
  - {name: dw2_relu, type: ReLU, bottom: dw2, top: dw2}
  - {name: pw2, type: Convolution, bottom: dw2, top: pw2, num_output: 6, kernel_size: 1}
  - {name: pool, type: Pooling, bottom: pw2, top: pool, pool: ave, global_pooling: true}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss, phase: train}
  - {name: prob, type: Softmax, bottom: fc, top: prob, phase: infer}
outputs: [prob]
train:
  solver: {type: sgd, base_lr: 0.05, momentum: 0.9}
"""


@needs_cc
@pytest.mark.parametrize("batch,train", [(1, False), (5, False), (4, True)])
def test_depthwise_blocks_native_equal_numpy(tmp_path, batch, train):
    """The direct depthwise kernels (forward with the folded BatchNorm/ReLU epilogue, both
    gradients) against the numpy kernels, and their code does not grow with the channels."""
    path = tmp_path / "dwnet.yaml"
    path.write_text(DEPTHWISE_NET)
    net = Net.load(str(path))
    results = {}
    for native in (True, False):
        plan, inputs = bench_plan(net, batch, train)
        plan = _fresh_plan(plan, native)
        runs = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(2 if train else 1)]
        weights = {k: np.array(plan.memory.storage_of[v.value.id].external) for k, v in plan.graph.weights.items()}
        results[native] = (runs, weights, plan)
    native_plan = results[True][2]
    assert "depthwise" in native_plan.native_source
    if train:
        assert ("depthwise_grad_input" in native_plan.native_source
                and "depthwise_grad_weight" in native_plan.native_source)
    for got, want in zip(results[True][0], results[False][0]):
        for k in want:
            _close(got[k], want[k], "float32", f"dwnet output {k}")
    for k in results[False][1]:
        _close(results[True][1][k], results[False][1][k], "float32", f"dwnet weight {k}")


def test_grouped_convolution_code_does_not_grow_with_the_groups():
    """The generated unit of a convolution with 8 groups and one with 256 are the same size
    but for their numbers: the groups are a loop, not unrolled (a MobileNet's unit was 16 MB)."""
    from toolkit.backend.registry import KERNELS, KernelContext
    from toolkit.codegen.native import dialect
    from toolkit.ir.graph import Node
    sizes = {}
    for groups, cg in ((8, 1), (256, 1), (8, 2), (256, 2)):
        c = groups * cg
        x_shape, w_shape = (1, c, 10, 10), (c, cg, 3, 3)
        attrs = dict(stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=groups)
        ctx = KernelContext(Node("conv2d", [], attrs, "conv"), attrs, [x_shape, w_shape], [(1, c, 10, 10)],
                            "float32", "cpu", None, np, threads=2)
        call = KERNELS.native("conv2d", "cpu")(ctx, [np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32)],
                                               [np.zeros((1, c, 10, 10), np.float32)])
        sizes[groups, cg] = len(dialect().unit([call.kernel]).splitlines())
    assert sizes[8, 1] == sizes[256, 1] and sizes[8, 2] == sizes[256, 2], sizes


@needs_cc
def test_cache_reuses_a_built_library(tmp_path):
    with settings.use(cache=tmp_path):
        source = CDialect().unit([fill_kernel(1.5)])
        first = toolchain.build(source)
        stamp = first.stat().st_mtime_ns
        assert toolchain.build(source) == first and first.stat().st_mtime_ns == stamp
        assert (first.parent / (first.stem + ".c")).read_text() == source
        other = toolchain.build(CDialect().unit([fill_kernel(2.5)]))
    assert first.parent.parent == tmp_path / "kernels"            # the setting chose the folder
    assert other != first
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")], "temporary files left behind"


@needs_cc
def test_concurrent_builds_publish_whole_libraries(tmp_path):
    """Two processes compiling the same unit at once both load a whole library."""
    script = ("import sys, ctypes, numpy as np\n"
              "from toolkit.codegen import toolchain\n"
              "from toolkit.codegen.render import CDialect\n"
              "from tests.codegen.tiny_kernels import fill_kernel\n"
              "lib = toolchain.load(CDialect().unit([fill_kernel(3.25)]))\n"
              "out = np.zeros(4, np.float32)\n"
              "args = np.array([out.ctypes.data], dtype=np.uintp)\n"
              "lib.fill(ctypes.c_void_p(args.ctypes.data))\n"
              "print(out.sum())\n")
    env = {**os.environ, "TOOLKIT_CACHE": str(tmp_path), "TOOLKIT_NATIVE": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert float(out) == 13.0
    assert len(list((tmp_path / "kernels").rglob("*.so"))) == 1


@pytest.mark.parametrize("how", ["no compiler on PATH", "TOOLKIT_NATIVE=0"])
def test_without_a_compiler_the_numpy_kernels_run_with_one_notice(tmp_path, how):
    env = {**os.environ, "TOOLKIT_CACHE": str(tmp_path / "cache")}
    env.pop("CC", None)
    env["TOOLKIT_NATIVE"] = "1"
    if how == "TOOLKIT_NATIVE=0":
        env["TOOLKIT_NATIVE"] = "0"
    else:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        os.symlink(sys.executable, bin_dir / "python")
        env["PATH"] = str(bin_dir)
    x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    cmd = [sys.executable, "-m", "toolkit.cli", "infer", "zoo:lenet", "--input",
           f"data={tmp_path / 'x.npy'}", "--output", str(tmp_path / "p.npy")]
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "C compiler" in line]
    assert len(notes) == (1 if how == "no compiler on PATH" else 0), result.stderr
    assert not (tmp_path / "cache" / "kernels").exists()
    prob = np.load(tmp_path / "p.npy")
    assert prob.shape == (3, 10) and np.allclose(prob.sum(1), 1, atol=1e-5)


def test_cuda_dialect_renders_the_same_program():
    """The GPU seam: a parallel loop program renders as a grid-stride CUDA kernel."""
    names = Names()
    x, y = Buf("x", "float32", 100), Buf("y", "float32", 100, const=False)
    i = names.var("i")
    k = Kernel("double_it", [x, y], [For(i, lift(0, "int64"), lift(100, "int64"),
                                         [Store(y, i, x[i] * 2.0)], parallel=True)], threads=2)
    cuda = CudaDialect().unit([k])
    assert '__global__ void double_it(const float *x, float *y)' in cuda
    assert "blockIdx.x * blockDim.x" in cuda and "omp" not in cuda
    c = CDialect().unit([k])
    assert "#pragma omp parallel for" in c and "y[i1] = (x[i1] * 2.0f);" in c


# A compiler that hangs: its driver starts a child that sleeps (as gcc starts cc1), writes the
# child's pid, and waits for it; every start is counted
HANGING_CC = """#!/bin/sh
case "$1" in --version) echo "hangcc 1.0"; exit 0;; esac
echo start >> "{log}"
sleep 600 &
echo $! > "{pid}"
wait
"""

BUCKETS_SCRIPT = """
import sys, numpy as np
from toolkit.frontend import Net
from toolkit.benchmarking import bench_plan
net = Net.load("zoo/lenet/net.yaml")
for batch in (2, 4, 8):
    plan, inputs = bench_plan(net, batch, False)
    ref, _ = bench_plan(net, batch, False)
    assert "native" not in plan.impls
    print(batch, float(np.abs(plan.run(inputs)["prob"] - ref.run(inputs)["prob"]).max()))
"""


def test_a_compile_past_its_timeout_is_stopped_with_its_children_and_not_repeated(tmp_path):
    """TOOLKIT_COMPILE_TIMEOUT=2 and a compiler that never finishes: the plan comes back running
    the numpy kernels after one notice, the compiler's child is gone, and the other batch sizes
    of the same net do not start the compiler again."""
    cc = tmp_path / "hangcc"
    log, pid = tmp_path / "starts.log", tmp_path / "child.pid"
    cc.write_text(HANGING_CC.format(log=log, pid=pid))
    cc.chmod(0o755)
    env = {**os.environ, "TOOLKIT_CACHE": str(tmp_path / "cache"), "TOOLKIT_NATIVE": "1", "CC": str(cc),
           "TOOLKIT_COMPILE_TIMEOUT": "2", "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", BUCKETS_SCRIPT], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30               # one 2 s timeout, not one per batch size
    assert log.read_text().count("start") == 1, log.read_text()
    notes = [line for line in result.stderr.splitlines() if "C compiler took over 2 s" in line]
    assert len(notes) == 1 and "was stopped" in notes[0], result.stderr
    child = int(pid.read_text())
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read().split()[2], \
        "the compiler's child outlived the timeout"
    assert all(float(line.split()[1]) == 0.0 for line in result.stdout.splitlines()), result.stdout


@needs_cc
def test_kernels_are_compiled_in_bounded_units(monkeypatch):
    """With a unit limit smaller than the plan's C, its kernels compile in several units (each
    under the limit) and the plan equals the one-unit plan; a kernel alone over the limit is not
    generated, and its step runs the numpy kernel."""
    from toolkit.codegen import native
    net = Net.load(str(ROOT / "zoo" / "resnet" / "net.yaml"))
    plan, inputs = bench_plan(net, 4, True)
    whole = _fresh_plan(plan, True)
    want = {k: np.array(v) for k, v in whole.run(inputs).items()}
    sizes = [len(native.dialect().kernel(c.kernel)) for c in _native_calls(whole)]
    limit = max(sizes) + 1
    monkeypatch.setattr(native, "MAX_UNIT_BYTES", limit)
    split = _fresh_plan(plan, True)
    assert len(split.made.linked) > 1 and all(len(linked.source) < limit + 20000 for linked in split.made.linked)
    got = {k: np.array(v) for k, v in split.run(inputs).items()}
    for k in want:
        _close(got[k], want[k], "float32", k)
    monkeypatch.setattr(native, "MAX_UNIT_BYTES", sorted(sizes)[len(sizes) // 2])
    partial = _fresh_plan(plan, True)
    assert "native" in partial.impls and "numpy" in partial.impls
    got = {k: np.array(v) for k, v in partial.run(inputs).items()}
    for k in want:
        _close(got[k], want[k], "float32", k)


FC_NET = """
name: fc
inputs:
  data: {shape: [N, 700]}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 1000}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2, num_output: 333}
"""


@needs_cc
@pytest.mark.parametrize("threads", [1, 2])
def test_fully_connected_at_batch_one_reads_the_weight_once(tmp_path, threads):
    """A row times a weight (batch 1) is dot products over the weight's rows, not the BLAS GEMM
    that packs all of it each call; split over two threads by output columns, with its fused
    bias and ReLU; equal to the numpy kernels."""
    (tmp_path / "net.yaml").write_text(FC_NET)
    net = Net.load(str(tmp_path / "net.yaml"))
    outs = {}
    for native in (True, False):
        with settings.use(threads=threads):
            plan, inputs = bench_plan(net, 1, False)
            plan = _fresh_plan(plan, native)
        outs[native] = np.array(plan.run(inputs)["ip2"])
        if native:
            assert "tk_sgemm(" not in plan.native_source
    _close(outs[True], outs[False], "float32", "fc batch 1")


def _fresh_plan(plan, native: bool) -> Plan:
    """The same graph and shapes planned again, from copies of the plan's starting weights."""
    return Plan(plan.graph, plan.bindings, {k: np.array(plan.memory.storage_of[v.value.id].external)
                                            for k, v in plan.graph.weights.items()}, native=native)


def _native_calls(plan):
    return [call for linked in plan.made.linked for call in linked.calls]


def test_a_compile_timeout_that_is_not_a_number_of_seconds_is_an_error_naming_it():
    for text in ("abc", "0", "-5", "inf"):
        with pytest.raises(UserError) as caught:
            settings.from_environment({"TOOLKIT_COMPILE_TIMEOUT": text})
        assert str(caught.value) == f"error: TOOLKIT_COMPILE_TIMEOUT={text}: expected a number of seconds above 0"
    assert toolchain.compile_timeout() == 300
    with settings.use(compile_timeout=settings.from_environment({"TOOLKIT_COMPILE_TIMEOUT": "2.5"}).compile_timeout):
        assert toolchain.compile_timeout() == 2.5

"""The GPU's per-channel sums and means (kernels/gpu/channel_reductions.py): reduce_sum and
reduce_mean over every axis but the channels, against numpy's float64 sums, on odd shapes and
each float dtype, with other axes left to the CuPy reduction. Unmarked: on the numpy stand-in for
CuPy, the kernels compiled for the host (one-lane warps). Marked ``gpu``: the same on a device at
ResNet-50's size, and a BatchNorm net's train steps with and without the kernels."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, ROOT, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available

needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")

# run by the stand-in script and by the device tests alike
HELPERS = textwrap.dedent("""
    import numpy as np
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.ir.graph import Graph, TensorType, Value
    from toolkit.ops import Builder
    from toolkit.runtime.plan import Plan, RuntimeState

    def reduce_on_gpu(x, op, axes, keepdims):
        g = Graph("reduce")
        v = g.inputs["x"] = Value(TensorType(tuple(x.shape), str(x.dtype)), name="x")
        g.outputs["y"] = Builder(g, "r").op(op, v, axes=tuple(axes), keepdims=keepdims)
        plan = Plan(g, {}, {}, "gpu", RuntimeState(np.random.default_rng(0)), native=False)
        out = plan.run({"x": x})["y"]
        return out.get() if hasattr(out, "get") else np.array(out)

    def channel_axes(rank, last=False):
        # every axis but the channels': axis 1, or the last (channels last; [N, C] is both)
        return tuple(range(rank - 1)) if last else tuple(i for i in range(rank) if i != 1)

    TOLERANCE = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3}

    def check(shape, dtype, op, axes, keepdims, seed=0):
        # values of one sign and signed ones: a relative error on sums that cancel is read
        # against the sum of magnitudes
        rng = np.random.default_rng(seed)
        for values in (rng.uniform(0.5, 1.5, shape), rng.standard_normal(shape)):
            x = values.astype(dtype)
            got = reduce_on_gpu(x, op, axes, keepdims)
            exact = x.astype(np.float64)
            want = np.sum(exact, axis=axes, keepdims=keepdims)
            size = np.sum(np.abs(exact), axis=axes, keepdims=keepdims)
            if op == "reduce_mean":
                count = exact.size // max(1, want.size)
                want, size = want / count, size / count
            assert got.shape == want.shape and got.dtype == x.dtype, (shape, dtype, got.shape, got.dtype)
            error = np.max(np.abs(got.astype(np.float64) - want) / np.maximum(size, 1e-300), initial=0.0)
            # float16 also rounds its result to 11 bits
            assert error <= TOLERANCE[dtype], (shape, dtype, op, axes, keepdims, error)
            again = reduce_on_gpu(x, op, axes, keepdims)
            same_bits = np.array_equal(got.reshape(-1).view(np.uint8), again.reshape(-1).view(np.uint8))
            assert same_bits, ("not repeatable", shape, dtype)

    # BatchNorm's sums as fused_reduce programs over x [N, C, ...], m [1, C, 1, ...], s a scalar:
    # (program, each operand's kind: 0 whole, 1 per channel, 2 one value, the outputs). The
    # variance's square(x - m); the backward's dy * (x - m) * s and a lone product; and the
    # backward's sums of dy, dy * x_hat and dy * w * xc in one pass (an operand reduced as it is)
    PROGRAMS = {
        "square(x - m)": ((("sub", (("x", 0), ("x", 1)), ()), ("square", (("t", 0),), ())), (0, 1), (("t", 1),)),
        "dy * (x - m) * s": ((("sub", (("x", 1), ("x", 2)), ()), ("mul", (("x", 0), ("t", 0)), ()),
                              ("mul", (("t", 1), ("x", 3)), ())), (0, 0, 1, 2), (("t", 2),)),
        "dy * x": ((("mul", (("x", 0), ("x", 1)), ()),), (0, 0), (("t", 0),)),
        "dy, dy * x_hat, dy * w * xc": ((("mul", (("x", 0), ("x", 1)), ()), ("mul", (("x", 0), ("x", 2)), ()),
                                         ("mul", (("t", 1), ("x", 3)), ())), (0, 0, 1, 0),
                                        (("x", 0), ("t", 0), ("t", 2))),
    }

    def fused_on(device, arrays, program, outputs, means, keepdims, last=False):
        g = Graph("fused")
        vals = []
        for k, a in enumerate(arrays):
            vals.append(Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{k}"))
            g.inputs[f"x{k}"] = vals[-1]
        axes = channel_axes(arrays[0].ndim, last)
        ys = Builder(g, "f").op_multi("fused_reduce", *vals, program=program, outputs=outputs, means=means,
                                      axes=axes, keepdims=keepdims)
        for k, y in enumerate(ys):
            g.outputs[f"y{k}"] = y
        plan = Plan(g, {}, {}, device, RuntimeState(np.random.default_rng(0)), native=False)
        got = plan.run({f"x{k}": a for k, a in enumerate(arrays)})
        return [got[f"y{k}"].get() if hasattr(got[f"y{k}"], "get") else np.array(got[f"y{k}"])
                for k in range(len(ys))]

    def check_fused(shape, dtype, name, mean, keepdims, seed=0, last=False):
        from toolkit.ops.fused_reduce import _reference
        program, kinds, outputs = PROGRAMS[name]
        means = tuple(mean if k % 2 == 0 else not mean for k in range(len(outputs)))   # both kinds in one node
        rng = np.random.default_rng(seed)
        channel = (1,) * (len(shape) - 1) + shape[-1:] if last else (1, shape[1]) + (1,) * (len(shape) - 2)
        made = {0: shape, 1: channel, 2: ()}
        arrays = [np.asarray(rng.standard_normal(made[k])).astype(dtype) for k in kinds]
        got = fused_on("gpu", arrays, program, outputs, means, keepdims, last)
        exact = [a.astype(np.float64) for a in arrays]
        attrs = dict(program=program, outputs=outputs, means=means, axes=channel_axes(len(shape), last),
                     keepdims=keepdims)
        want = _reference(*exact, **attrs)
        # the magnitudes summed: the program's values with every operand made positive
        size = _reference(*[np.abs(a) for a in exact], **attrs)
        want, size = (want, size) if len(outputs) > 1 else ((want,), (size,))
        assert len(got) == len(want), (name, len(got))
        for k, (g_k, w_k, s_k) in enumerate(zip(got, want, size)):
            s_k = np.abs(s_k) + np.abs(w_k)
            assert g_k.shape == w_k.shape and g_k.dtype == arrays[0].dtype, (name, k, g_k.shape, w_k.shape)
            error = np.max(np.abs(g_k.astype(np.float64) - w_k) / np.maximum(s_k, 1e-300), initial=0.0)
            # float16 rounds each product to 11 bits, as the tensor it stands for would be
            assert error <= 4 * TOLERANCE[dtype], (shape, dtype, name, k, means, keepdims, error)
        if dtype != "float16" and arrays[0].size < 10 ** 6:     # the CPU's kernel (float16 is the GPU's alone)
            cpu = fused_on("cpu", arrays, program, outputs, means, keepdims, last)
            for k, (c_k, g_k, s_k) in enumerate(zip(cpu, got, size)):
                np.testing.assert_allclose(c_k, g_k, rtol=1e-5 if dtype == "float32" else 1e-12,
                                           atol=1e-6 * np.max(np.abs(s_k)), err_msg=f"{name} {k}")
""")

STAND_IN_SCRIPT = STAND_IN + RAW_MODULE + HELPERS + textwrap.dedent("""
    from toolkit.kernels.gpu import channel_reductions, cuda

    def kernels_run():
        return {name for _src, name in cuda._FUNCTIONS if name.startswith(("tk_channel", "tk_column"))}

    # [N, C, H, W] with C = 3 and HW = 7x5, N = 1 and 5; a channel long enough for several
    # spans (two stages); [N, C] over its batch; [N, C, L]
    shapes = [(1, 3, 7, 5), (5, 3, 7, 5), (4, 3, 41, 37), (5, 3), (7, 2, 9)]
    for dtype in ("float32", "float64", "float16"):
        for shape in shapes:
            for op in ("reduce_sum", "reduce_mean"):
                for keepdims in (True, False):
                    check(shape, dtype, op, channel_axes(len(shape)), keepdims)
    # channels last: NHWC over (0, 1, 2) with C = 3 and 5, rows few and many (two stages)
    last_shapes = [(1, 7, 5, 3), (5, 7, 5, 3), (4, 41, 37, 5), (6, 5)]
    for dtype in ("float32", "float64", "float16"):
        for shape in last_shapes:
            for op in ("reduce_sum", "reduce_mean"):
                check(shape, dtype, op, channel_axes(len(shape), last=True), op == "reduce_mean")
    assert kernels_run() == {"tk_channel_partials", "tk_column_partials", "tk_channel_finish"}, kernels_run()
    # spans: enough warps to fill the device, none shorter than MIN_SPAN
    chunks_for, geometry = channel_reductions.chunks_for, channel_reductions.channel_geometry
    assert chunks_for(4, 3, 41 * 37) > 1 and chunks_for(4 * 41 * 37, 5, 1, True) > 1   # two stages ran
    assert chunks_for(64, 256, 56 * 56) == channel_reductions.TARGET_WARPS // 256      # res2 at batch 64
    assert chunks_for(64, 2048, 7 * 7) == -(-64 * 49 // channel_reductions.MIN_SPAN)   # res5
    assert chunks_for(64 * 56 * 56, 256, 1, True) == channel_reductions.MAX_CHUNKS        # NHWC res2
    assert chunks_for(2, 3, 5) == 1
    assert geometry((64, 256, 56, 56), (0, -1, -2)) == (64, 256, 3136, False)
    assert geometry((64, 56, 56, 256), (0, 1, 2)) == (64 * 56 * 56, 256, 1, True)
    assert geometry((8, 10), (0,)) == (8, 10, 1, True)
    assert geometry((8, 10, 3, 3), (0, 2)) is None and geometry((8,), (0,)) is None
    for dtype in ("float32", "float64", "float16"):
        for shape in ((1, 3, 7, 5), (5, 3, 7, 5), (4, 3, 41, 37)):
            for name in PROGRAMS:
                for mean in (False, True):
                    check_fused(shape, dtype, name, mean, keepdims=mean)
        for shape in ((5, 7, 5, 3), (4, 41, 37, 5), (5, 3)):
            for name in PROGRAMS:
                check_fused(shape, dtype, name, True, keepdims=True, last=True)
    # a strided operand (the planner leaves none today) is read through a contiguous copy
    from toolkit.backend.devices import parse_device
    from toolkit.backend.registry import KERNELS, KernelContext
    program, _kinds, outputs = PROGRAMS["dy * x"]
    attrs = {"program": program, "outputs": outputs, "means": (False,), "axes": (0, 2, 3), "keepdims": True}
    a, b = (np.random.default_rng(1).standard_normal((5, 3, 7, 5)).astype(np.float32) for _ in range(2))
    ctx = KernelContext(None, attrs, [a.shape, b.shape], [(1, 3, 1, 1)], "float32", parse_device("gpu"), xp=np)
    out = np.empty((1, 3, 1, 1), np.float32)
    KERNELS.lookup("fused_reduce", "gpu", "float32").factory(ctx)([np.asfortranarray(a), b], [out])
    np.testing.assert_allclose(out, np.sum(a.astype(np.float64) * b, axis=(0, 2, 3), keepdims=True), rtol=1e-5,
                               atol=1e-5)
    # other axes: the CuPy reduction this kernel keeps as its fallback
    for axes in ((0,), (1,), (2, 3), (0, 1, 2, 3)):
        check((5, 3, 7, 5), "float32", "reduce_sum", axes, False)
    print("ok")
""")


@needs_cxx
def test_channel_sums_and_means_equal_numpy_on_the_stand_in(tmp_path):
    result = run_stand_in(STAND_IN_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_channel_reductions_equal_numpy_on_the_device(dtype):
    namespace: dict = {}
    exec(HELPERS, namespace)
    check = namespace["check"]
    for shape in [(1, 3, 7, 5), (5, 3, 7, 5), (4, 3, 41, 37), (5, 3), (7, 2, 9)]:
        for op in ("reduce_sum", "reduce_mean"):
            for keepdims in (True, False):
                check(shape, dtype, op, namespace["channel_axes"](len(shape)), keepdims)
        for name in namespace["PROGRAMS"]:
            for mean in (False, True):
                namespace["check_fused"](shape, dtype, name, mean, keepdims=mean)
    for shape in [(1, 7, 5, 3), (5, 7, 5, 3), (4, 41, 37, 5), (6, 5)]:          # channels last
        for op in ("reduce_sum", "reduce_mean"):
            check(shape, dtype, op, namespace["channel_axes"](len(shape), True), op == "reduce_mean")
        for name in namespace["PROGRAMS"]:
            namespace["check_fused"](shape, dtype, name, True, keepdims=True, last=True)
    if dtype != "float64":          # a channel's sum of 200704 values of about 1 overflows float16: its mean
        for shape, last in (((64, 256, 56, 56), False), ((64, 56, 56, 256), True)):
            for op in ("reduce_sum", "reduce_mean") if dtype == "float32" else ("reduce_mean",):
                check(shape, dtype, op, namespace["channel_axes"](4, last), True)
            for name in namespace["PROGRAMS"]:
                namespace["check_fused"](shape, dtype, name, True, keepdims=True, last=last)


# zoo:resnet's train steps (BatchNorm in every block, SGD with momentum and weight decay) on the
# GPU with the channel kernels and fused reductions and with the setting off (CuPy's reductions,
# nothing fused): losses and weights equal to float32 rounding, and to the CPU's losses; the
# channel kernels ran and the fused reductions were made only where the setting was on
TRAIN_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from toolkit import settings
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.kernels.gpu import cuda
    from toolkit.ops.verify import verify

    def steps(path, batch, on, dtype):
        with settings.use(channel_reductions=on):
            before = set(cuda._FUNCTIONS)
            plan, inputs = bench_plan(Net.load(path), batch, True, dtype=dtype, device="gpu")
            ran = {name for _src, name in set(cuda._FUNCTIONS) - before if name.startswith(("tk_channel", "tk_column"))}
            fused = sum(len(n.outputs) for n in plan.graph.nodes if n.op == "fused_reduce")
            several = sum(len(n.outputs) > 1 for n in plan.graph.nodes if n.op == "fused_reduce")
            # 7 BatchNorms: the variance and a backward sum each; the backward's sums of dy, dy * x_hat
            # and dy * w * xc as one node (two BatchNorms of one residual sum share their dy's sum)
            assert (fused >= 14 and several >= 5) == on and (fused == 0) == (not on), (on, fused, several)
            verify(plan.graph)
            losses = [float(_host(plan.run(inputs)["loss"])) for _ in range(3)]
            weights = {k: _host(plan.memory.storage_of[w.value.id].external) for k, w in plan.graph.weights.items()}
        return losses, weights, ran

    def _host(a):
        return a.get() if hasattr(a, "get") else np.array(a)

    # float16: mixed precision, its convolutions' rounding to 11 bits between the sums
    path, batch, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None
    half = dtype == "float16"
    on, off = steps(path, batch, True, dtype), steps(path, batch, False, dtype)
    assert on[2] and not off[2], (on[2], off[2])
    np.testing.assert_allclose(on[0], off[0], rtol=2e-3 if half else 1e-5, atol=1e-6)
    assert on[1].keys() == off[1].keys() and on[1]
    for k in on[1] if not half else ():
        np.testing.assert_allclose(on[1][k], off[1][k], rtol=1e-5, atol=1e-6, err_msg=k)
    cpu_plan, cpu_inputs = bench_plan(Net.load(path), batch, True, dtype=dtype, device="cpu")
    cpu = [float(cpu_plan.run(cpu_inputs)["loss"]) for _ in range(3)]
    assert not any(n.op == "fused_reduce" for n in cpu_plan.graph.nodes)      # it pays on the GPU only
    np.testing.assert_allclose(on[0], cpu, rtol=5e-3 if half else 1e-4)
    print("losses", on[0], off[0], cpu)
    print("ok")
""")


@needs_cxx
def test_a_batchnorm_net_trains_alike_with_and_without_the_channel_kernels_on_the_stand_in(tmp_path):
    result = run_stand_in(STAND_IN + RAW_MODULE + TRAIN_SCRIPT, tmp_path, ROOT / "zoo" / "resnet" / "net.yaml", 8)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_batchnorm_net_trains_alike_with_and_without_the_channel_kernels_on_the_device(dtype):
    result = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT, str(ROOT / "zoo" / "resnet" / "net.yaml"), "64",
                             dtype], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_channel_sum_is_faster_than_cupys_on_resnet50s_largest_activation(layout):
    """[64, 256, 56, 56] float32 (205 MB), or its NHWC [64, 56, 56, 256]: the channel kernel's time
    and bandwidth against CuPy's reduction (the setting off), printed (pytest -s); equal sums, and
    not slower."""
    import cupy as cp
    import numpy as np

    from toolkit import settings
    from toolkit.backend.devices import parse_device
    from toolkit.backend.registry import KERNELS, KernelContext, load_device
    load_device("gpu")
    if layout == "NCHW":
        shape, axes, kept = (64, 256, 56, 56), (0, 2, 3), (1, 256, 1, 1)
    else:
        shape, axes, kept = (64, 56, 56, 256), (0, 1, 2), (1, 1, 1, 256)
    x = cp.random.standard_normal(shape, dtype=cp.float32)
    times, sums = {}, {}
    for on in (True, False):
        out = cp.empty(kept, cp.float32)
        with settings.use(channel_reductions=on):
            ctx = KernelContext(None, {"axes": axes, "keepdims": True}, [shape], [kept], "float32",
                                parse_device("gpu"), xp=cp)
            run = KERNELS.lookup("reduce_sum", "gpu", "float32").factory(ctx)
        for _ in range(3):
            run([x], [out])
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(20):
            run([x], [out])
        stop.record()
        stop.synchronize()
        times[on] = cp.cuda.get_elapsed_time(start, stop) / 20
        sums[on] = cp.asnumpy(out).astype(np.float64)
    gigabytes = x.nbytes / 1e9
    print(f"\nchannel sum of {layout} {list(shape)} float32: ours {times[True] * 1e3:.1f} us "
          f"({gigabytes / times[True] * 1e3:.0f} GB/s), CuPy's {times[False] * 1e3:.1f} us "
          f"({gigabytes / times[False] * 1e3:.0f} GB/s)")
    magnitude = float(cp.sum(cp.abs(x), axis=axes).max())
    np.testing.assert_allclose(sums[True], sums[False], rtol=0, atol=1e-5 * magnitude)
    assert times[True] <= 1.5 * times[False], times


# zoo:resnet on the GPU: the captured train step equals the one run kernel by kernel bit for bit
# (the channel kernels' sums are taken in a fixed order, no atomics), and mixed precision in
# float16, its fused reductions among float16 convolutions, trains as the CPU's emulation does
CAPTURE_SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    net = Net.load(sys.argv[1])
    runs = {}
    for capture in (None, False):
        plan, inputs = bench_plan(net, 4, True, device="gpu", capture=capture)
        assert any(n.op == "fused_reduce" for n in plan.graph.nodes)
        runs[capture] = [float(plan.run(inputs)["loss"]) for _ in range(4)]
        assert plan.captured == (capture is None), plan.capture_blocker
    assert runs[None] == runs[False], runs
    losses = {}
    for device in ("gpu", "cpu"):
        plan, inputs = bench_plan(net, 8, True, dtype="float16", device=device)
        if device == "gpu":         # BatchNorm's statistics stay float32 under mixed precision
            assert any(n.op == "fused_reduce" for n in plan.graph.nodes)
        losses[device] = [float(plan.run(inputs)["loss"]) for _ in range(3)]
    np.testing.assert_allclose(losses["gpu"], losses["cpu"], rtol=5e-3)
    print("ok")
""")


@needs_cxx
def test_a_captured_batchnorm_step_equals_kernel_by_kernel_and_float16_trains_on_the_stand_in(tmp_path):
    result = run_stand_in(CAPTURE_SCRIPT, tmp_path, ROOT / "zoo" / "resnet" / "net.yaml")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]

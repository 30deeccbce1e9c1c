"""Convolutions through cuDNN (kernels/gpu/dnn.py).

Unmarked tests run them on the numpy stand-in for CuPy with a host build of the cuDNN entry
points (tests/runtime/fake_cudnn.c), which checks every descriptor against the others and ranks a
non-deterministic algorithm first: every convolution case of the op table, in float32, float64
and float16, equals the CPU kernel through cuDNN; ``TOOLKIT_CUDNN=0`` and a library that cannot
be loaded fall back to the im2col kernels, which equal it too; LeNet trains to the CPU's losses
with its forward and input-gradient convolutions on cuDNN and its weight gradients on whichever
route a (replaced) timer says is faster, captured or not; a weight gradient's route is cuDNN
where im2col's column buffer is over the workspace bound, else the faster, kept per shapes, dtype
and policy; the float32 policy (the net file's ``precision`` key, the setting over it) reaches
every direction's math type (the fake records it, and reads TF32 operands where it is not FMA);
LeNet's mixed-precision bfloat16 step runs its convolutions whose operands were rounded to
bfloat16 on bfloat16 copies through cuDNN (CUDNN_DATA_BFLOAT16), as the CPU's emulation computes
them. The ``gpu`` tests do the same on a device, and hold tf32 to strict, cuDNN's weight gradient
to im2col's, a bfloat16 convolution to float32's."""
from __future__ import annotations

import json
import textwrap

import numpy as np
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
    from toolkit.kernels.gpu import dnn, dnn_bfloat16, dnn_epilogue, dnn_routes
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
    assert ran == 3 * 77           # 72 NCHW cases, and the 5 of the blocked layout (its im2col kernel)
    assert all(how == "cudnn" for (how, _op), _n in chosen), chosen
    assert {op for (_how, op), _n in chosen} == {"conv2d", "conv2d_grad_input", "conv2d_grad_weight",
                                                 "conv2d_max_pool2d"}


@needs_cxx
def test_the_switch_and_a_missing_library_fall_back_to_im2col(tmp_path):
    # "no", as any off word of docs/settings.md: only "0" switched cuDNN off before the settings table
    chosen, _ran = _cases(tmp_path, "float32", TOOLKIT_CUDNN="no")
    assert chosen == [(("im2col", "TOOLKIT_CUDNN=0"), 72)], chosen
    chosen, _ran = _cases(tmp_path, "float32", TOOLKIT_CUDNN_LIBRARY=str(tmp_path / "no-such-libcudnn.so"))
    assert len(chosen) == 1 and chosen[0][0][0] == "im2col" and "cuDNN cannot be loaded" in chosen[0][0][1], chosen


LENET_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, dnn_bfloat16, dnn_epilogue, dnn_routes
    faster = sys.argv[2]
    timed = []
    def fake_timer(run, shapes, out_shape, dtype):
        # the stand-in has no device to time: the route named on the command line is the faster
        if "epilogue" in run.__qualname__ or "two_kernels" in run.__qualname__:
            return None                                 # a fused epilogue's: not measured here
        route = "cudnn" if "_gradient" in run.__qualname__ else "im2col"
        timed.append((route, tuple(out_shape)))
        return 1.0 if route == faster else 2.0
    dnn_routes.seconds_on_device = fake_timer
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
    # each of the two weight gradients timed once on each route, for both plans
    assert sorted(timed) == sorted((r, s) for r in ("cudnn", "im2col") for s in ((16, 1, 3, 3), (32, 16, 3, 3))), timed
    print("ok", sorted(dnn.CHOSEN.items()))
""")


@needs_cxx
@pytest.mark.parametrize("faster", ["cudnn", "im2col"])
def test_lenet_trains_to_the_cpu_losses_with_its_weight_gradients_on_the_faster_route(tmp_path, faster):
    from tests.runtime.gpu_stand_in import ROOT
    result = run_stand_in(STAND_IN + RAW_MODULE + LENET_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml", faster)
    assert result.returncode == 0 and result.stdout.strip().startswith("ok"), result.stderr[-3000:]
    assert "('cudnn', 'conv2d_grad_input'), 2)" in result.stdout, result.stdout
    if faster == "cudnn":           # both plans' two weight gradients, on cuDNN
        assert "('cudnn', 'conv2d_grad_weight'), 4)" in result.stdout, result.stdout
    else:
        assert ("measured faster than cuDNN's deterministic algorithms\"), 4)" in result.stdout
                and "'conv2d_grad_weight'" not in result.stdout), result.stdout


ROUTE_SCRIPT = textwrap.dedent("""
    import types
    from toolkit.backend.registry import load_device
    from toolkit.settings import use
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, dnn_bfloat16, dnn_epilogue, dnn_routes
    timings, builds = [], []
    speeds = {}
    def fake_timer(run, shapes, out_shape, dtype):
        timings.append((run.route, tuple(shapes[1])))
        return speeds[run.route]
    original, dnn_routes.seconds_on_device = dnn_routes.seconds_on_device, fake_timer
    def candidate(route):
        def run(ins, outs):
            pass
        run.route = route
        return run
    def im2col_factory(ctx):
        builds.append(tuple(ctx.in_shapes[1]))
        return candidate("im2col")
    attrs = {"stride": (1, 1), "pad": (1, 1), "dilation": (1, 1), "group": 1}
    def ctx(x_shape, o, precision=None):
        n, _c, h, w = x_shape
        return types.SimpleNamespace(in_shapes=[(n, o, h, w), x_shape], out_shapes=[(o, x_shape[1], 3, 3)],
                                     attrs=attrs, dtype="float32", precision=precision)
    def route(c):
        got, why, run = dnn_routes.weight_gradient_route(c, candidate("cudnn"), im2col_factory)
        assert run.route == got, (got, run.route)
        return got, why
    # ResNet-50's first 3x3 layer at batch 256: 64 channels x 9 taps x 256 x 56 x 56 floats of columns
    big = (256, 64, 56, 56)
    assert dnn_routes.column_bytes(big, (64, 64, 3, 3), (256, 64, 56, 56), "float32") == 64 * 9 * 256 * 56 * 56 * 4
    speeds.update(cudnn=2.0, im2col=1.0)             # im2col faster where both are timed
    got, why = route(ctx(big, 64))
    assert got == "cudnn" and "1,764 MiB, over the 256 MiB workspace bound" in why, why
    assert timings == [] and builds == [], (timings, builds)
    # small: both timed once, the faster kept, and the choice kept for the process
    small = (4, 16, 8, 8)
    assert route(ctx(small, 32)) == ("im2col", dnn_routes.WEIGHT_GRADIENT_REASON)
    assert timings == [("cudnn", small), ("im2col", small)], timings
    assert {"shapes": "g[4, 32, 8, 8] x[4, 16, 8, 8] w[32, 16, 3, 3] float32 strict", "route": "im2col",
            "why": dnn_routes.WEIGHT_GRADIENT_REASON, "cudnn_us": 2e6,
            "im2col_us": 1e6} in dnn_routes.decisions()["weight_gradients"]
    speeds.update(cudnn=0.5)                         # a second measurement would now choose cuDNN
    assert route(ctx(small, 32))[0] == "im2col" and len(timings) == 2, timings
    # the policy is part of the key: under tf32 the same shapes are timed anew
    assert route(ctx(small, 32, precision="tf32"))[0] == "cudnn" and len(timings) == 4, timings
    with use(precision="tf32"):                      # the setting names the same policy: kept
        assert route(ctx(small, 32))[0] == "cudnn" and len(timings) == 4, timings
    # a smaller bound: a column buffer over it goes to cuDNN untimed
    with use(cudnn_workspace_mb=1):                  # 16 x 9 x 64 x 8 x 8 floats: 2.25 MiB
        got, why = route(ctx((64, 16, 8, 8), 32))
        assert got == "cudnn" and "2 MiB, over the 1 MiB workspace bound" in why and len(timings) == 4, (why, timings)
    # where nothing can be timed (the stand-in's own clock), im2col, as before the measurement
    dnn_routes.seconds_on_device = original
    assert route(ctx((2, 8, 8, 8), 8)) == ("im2col", dnn_routes.UNTIMED_REASON)
    print("ok")
""")


@needs_cxx
def test_the_weight_gradient_route_is_cudnn_over_the_bound_else_the_faster_kept_per_shape_and_policy(tmp_path):
    result = run_stand_in(STAND_IN + ROUTE_SCRIPT, tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


POLICY_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    from pathlib import Path
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.backend.registry import load_device
    from toolkit.settings import use
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, dnn_bfloat16, dnn_epilogue, dnn_routes
    dnn.CUDNN_OPS = set(dnn.BUILDERS)          # every direction through cuDNN
    seen = (ctypes.c_int * 3).in_dll(dnn.library(), "fake_cudnn_math")
    plain = Path(sys.argv[1]).read_text()
    tf32_file = Path(sys.argv[2]) / "lenet_tf32.yaml"
    tf32_file.write_text(plain + "precision: tf32\\n")
    def steps(net, device):
        plan, inputs = bench_plan(net, 4, True, device=device)
        return [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(3)]
    def math_of(net):
        for k in range(3):
            seen[k] = -1
        out = steps(net, "gpu")
        return list(seen), out
    cpu = steps(Net.load(sys.argv[1]), "cpu")
    runs = {"default": math_of(Net.load(sys.argv[1])), "net tf32": math_of(Net.load(str(tf32_file)))}
    with use(precision="strict"):              # the setting overrides the net file
        runs["setting strict"] = math_of(Net.load(str(tf32_file)))
    with use(precision="tf32"):
        runs["setting tf32"] = math_of(Net.load(sys.argv[1]))
    for name, (math, _out) in runs.items():
        print(name, math)
    def close(got, rtol, atol):
        for step, (want, have) in enumerate(zip(cpu, got)):
            for k in want:
                np.testing.assert_allclose(have[k], want[k], rtol=rtol, atol=atol, err_msg=f"{step} {k}")
    close(runs["default"][1], 2e-5, 1e-6)
    close(runs["setting strict"][1], 2e-5, 1e-6)
    close(runs["net tf32"][1], 1e-2, 1e-3)
    # TF32 reads 10 bits of mantissa: the tf32 step is not the strict one
    assert any(not np.array_equal(a[k], b[k]) for a, b in zip(runs["net tf32"][1], runs["default"][1]) for k in a)
    # toolkit bench --precision, over the net file's key, says which policy ran
    from toolkit.cli import main
    for k in range(3):
        seen[k] = -1
    main(["bench", str(tf32_file), "--batch", "2", "--iters", "1", "--warmup", "0", "--train", "--device", "gpu",
          "--precision", "strict", "--json"])
    print("bench", list(seen))
    # toolkit compile on the GPU says it too: the net file's key, no setting over it
    import contextlib, io, json
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        main(["compile", str(tf32_file), "--device", "gpu", "--json"])
    print("compile", json.loads(text.getvalue())["precision"])
""")


@needs_cxx
def test_the_precision_policy_reaches_every_direction_from_the_net_file_or_the_setting(tmp_path):
    from tests.runtime.gpu_stand_in import ROOT
    result = run_stand_in(STAND_IN + RAW_MODULE + POLICY_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml",
                          tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines.pop() == "compile tf32", lines
    report = json.loads(lines.pop(-2))
    assert (report["precision"], report["device"], report["mode"]) == ("strict", "gpu", "train"), report
    seen = dict(line.split(" [") for line in lines)
    fma, default = "3, 3, 3]", "0, 0, 0]"         # CUDNN_FMA_MATH; CUDNN_DEFAULT_MATH (TF32 allowed)
    assert seen == {"default": fma, "net tf32": default, "setting strict": fma, "setting tf32": default,
                    "bench": fma}, seen


BFLOAT16_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, dnn_bfloat16, dnn_epilogue, dnn_routes
    dnn.CUDNN_OPS = set(dnn.BUILDERS)          # every direction through cuDNN
    seen = (ctypes.c_int * 3).in_dll(dnn.library(), "fake_cudnn_type")
    lenet = Net.load(sys.argv[1])
    runs = {}
    for device, capture in (("cpu", None), ("gpu", None), ("gpu", False)):
        plan, inputs = bench_plan(lenet, 4, True, "bfloat16", device=device, capture=capture)
        runs[device, capture] = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(3)]
    for a, b in zip(runs["gpu", None], runs["gpu", False]):
        for k in b:
            assert np.array_equal(a[k], b[k]), k                     # captured == kernel by kernel
    worst = 0.0
    for step, (want, got) in enumerate(zip(runs["cpu", None], runs["gpu", None])):
        for k in want:
            scale = max(1.0, float(np.abs(want[k]).max()))
            worst = max(worst, float(np.abs(got[k] - want[k]).max()) / scale)
    assert worst < 2e-2, worst
    print("types", list(seen))
    print("bfloat16", sorted(dnn_bfloat16.IN_BFLOAT16.items()))
""")


@needs_cxx
def test_bfloat16_convolutions_run_in_bfloat16_through_cudnn_and_train_lenet_as_the_cpu_emulation(tmp_path):
    from tests.runtime.gpu_stand_in import ROOT
    result = run_stand_in(STAND_IN + RAW_MODULE + BFLOAT16_SCRIPT, tmp_path, ROOT / "zoo" / "lenet" / "net.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert lines["types"] == "[9, 9, 9]", lines          # CUDNN_DATA_BFLOAT16 in the three directions
    # both plans' two forward convolutions, conv2's input gradient and conv1's weight gradient (its
    # operand the input cast to bfloat16); conv2's weight gradient reads a ReLU's gradient and
    # the pooled activations, no rounded value: float32, rounded after
    counts = dict(eval(lines["bfloat16"]))
    assert counts == {"conv2d": 4, "conv2d_grad_input": 2, "conv2d_grad_weight": 2}, counts


EPILOGUE_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    from toolkit.frontend import Net
    from toolkit.benchmarking import bench_plan
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, dnn_bfloat16, dnn_epilogue, dnn_routes
    faster = sys.argv[2]
    timed = []
    def fake_timer(run, shapes, out_shape, dtype):
        route = "one call" if "epilogue_convolution" in run.__qualname__ else "two kernels"
        timed.append(route)
        return 1.0 if route == faster else 2.0
    if faster != "untimed":
        dnn_routes.seconds_on_device = fake_timer
    calls = ctypes.c_int.in_dll(dnn.library(), "fake_cudnn_fused_calls")
    resnet = Net.load(sys.argv[1])
    outs = {}
    for device, capture in (("cpu", None), ("gpu", None), ("gpu", False)):
        plan, inputs = bench_plan(resnet, 2, False, device=device, capture=capture)
        outs[device, capture] = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(2)]
    for a, b in zip(outs["gpu", None], outs["gpu", False]):
        for k in b:
            assert np.array_equal(a[k], b[k]), k
    for want, got in zip(outs["cpu", None], outs["gpu", None]):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)
    print("fused", sorted(dnn_routes.FUSED.items()))
    print("calls", calls.value)
    print("timed", len(timed))
""")


@needs_cxx
@pytest.mark.parametrize("faster", ["one call", "two kernels", "untimed"])
def test_resnet_infers_as_the_cpu_with_its_conv_bias_relu_epilogues_in_one_cudnn_call_where_faster(tmp_path, faster):
    from tests.runtime.gpu_stand_in import ROOT
    result = run_stand_in(STAND_IN + RAW_MODULE + EPILOGUE_SCRIPT, tmp_path, ROOT / "zoo" / "resnet" / "net.yaml",
                          faster)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    fused, calls, timed = dict(eval(lines["fused"])), int(lines["calls"]), int(lines["timed"])
    if faster == "one call":
        # both plans' epilogues, with and without the residual add, each run twice by cuDNN
        assert fused["relu(conv + b)"] > 0 and fused["relu(conv + b + z)"] > 0, fused
        assert calls >= 2 * sum(fused.values()), (calls, fused)
        # each shape timed once, both ways: the second plan's epilogues are decided already
        assert 0 < timed < 2 * sum(fused.values()) and timed % 2 == 0, (timed, fused)
    else:
        assert fused == {} and calls == 0, (fused, calls)


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


# A ResNet-style 3x3 layer (64 channels in and out, 28x28, batch 8) for the device's checks.
DEVICE_ATTRS = {"stride": (1, 1), "pad": (1, 1), "dilation": (1, 1), "group": 1}
DEVICE_X, DEVICE_W = (8, 64, 28, 28), (64, 64, 3, 3)


def _device_operands(op: str, dtype=np.float32):
    """(inputs, output shape, the float64 reference) of ``op`` on the ResNet-style layer."""
    from toolkit.ops.conv import conv2d_grad_input_reference, conv2d_grad_weight_reference, conv2d_reference
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(DEVICE_X), rng.standard_normal(DEVICE_W) / 24
    g = rng.standard_normal(DEVICE_X)          # the output's shape: same padding, stride 1
    geometry = {k: DEVICE_ATTRS[k] for k in ("stride", "pad", "dilation", "group")}
    if op == "conv2d":
        return [x, w], DEVICE_X, conv2d_reference(x, w, **geometry)
    if op == "conv2d_grad_input":
        return [g, w], DEVICE_X, conv2d_grad_input_reference(g, w, input_hw=DEVICE_X[2:], **geometry)
    return [g, x], DEVICE_W, conv2d_grad_weight_reference(g, x, kernel=DEVICE_W[2:], **geometry)


def _on_device(build, op: str, inputs, out_shape, dtype="float32", precision=None, rounded_to=None):
    """``build(ctx)``'s kernel run once on the device: its output as a float64 numpy array.
    ``rounded_to``: the node's operands are values rounded to that type (as passes/precision.py
    stores a cast to bfloat16 on a device without bfloat16 arrays)."""
    import cupy as cp

    from toolkit.backend.devices import parse_device
    from toolkit.backend.registry import KernelContext
    from toolkit.ir.graph import Node, TensorType, Value
    operands = []
    for a in inputs:
        rounding = Node("round_precision", [], {"dtype": rounded_to}, "device_check") if rounded_to else None
        operands.append(Value(TensorType(a.shape, dtype), rounding))
    ctx = KernelContext(Node(op, operands, dict(DEVICE_ATTRS), "device_check"), dict(DEVICE_ATTRS),
                        [a.shape for a in inputs], [out_shape], dtype, parse_device("gpu"), xp=cp,
                        precision=precision)
    out = cp.zeros(out_shape, dtype)
    build(ctx)([cp.asarray(a.astype(dtype)) for a in inputs], [out])
    cp.cuda.Device().synchronize()
    return cp.asnumpy(out).astype(np.float64)


def _relative(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _float32_bound(op: str) -> float:
    """How far a float32 result may stand from the float64 reference: roundings grow with the
    square root of the terms each output sums (8 x 28 x 28 = 6,272 for the weight gradient, 576
    for the others; an H100 measured 1.4e-5 for the weight gradient), never under 1e-5."""
    n, c, h, w = DEVICE_X
    terms = n * h * w if op == "conv2d_grad_weight" else c * DEVICE_W[2] * DEVICE_W[3]
    return max(1e-5, 2.5e-7 * terms ** 0.5)


def _device_dnn():
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn
    if dnn.unavailable():
        pytest.skip(dnn.unavailable())
    return dnn


@pytest.mark.parametrize("op", ["conv2d", "conv2d_grad_input", "conv2d_grad_weight"])
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_tf32_is_within_1e_2_of_strict_and_strict_within_1e_5_of_the_cpu_on_the_device(op):
    from toolkit.settings import use
    dnn = _device_dnn()
    inputs, out_shape, want = _device_operands(op)
    with use(precision="strict"):
        strict = _on_device(dnn.BUILDERS[op], op, inputs, out_shape)
    with use(precision="tf32"):
        tf32 = _on_device(dnn.BUILDERS[op], op, inputs, out_shape)
    # the net file's key, with no setting over it, is the same policy
    with use(precision=None):
        from_key = _on_device(dnn.BUILDERS[op], op, inputs, out_shape, precision="tf32")
    assert _relative(strict, want) < _float32_bound(op), (op, _relative(strict, want))
    assert _relative(tf32, strict) < 1e-2, (op, _relative(tf32, strict))
    assert _relative(from_key, strict) < 1e-2, (op, _relative(from_key, strict))
    print(op, "strict vs cpu", _relative(strict, want), "tf32 vs strict", _relative(tf32, strict))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_the_weight_gradient_through_cudnn_equals_im2col_and_is_chosen_over_the_bound_on_the_device():
    from toolkit.kernels.cpu.conv import CONV_KERNELS
    from toolkit.settings import use
    dnn = _device_dnn()
    from toolkit.kernels.gpu import arrays, dnn_routes
    op = "conv2d_grad_weight"
    inputs, out_shape, want = _device_operands(op)
    with use(precision="strict"):
        cudnn = _on_device(dnn.BUILDERS[op], op, inputs, out_shape)
        im2col = _on_device(arrays._over_cupy(CONV_KERNELS[op]), op, inputs, out_shape)
    assert _relative(cudnn, im2col) < 1e-4, _relative(cudnn, im2col)
    assert _relative(cudnn, want) < _float32_bound(op), _relative(cudnn, want)
    # ResNet-50's first 3x3 layer at batch 256: 1,764 MiB of columns, over the 256 MiB bound
    import types
    big = types.SimpleNamespace(in_shapes=[(256, 64, 56, 56), (256, 64, 56, 56)], out_shapes=[(64, 64, 3, 3)],
                                attrs=dict(DEVICE_ATTRS), dtype="float32", precision="strict")
    with use(cudnn_workspace_mb=256):
        route, why, _run = dnn_routes.weight_gradient_route(big, "cudnn kernel", lambda ctx: "im2col kernel")
    assert route == "cudnn" and "over the 256 MiB workspace bound" in why, why
    # a small layer is timed on the device, both routes, and the choice kept
    with use(precision="strict"):
        small = types.SimpleNamespace(in_shapes=[(8, 64, 28, 28), DEVICE_X], out_shapes=[DEVICE_W],
                                      attrs=dict(DEVICE_ATTRS), dtype="float32", precision="strict")
        built = dnn.BUILDERS[op](small)
        route, why, _run = dnn_routes.weight_gradient_route(small, built, arrays._over_cupy(CONV_KERNELS[op]))
    times = [t for key, t in dnn_routes.WEIGHT_GRADIENT_TIMES.items() if key[0] == (8, 64, 28, 28)]
    assert times and all(v is not None and v > 0 for v in times[0].values()), times
    print("weight gradient route", route, times[0])


@pytest.mark.parametrize("op", ["conv2d", "conv2d_grad_input", "conv2d_grad_weight"])
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_a_bfloat16_convolution_through_cudnn_is_within_2e_2_of_float32_on_the_device(op):
    from toolkit.ops.precision import round_to_bfloat16
    from toolkit.settings import use
    dnn = _device_dnn()
    inputs, out_shape, _want = _device_operands(op)
    inputs = [round_to_bfloat16(a.astype(np.float32)) for a in inputs]      # bfloat16 values, as float32
    with use(precision="strict"):
        float32 = _on_device(dnn.BUILDERS[op], op, inputs, out_shape)
        built = []
        bfloat16 = _on_device(lambda ctx: built.append(dnn.BUILDERS[op](ctx)) or built[0], op, inputs, out_shape,
                              rounded_to="bfloat16")
    assert built[0].operands == "bfloat16", built[0].operands
    # the result is bfloat16 (8 bits of mantissa) widened to float32
    as_bits = bfloat16.astype(np.float32).view(np.uint32)
    assert not np.any(as_bits & 0xFFFF), "a bfloat16 result has no low 16 bits"
    assert _relative(bfloat16, float32) < 2e-2, (op, _relative(bfloat16, float32))
    print(op, "bfloat16 vs float32", _relative(bfloat16, float32))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_conv_bias_residual_relu_in_one_cudnn_call_equals_the_cpu_on_the_device(residual):
    import cupy as cp

    from toolkit.ops.conv import conv2d_reference
    from toolkit.settings import use
    _device_dnn()
    from toolkit.kernels.gpu import dnn_epilogue
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(DEVICE_X), rng.standard_normal(DEVICE_W) / 24
    b, z = rng.standard_normal(DEVICE_W[0]), rng.standard_normal(DEVICE_X)
    geometry = {k: DEVICE_ATTRS[k] for k in ("stride", "pad", "dilation", "group")}
    want = np.maximum(conv2d_reference(x, w, b, **geometry) + (z if residual else 0), 0)
    with use(precision="strict"):
        fused = dnn_epilogue.BiasActivation(DEVICE_X, DEVICE_W, DEVICE_X, dict(DEVICE_ATTRS), "float32", "strict")
        x_d, w_d, b_d, z_d = (cp.asarray(a.astype(np.float32)) for a in (x, w, b, z))
        y = cp.zeros(DEVICE_X, np.float32)
        fused(x_d, w_d, b_d, z_d if residual else None, y)
        cp.cuda.Device().synchronize()
    got = cp.asnumpy(y).astype(np.float64)
    assert _relative(got, want) < 1e-5, _relative(got, want)

"""The GPU's pooling kernels (kernels/gpu/pooling.py): max and average pooling and their
gradients, NCHW and channels last, against the CPU kernels (kernels/cpu/pool.py, nhwc.py).
Unmarked: on the numpy stand-in for CuPy, the CUDA source compiled for the host. Marked ``gpu``:
the same on a device, and ResNet-50's pooling timed against the array programs it replaces."""
from __future__ import annotations

import textwrap

import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available

needs_cxx = pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")

POOL_OPS = ("max_pool2d", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad", "nhwc_max_pool2d",
            "nhwc_max_pool2d_backward", "nhwc_avg_pool2d", "nhwc_avg_pool2d_backward")

# run by the stand-in script and by the device tests alike
HELPERS = textwrap.dedent("""
    import numpy as np
    from toolkit.backend.registry import KERNELS, load_device
    load_device("gpu")
    from toolkit.ir.graph import Graph, TensorType, Value
    from toolkit.kernels.gpu import pooling
    from toolkit.ops import Builder
    from toolkit.runtime.plan import Plan, RuntimeState

    POOL_OPS = %r

    def host(a):
        return a.get() if hasattr(a, "get") else np.array(a)

    def run_op(device, op, arrays, attrs, capture=False):
        g = Graph("pool")
        values = []
        for k, a in enumerate(arrays):
            values.append(Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{k}"))
            g.inputs[f"x{k}"] = values[-1]
        g.outputs["y"] = Builder(g, "p").op(op, *values, **attrs)
        plan = Plan(g, {}, {}, device, RuntimeState(np.random.default_rng(0)), native=False,
                    capture=None if capture else False)
        return host(plan.run({f"x{k}": a for k, a in enumerate(arrays)})["y"]), plan

    # NCHW x shape, kernel, stride, pad, ceil_mode: ResNet's 3x3/2 with padding (windows
    # overlap), GoogLeNet's ceil-mode 3x3/2 (a partial last window), strides larger than the
    # window, a 1x1 window, an asymmetric one, and global pooling over more offsets than a byte
    # can number (the winners table in int)
    GEOMETRIES = [((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), False),
                  ((1, 2, 7, 7), (3, 3), (2, 2), (0, 0), True),
                  ((2, 2, 8, 7), (2, 2), (3, 3), (1, 1), True),
                  ((1, 2, 5, 5), (1, 1), (2, 2), (0, 0), False),
                  ((1, 3, 6, 5), (3, 2), (1, 2), (1, 1), True),
                  ((1, 2, 16, 17), (16, 17), (1, 1), (0, 0), False)]

    def pooled_shape(x_shape, kernel, stride, pad, ceil):
        from toolkit.ops.pool import pool_out_size
        n, c, h, w = x_shape
        return (n, c, pool_out_size(h, kernel[0], stride[0], pad[0], ceil),
                pool_out_size(w, kernel[1], stride[1], pad[1], ceil))

    def awkward_input(rng, shape):
        # ties (small integers), NaN, +-inf, and a channel of -inf alone (its windows' first
        # maximum can be a padded position, which passes its gradient to no input)
        x = rng.integers(0, 4, shape).astype(np.float64)
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=max(3, flat.size // 25), replace=False)
        third = len(picks) // 3
        flat[picks[:third]] = np.nan
        flat[picks[third:2 * third]] = -np.inf
        flat[picks[2 * third:]] = np.inf
        x[0, -1] = -np.inf
        return x

    def cases(rng):
        # (op, inputs as NCHW float64 arrays, attrs): every pooling op on every geometry
        for x_shape, kernel, stride, pad, ceil in GEOMETRIES:
            attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil)
            y_shape = pooled_shape(x_shape, kernel, stride, pad, ceil)
            x, smooth = awkward_input(rng, x_shape), rng.standard_normal(x_shape)
            g = rng.standard_normal(y_shape)
            yield "max_pool2d", [x], attrs
            yield "max_pool2d", [smooth], attrs
            yield "max_pool2d_grad", [g, x], attrs
            yield "max_pool2d_grad", [g, smooth], attrs
            for cip in (True, False):
                yield "avg_pool2d", [smooth], dict(attrs, count_include_pad=cip)
                yield "avg_pool2d", [x], dict(attrs, count_include_pad=cip)
                yield "avg_pool2d_grad", [g], dict(attrs, count_include_pad=cip, input_hw=x_shape[2:])

    def channels_last(op, arrays):
        return "nhwc_" + op.replace("_grad", "_backward"), [np.ascontiguousarray(a.transpose(0, 2, 3, 1))
                                                             for a in arrays]

    def check_against_cpu(dtype, rng, capture=False):
        # float32 and float64: the CPU kernel's results bit for bit (NaN where it has NaN);
        # float16: the CPU's float32 result on the same inputs, rounded once to float16
        ran = 0
        for op, arrays, attrs in cases(rng):
            for layout in ("nchw", "nhwc"):
                name, operands = (op, arrays) if layout == "nchw" else channels_last(op, arrays)
                operands = [a.astype(dtype) for a in operands]
                reference_dtype = "float32" if dtype == "float16" else dtype
                want, _ = run_op("cpu", name, [a.astype(reference_dtype) for a in operands], attrs)
                got, plan = run_op("gpu", name, operands, attrs, capture)
                assert got.dtype == np.dtype(dtype), (name, got.dtype)
                np.testing.assert_array_equal(got, want.astype(dtype), err_msg=f"{name} {dtype} {attrs}")
                again = host(plan.run({f"x{k}": a for k, a in enumerate(operands)})["y"])
                assert np.array_equal(got.view(np.uint8), again.view(np.uint8)), ("not repeatable", name)
                assert plan.captured == capture, (name, plan.capture_blocker)
                ran += 1
        return ran
""") % (POOL_OPS,)

STAND_IN_SCRIPT = STAND_IN + RAW_MODULE + HELPERS + textwrap.dedent("""
    import sys
    # captured (the CUDA graph simulator): its replay equals the first, uncaptured run bit for bit.
    # First, before the op table brings PyTorch in: the simulator walks the whole heap at each of
    # these 120 captures, and PyTorch's objects made each walk three times as long.
    assert "torch" not in sys.modules
    ran = check_against_cpu("float32", np.random.default_rng(4), capture=True)
    pooling.BUILT.clear()                 # what the op table builds is counted below, alone
    from tests.runtime.gpu_stand_in import compare_case
    from tests.ops.op_cases import CASES, feeds, one_node_graph
    # every op-table case of the pooling ops and of conv2d_max_pool2d, each float dtype
    table = 0
    for dtype in ("float32", "float16", "float64"):
        for case in CASES:
            if case.op in POOL_OPS + ("conv2d_max_pool2d",):
                compare_case(case, dtype, feeds, one_node_graph)
                table += 1
    # each op in each float dtype ran these kernels (conv2d_max_pool2d's pooling step too)
    assert set(pooling.BUILT) == {(op, d) for op in POOL_OPS + ("conv2d_max_pool2d",)
                                  for d in ("float32", "float16", "float64")}, sorted(pooling.BUILT)
    ran += sum(check_against_cpu(dtype, np.random.default_rng(3)) for dtype in ("float32", "float64", "float16"))
    # 64-bit element indices, as arrays of 2^31 elements and more take them
    pooling.MAX_BLOCKS = 2 ** 31
    assert "typedef long long IX" in pooling.Pooling((1, 1, 4, 4), (1, 1, 2, 2), dict(
        kernel=(2, 2), stride=(2, 2), pad=(0, 0)), "float32", False).unit
    ran += check_against_cpu("float64", np.random.default_rng(5))
    # each op's kernel on the GPU is this module's over the array program (one registration for
    # every dtype), and the plans above built it for each float dtype
    for op in POOL_OPS:
        chain = KERNELS.chains[op, "gpu", "*"]
        assert len(chain) == 2 and chain[-1].endswith(f"pooling.cuda_pooling_over_arrays[{op}]"), chain
    # quantized max pooling keeps the array program: a uint8 plan builds none of these kernels
    pooling.BUILT.clear()
    q = np.random.default_rng(0).integers(0, 255, (1, 2, 7, 7)).astype(np.uint8)
    attrs = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), ceil_mode=False)
    got, _ = run_op("gpu", "max_pool2d", [q], attrs)
    want, _ = run_op("cpu", "max_pool2d", [q], attrs)
    assert np.array_equal(got, want) and not pooling.BUILT, dict(pooling.BUILT)
    print(table, ran)
""")


@needs_cxx
def test_the_pooling_kernels_equal_the_cpu_kernels_on_the_stand_in(tmp_path):
    """Every op-table case (tolerances of tests/runtime/gpu_stand_in.py), then NaN, infinities,
    ties, padding, ceil_mode, overlapping and sparse windows, NCHW and NHWC, bit for bit, and a
    captured plan's replays equal to its first run."""
    result = run_stand_in(STAND_IN_SCRIPT, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    table, ran = map(int, result.stdout.split()[-2:])
    # per dtype: 9 NCHW geometries x (max, its gradient) + 16 x (avg, its gradient) + the ties case
    # + 4 conv2d_max_pool2d + 3 NHWC geometries x (max, 2 avg, their gradients)
    assert table == 3 * (9 * 2 + 16 * 2 + 1 + 4 + 3 * 5)
    assert ran == 5 * 6 * 10 * 2          # 3 dtypes, captured, 64-bit: 6 geometries x 10 cases x 2 layouts


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_the_pooling_kernels_equal_the_cpu_kernels_on_the_device(dtype):
    """As on the stand-in, each plan also captured as a CUDA graph: the same bits."""
    namespace: dict = {}
    exec(HELPERS, namespace)
    import numpy as np
    assert namespace["check_against_cpu"](dtype, np.random.default_rng(3)) == 120
    assert namespace["check_against_cpu"](dtype, np.random.default_rng(3), capture=True) == 120


@pytest.mark.gpu
@needs_gpu
def test_resnet50_pooling_is_not_slower_than_the_array_programs():
    """ResNet-50's stem pooling (3x3/2, pad 1, [64, 64, 112, 112]), forward and gradient, float32
    and float16, NCHW and NHWC: these kernels against the array programs they replace, each timed
    as the median of CUDA-event timings of 20 runs after warm-up."""
    import numpy as np

    from toolkit.backend.devices import parse_device
    from toolkit.backend.registry import KERNELS, KernelContext, load_device
    load_device("gpu")
    import cupy as cp

    from toolkit.ops.nhwc import nhwc_shape

    def median_ms(run, ins, outs):
        for _ in range(3):
            run(ins, outs)
        times = []
        for _ in range(20):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            run(ins, outs)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        return float(np.median(times))

    attrs = dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), ceil_mode=False)
    x_shape, y_shape = (64, 64, 112, 112), (64, 64, 56, 56)
    rng = np.random.default_rng(0)
    rows = []
    for dtype in ("float32", "float16"):
        for layout in ("nchw", "nhwc"):
            xs, ys = (x_shape, y_shape) if layout == "nchw" else (nhwc_shape(x_shape), nhwc_shape(y_shape))
            x = cp.asarray(rng.standard_normal(xs).astype(dtype))
            g = cp.asarray(rng.standard_normal(ys).astype(dtype))
            prefix = "" if layout == "nchw" else "nhwc_"
            for op, ins, in_shapes, out_shape in (("max_pool2d", [x], [xs], ys),
                                                  ("max_pool2d_grad", [g, x], [ys, xs], xs)):
                name = prefix + op.replace("_grad", "_backward") if prefix else op
                ctx = KernelContext(None, attrs, in_shapes, [out_shape], dtype, parse_device("gpu"), xp=cp)
                ours = KERNELS.lookup(name, "gpu", dtype).factory(ctx)
                array_program = KERNELS.portable(name, "gpu")["*"].factory(ctx)
                out_ours, out_theirs = cp.empty(out_shape, dtype), cp.empty(out_shape, dtype)
                ours(ins, [out_ours])
                array_program(ins, [out_theirs])
                # float16: the array program sums a gradient's terms in float16, these in float32
                exact = dtype == "float32"
                np.testing.assert_allclose(cp.asnumpy(out_ours).astype(np.float32), cp.asnumpy(out_theirs),
                                           rtol=0 if exact else 2e-3, atol=0 if exact else 1e-2)
                fast, slow = median_ms(ours, ins, [out_ours]), median_ms(array_program, ins, [out_theirs])
                rows.append((name, dtype, fast, slow))
    for name, dtype, fast, slow in rows:
        print(f"{name:26s} {dtype:8s} cuda {fast:7.3f} ms   array program {slow:7.3f} ms   {slow / fast:5.1f}x")
    assert all(fast <= slow for _n, _d, fast, slow in rows), rows

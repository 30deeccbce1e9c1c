"""Channels-last convolutions (kernels/gpu/nhwc.py) follow the float32 math policy as the NCHW
ones do, on the numpy stand-in for CuPy with the host build of cuDNN (which records each
direction's math type and reads TF32 operands where it is not FMA).

Each op's kernel is built directly (the layout pass puts float32 channels last only under tf32), on a one-node graph
of the op table's first float32 case: under ``precision: tf32`` (the graph's policy, or the
setting) cuDNN gets its default math (TF32 allowed) in all three directions, and the result is
the CPU kernel's within TF32's rounding; under strict it gets FMA and the CPU kernel's result
within float32's. The ``gpu`` test holds the same numbers on a device.
"""
from __future__ import annotations

import json
import textwrap

import pytest

from tests.kernels.one_node_plan import run_one_node
from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available

SCRIPT = textwrap.dedent("""
    import ctypes, json
    import numpy as np
    from tests.ops.op_cases import CASES
    from toolkit.backend.registry import load_device
    from toolkit.settings import use
    load_device("gpu")
    from toolkit.kernels.gpu import dnn, nhwc
    seen = (ctypes.c_int * 3).in_dll(dnn.library(), "fake_cudnn_math")
    DIRECTIONS = {"nhwc_conv2d": 0, "nhwc_conv2d_backward_data": 1, "nhwc_conv2d_backward_filter": 2}
    from tests.kernels.one_node_plan import run_one_node as run
    report = {}
    for op, k in DIRECTIONS.items():
        case = next(c for c in CASES if c.op == op)
        want = run(case, "cpu", None)
        scale = max(1.0, float(np.abs(want).max()))
        for how in ("strict", "tf32", "setting tf32"):
            seen[k] = -1
            if how == "setting tf32":
                with use(precision="tf32"):
                    got = run(case, "gpu", None)
            else:
                got = run(case, "gpu", how)
            error = float(np.abs(got - want).max()) / scale
            report[f"{op} {how}"] = [seen[k], error]
    print(json.dumps({"report": report, "chosen": sorted(how for how, _why in nhwc.CHOSEN)}))
""")


@pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
def test_a_float32_channels_last_convolution_takes_the_tf32_math_in_every_direction(tmp_path):
    result = run_stand_in(STAND_IN + RAW_MODULE + SCRIPT, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["chosen"] == ["cudnn"], got
    fma, default = 3, 0                   # CUDNN_FMA_MATH; CUDNN_DEFAULT_MATH (TF32 allowed)
    for name, (math, error) in got["report"].items():
        if name.endswith("strict"):
            assert math == fma and error < 1e-5, (name, math, error)
        else:
            assert math == default and error < 1e-2, (name, math, error)
    # TF32 reads 10 bits of mantissa: some direction's tf32 result is not the strict one's
    assert any(got["report"][name][1] > 1e-5 for name in got["report"] if name.endswith("tf32")), got


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with cupy (run on a GPU machine)")
def test_a_float32_channels_last_convolution_under_tf32_on_the_device():
    """On the device: each direction of a float32 channels-last convolution, strict within 1e-5
    of the CPU kernel, tf32 within 1e-2 (cuDNN may keep FMA kernels for the table's small cases)."""
    import numpy as np

    from tests.ops.op_cases import CASES
    from toolkit.backend.registry import load_device
    load_device("gpu")
    from toolkit.kernels.gpu import dnn
    if dnn.unavailable():
        pytest.skip(dnn.unavailable())
    run = run_one_node
    for op in ("nhwc_conv2d", "nhwc_conv2d_backward_data", "nhwc_conv2d_backward_filter"):
        case = next(c for c in CASES if c.op == op)
        want = run(case, "cpu", None)
        scale = max(1.0, float(np.abs(want).max()))
        for precision, tolerance in (("strict", 1e-5), ("tf32", 1e-2)):
            error = float(np.abs(run(case, "gpu", precision) - want).max()) / scale
            assert error < tolerance, (op, precision, error)

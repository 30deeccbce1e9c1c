"""The renderer's GPU seam, compiled and run: every elementwise op's loop program, rendered by
the CUDA dialect and compiled by NVRTC through cupy, equals the numpy kernel.

Marked ``gpu``: skipped (with the reason) where cupy or a CUDA device is missing.
"""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.codegen.render import CudaDialect
from toolkit.kernels.native.elementwise import _arrays_for, elementwise_kernel
from toolkit.ops import OPS
from toolkit.runtime.plan import Plan, RuntimeState

pytestmark = pytest.mark.gpu
TOL = {"float32": 1e-5, "float64": 1e-12}


def _elementwise_cases():
    from tests.ops.op_cases import DETERMINISTIC
    return [c for c in DETERMINISTIC if c.op in OPS and OPS[c.op].scalar_expr is not None]


def _run_cuda(case, arrays, attrs, out_shape, dtype):
    import cupy
    program = ((case.op, tuple(("x", i) for i in range(len(arrays))), tuple(sorted(attrs.items()))),)
    built = elementwise_kernel(f"tk_{case.op}", program, (0,), [a.shape for a in arrays], tuple(out_shape), dtype, (),
                               threads=2, min_parallel=0)
    if built is None:
        return None
    kernel, keys = built
    module = cupy.RawModule(code=CudaDialect().unit([kernel]), options=("--std=c++14",))
    function = module.get_function(kernel.name)
    out = cupy.empty(out_shape, dtype)
    device = _arrays_for(keys, [cupy.asarray(a) for a in arrays], [out])
    size = max(int(np.prod(out_shape)), 1)
    function(((size + 255) // 256,), (256,), tuple(device))
    return cupy.asnumpy(out)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_elementwise_op_rendered_to_cuda_equals_numpy(dtype):
    from tests.ops.op_cases import feeds, one_node_graph
    ran = 0
    for case in _elementwise_cases():
        arrays = case.inputs(dtype)
        if any(a.dtype != np.dtype(dtype) for a in arrays):
            continue
        attrs = case.attrs_for(dtype)
        graph, _, y = one_node_graph(case, arrays, attrs)
        graph.outputs["y"] = y
        plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(0)), native=False)
        want = np.array(plan.run(feeds(arrays))["y"])
        got = _run_cuda(case, arrays, attrs, want.shape, dtype)
        if got is None:
            continue
        ran += 1
        scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale, err_msg=case.id,
                                   equal_nan=True)
    assert ran >= 20, f"only {ran} elementwise cases ran on the GPU"

"""im2col by blocks of output rows (toolkit/kernels/native/conv.py): each block's columns copied,
multiplied and finished (bias, fused epilogue) while in cache, the threads taking blocks at
batch 1 and images otherwise, against PyTorch's conv2d: strides, padding, dilation, groups, a
last block shorter than the others, a residual add read over a range of positions, and an
epilogue that cannot take a range (it then runs over whole planes after the blocks)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import toolkit.kernels.native.conv as conv  # noqa: E402
from toolkit import settings  # noqa: E402
from toolkit.codegen import toolchain  # noqa: E402
from toolkit.compile import optimize  # noqa: E402
from toolkit.ir.graph import Graph, TensorType, Value  # noqa: E402
from toolkit.ops.base import Builder  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

pytestmark = pytest.mark.skipif(toolchain.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def native_on():
    with settings.use(native=True):
        yield


def _plan(rng, n, c, o, hw, k, stride, pad, dilation, group, tail, dtype, threads):
    g = Graph("infer")
    x = Value(TensorType((n, c, *hw), dtype), name="x")
    g.inputs["x"] = x
    b = Builder(g, "conv")
    weight = (rng.standard_normal((o, c // group, k, k)) * 0.2).astype(dtype)
    bias = rng.standard_normal(o).astype(dtype)
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(dtype)}
    y = b.op("conv2d", x, b.op("constant", value=weight), b.op("constant", value=bias), stride=(stride, stride),
             pad=(pad, pad), dilation=(dilation, dilation), group=group)
    with torch.no_grad():
        want = F.conv2d(torch.from_numpy(feeds["x"]), torch.from_numpy(weight), torch.from_numpy(bias),
                        stride=stride, padding=pad, dilation=dilation, groups=group).numpy()
    if tail == "residual":                 # an operand read position by position
        r = Value(TensorType(tuple(want.shape), dtype), name="r")
        g.inputs["r"] = r
        feeds["r"] = rng.standard_normal(want.shape).astype(dtype)
        y = b.op("relu", b.op("add", y, r))
        want = np.maximum(want + feeds["r"], 0)
    elif tail == "row-broadcast":           # varies along H only: no range of flat positions
        r = Value(TensorType((1, 1, want.shape[2], 1), dtype), name="r")
        g.inputs["r"] = r
        feeds["r"] = rng.standard_normal((1, 1, want.shape[2], 1)).astype(dtype)
        y = b.op("mul", y, r)
        want = want * feeds["r"]
    g.outputs["y"] = y
    # the pass pipeline, as a net is compiled: the bias and the epilogue fused into the convolution
    # the NCHW kernels under test: the layout pass would move 16-channel-multiple ones to NCHW16c
    return Plan(optimize(g, ("choose_layout",)), {}, {}, threads=threads), feeds, want


def _blocked(plan) -> bool:
    return any("blk" in line for line in plan.native_source.splitlines() if "for (" in line)


@pytest.mark.parametrize("n, c, o, hw, k, stride, pad, dilation, group, tail, threads", [
    (1, 3, 16, (33, 31), 3, 1, 1, 1, 1, "residual", 2),      # batch 1: the threads take blocks
    (1, 3, 16, (33, 31), 3, 1, 1, 1, 1, "residual", 1),
    (2, 4, 8, (29, 30), 5, 2, 2, 1, 1, None, 2),             # stride 2, an image per thread
    (1, 6, 12, (40, 21), 3, 1, 2, 2, 3, None, 1),            # dilation and groups
    (3, 5, 7, (30, 30), 7, 2, 3, 1, 1, "row-broadcast", 2),  # the epilogue after the blocks
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed-gemm", "blas"])
def test_blocked_im2col_equals_torch(rng, monkeypatch, n, c, o, hw, k, stride, pad, dilation, group, tail,
                                     threads, dtype, packed):
    # blocks of a few rows at these small sizes, so that every path runs several of them; with
    # the BLAS library the epilogue runs over each block's positions (the packed GEMM applies a
    # residual and a ReLU as it stores)
    monkeypatch.setattr(conv, "COLS_BLOCK_BYTES", 256)
    monkeypatch.setattr(conv, "MIN_BLOCK_POSITIONS", 40)
    with settings.use(packed_gemm=packed):
        plan, feeds, want = _plan(rng, n, c, o, hw, k, stride, pad, dilation, group, tail, dtype, threads)
    assert _blocked(plan)
    got = np.asarray(plan.run(feeds)["y"])
    tol = 2e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * float(np.abs(want).max()))


def test_small_images_keep_one_gemm(rng):
    """Columns that fit a block: the whole image is one im2col and one GEMM, as before."""
    plan, feeds, want = _plan(rng, 1, 8, 8, (12, 12), 3, 1, 1, 1, 1, None, "float32", 2)
    assert not _blocked(plan)
    np.testing.assert_allclose(np.asarray(plan.run(feeds)["y"]), want, rtol=0,
                               atol=2e-6 * float(np.abs(want).max()))

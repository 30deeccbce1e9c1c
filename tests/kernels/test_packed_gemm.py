"""The toolkit's own GEMM on a weight packed ahead (toolkit/codegen/microkernel.py), which the
forward convolutions use on AVX-512 and AVX2 processors: against PyTorch's conv2d over the shapes that
reach each of its edges (rows that do not fill a panel, columns that do not fill a vector or a
tile, K over one block, groups, each thread's rows from a panel boundary at batch 1), with the
weight frozen (packed when the plan is built) and fed at run time (packed in the kernel)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from toolkit import settings  # noqa: E402
from toolkit.codegen import microkernel, toolchain  # noqa: E402
from toolkit.compile import optimize  # noqa: E402
from toolkit.ir.graph import Graph, TensorType, Value  # noqa: E402
from toolkit.kernels.native import conv as native_conv  # noqa: E402
from toolkit.ops.base import Builder  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

pytestmark = pytest.mark.skipif(toolchain.compiler() is None or not microkernel.gemm_available(),
                                reason="needs a C compiler and an AVX-512 or AVX2+FMA processor")


@pytest.fixture(autouse=True)
def native_on(monkeypatch):
    # every K to the packed kernel, so that its blocks of K are tested on AVX2 processors too,
    # where convolutions take it below conv.AVX2_PACKED_MAX_K only
    monkeypatch.setattr(native_conv, "AVX2_PACKED_MAX_K", 1 << 30)
    with settings.use(native=True):
        yield


@pytest.mark.skipif(microkernel.available(), reason="the rule of a processor with AVX2 and not AVX-512")
@pytest.mark.parametrize("c, k, packed", [(28, 3, True), (255, 1, True), (256, 1, False), (64, 3, False)])
def test_avx2_takes_the_packed_kernel_below_one_block_of_k(rng, monkeypatch, c, k, packed):
    """On AVX2 the packed kernel wins where K fits one block of 256 and loses to OpenBLAS above
    it (conv.py's measurement): K = 28 * 9 and 255 take it, K = 256 and 64 * 9 the BLAS."""
    monkeypatch.setattr(native_conv, "AVX2_PACKED_MAX_K", 256)
    with settings.use(winograd=False):
        plan, feeds, want = _plan(rng, 1, c, 24, (9, 9), k, 1, k // 2, 1, True, 1)
    assert ("tk_pgemm_ep(" in plan.native_source) == packed
    np.testing.assert_allclose(np.asarray(plan.run(feeds)["y"]), want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


def test_panels_hold_each_row_in_its_lane():
    w = np.arange(11 * 5, dtype=np.float32).reshape(11, 5)
    p = microkernel.pack_panels(w).reshape(2, 5, microkernel.MR)
    np.testing.assert_array_equal(p[0], w[:8].T)
    np.testing.assert_array_equal(p[1][:, :3], w[8:].T)
    assert not p[1][:, 3:].any()


def _plan(rng, n, c, o, hw, k, stride, pad, group, frozen, threads):
    g = Graph("infer")
    x = Value(TensorType((n, c, *hw), "float32"), name="x")
    g.inputs["x"] = x
    b = Builder(g, "conv")
    weight = (rng.standard_normal((o, c // group, k, k)) / np.sqrt(c * k * k / group)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(np.float32), "b": bias}
    if frozen:
        wv = b.op("constant", value=weight)
    else:
        wv = Value(TensorType(weight.shape, "float32"), name="w")
        g.inputs["w"] = wv
        feeds["w"] = weight
    bv = Value(TensorType((o,), "float32"), name="b")
    g.inputs["b"] = bv
    g.outputs["y"] = b.op("relu", b.op("conv2d", x, wv, bv, stride=(stride, stride), pad=(pad, pad),
                                       dilation=(1, 1), group=group))
    with torch.no_grad():
        want = F.relu(F.conv2d(torch.from_numpy(feeds["x"]), torch.from_numpy(weight), torch.from_numpy(bias),
                               stride=stride, padding=pad, groups=group)).numpy()
    # the pass pipeline, as a net is compiled: the bias and the epilogue fused into the convolution
    # the NCHW kernels under test: the layout pass would move 16-channel-multiple ones to NCHW16c
    return Plan(optimize(g, ("choose_layout",)), {}, {}, threads=threads), feeds, want


@pytest.mark.parametrize("n, c, o, hw, k, stride, pad, group, threads", [
    (1, 300, 13, (7, 7), 1, 1, 0, 1, 1),       # 49 columns: 48 + a 1-column tile; K over a block
    (1, 64, 37, (7, 9), 1, 1, 0, 1, 2),        # batch 1, two threads: 40 rows each from a panel edge
    (2, 16, 24, (9, 11), 3, 1, 1, 1, 2),       # im2col, an image per thread
    (1, 8, 20, (40, 33), 3, 2, 1, 1, 2),       # strided
    (2, 12, 18, (10, 10), 3, 1, 1, 3, 1),      # groups: each group's panels after the other's
    (1, 32, 64, (16, 16), 1, 1, 0, 1, 1),      # 256 columns: whole tiles only
    # grouped at batch 1 on two threads (AlexNet's conv2 and conv5): the groups side by side, or
    # the blocks of output rows where an image's columns are blocked
    (1, 96, 256, (27, 27), 5, 1, 2, 2, 2),
    (1, 384, 256, (13, 13), 3, 1, 1, 2, 2),
    (1, 12, 18, (9, 9), 3, 1, 1, 3, 2),        # three groups on two threads
])
@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "fed"])
def test_packed_gemm_convolution_equals_torch(rng, n, c, o, hw, k, stride, pad, group, threads, frozen):
    with settings.use(winograd=False):
        plan, feeds, want = _plan(rng, n, c, o, hw, k, stride, pad, group, frozen, threads)
    assert "tk_pgemm_ep(" in plan.native_source
    got = np.asarray(plan.run(feeds)["y"])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


def test_switched_off_keeps_the_blas_library(rng):
    with settings.use(packed_gemm=False):
        plan, feeds, want = _plan(rng, 1, 16, 16, (6, 6), 1, 1, 0, 1, True, 1)
    assert "tk_pgemm_ep(" not in plan.native_source and "tk_sgemm(" in plan.native_source
    np.testing.assert_allclose(np.asarray(plan.run(feeds)["y"]), want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("hw", [(1, 1), (4, 4)], ids=["one position", "16 positions"])
def test_fewer_columns_than_a_tile_keep_other_kernels(rng, hw):
    """Under a tile's 48 columns the packed kernel wastes lanes and its fixed costs lose (the
    zoo's LeNet on 8x8 digits, 16 positions, was 2% slower): the BLAS library, or at one
    position (a classifier as a 1x1 convolution) dot products over the weight's rows."""
    plan, feeds, want = _plan(rng, 1, 64, 40, hw, 1, 1, 0, 1, True, 1)
    assert "tk_pgemm_ep(" not in plan.native_source
    np.testing.assert_allclose(np.asarray(plan.run(feeds)["y"]), want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("c, o, threads", [(64, 40, 1), (1283, 13, 1), (70, 1001, 2), (9, 3, 1)])
def test_one_position_takes_dot_products_over_the_weight_rows(rng, c, o, threads):
    """A classifier as a 1x1 convolution over one position (MobileNet v2's 1280 x 1000): dot
    products of the input with each weight row (codegen/rowdot.py), four rows at a time and the
    rest one by one, a masked last vector where K is not a multiple of the vector."""
    plan, feeds, want = _plan(rng, 1, c, o, (1, 1), 1, 1, 0, 1, True, threads)
    assert "tk_rowdot(" in plan.native_source
    np.testing.assert_allclose(np.asarray(plan.run(feeds)["y"]), want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("n, c, o, hw, threads, relu", [
    (1, 300, 21, (7, 9), 1, True),      # K over a block: the epilogue on the last block's store only
    (1, 64, 37, (7, 9), 2, True),       # batch 1, two threads, each from a panel edge
    (3, 16, 24, (9, 11), 2, False),     # an image per thread, the residual alone
])
def test_bias_residual_and_relu_applied_as_the_tile_is_stored(rng, monkeypatch, n, c, o, hw, threads, relu):
    """relu(conv(x) + b + r) in one pass: the bias, the residual and the ReLU go into the packed
    GEMM's store (no pass over the output after it), equal to PyTorch, a NaN kept by the ReLU."""
    g = Graph("infer")
    x = Value(TensorType((n, c, *hw), "float32"), name="x")
    r = Value(TensorType((n, o, *hw), "float32"), name="r")
    g.inputs.update(x=x, r=r)
    b = Builder(g, "conv")
    weight = (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    y = b.op("add", b.op("conv2d", x, b.op("constant", value=weight), b.op("constant", value=bias), stride=(1, 1),
                         pad=(0, 0), dilation=(1, 1), group=1), r)
    g.outputs["y"] = b.op("relu", y) if relu else y
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(np.float32),
             "r": rng.standard_normal((n, o, *hw)).astype(np.float32)}
    feeds["r"][0, 1, 0, 0] = np.nan
    plan = Plan(optimize(g, ("choose_layout",)), {}, {}, threads=threads)
    call = [line for line in plan.native_source.splitlines() if "tk_pgemm_ep(" in line and "ldb" not in line]
    assert call and all(", NULL, " not in line for line in call)      # a bias and a residual passed
    assert "tk_maxf" not in plan.native_source.split("tk_pgemm_ep(", 2)[-1]   # no ReLU pass after it
    with torch.no_grad():
        want = F.conv2d(torch.from_numpy(feeds["x"]), torch.from_numpy(weight), torch.from_numpy(bias)).numpy() + \
            feeds["r"]
    want = np.where(np.isnan(want), want, np.maximum(want, 0)) if relu else want
    got = np.asarray(plan.run(feeds)["y"])
    assert np.isnan(got[0, 1, 0, 0])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.nanmax(np.abs(want))))


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx2", "-mno-fma")],
                         ids=["AVX2 tile", "plain C"])
def test_a_compiler_without_avx512_compiles_the_plain_form(rng, monkeypatch, flags):
    """A compiler that does not target AVX-512 on this processor (here: told not to) compiles the
    AVX2 tile, and one that targets neither the plain C form of the same kernel, equal to
    PyTorch, bias, residual, ReLU and NaN included, rather than failing the unit."""
    monkeypatch.setattr(toolchain, "FLAGS", toolchain.FLAGS + flags)
    for args in [(1, 300, 21, (7, 9), 1, 1, 0, 1, True, 1), (2, 12, 18, (10, 10), 3, 1, 1, 3, False, 1)]:
        plan, feeds, want = _plan(rng, *args)
        assert "tk_pgemm_ep(" in plan.native_source
        assert plan.impls.count("native") == len(plan.impls)        # compiled, not the numpy fallback
        np.testing.assert_allclose(np.asarray(plan.run(feeds)["y"]), want, rtol=0,
                                   atol=2e-6 * float(np.abs(want).max()))

"""The hand-vectorised 3x3 depthwise plane function (toolkit/codegen/depthwise3x3.py) that
MobileNet's depthwise layers take on an AVX2 processor: against PyTorch's conv2d with the bias
and a ReLU fused, at stride 1 and 2, padded or not, with a channel multiplier, across the widths
that reach its edges (masked loads at either end, the last vector overlapping the one before it,
rows of fewer than 8 outputs, the pairs of output rows and the odd row after them), a
NaN kept by the ReLU; where it does not apply the loop language's kernel stays."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from toolkit import settings  # noqa: E402
from toolkit.codegen import toolchain  # noqa: E402
from toolkit.compile import optimize  # noqa: E402
from toolkit.ir.graph import Graph, TensorType, Value  # noqa: E402
from toolkit.kernels.native import depthwise  # noqa: E402
from toolkit.ops.base import Builder  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

pytestmark = pytest.mark.skipif(toolchain.compiler() is None or not depthwise.avx2_only(),
                                reason="needs a C compiler and an AVX2 processor without AVX-512")


@pytest.fixture(autouse=True)
def native_on():
    with settings.use(native=True):
        yield


def _plan(rng, n, c, mult, hw, stride, pad, epilogue, threads=1, dilation=1):
    """conv2d (depthwise, + bias) then ``epilogue`` ("relu", "add" of a residual, or None), as
    compiled: the bias and the epilogue fused into the convolution."""
    g = Graph("infer")
    x = Value(TensorType((n, c, *hw), "float32"), name="x")
    g.inputs["x"] = x
    b = Builder(g, "dw")
    o = c * mult
    weight = rng.standard_normal((o, 1, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    y = b.op("conv2d", x, b.op("constant", value=weight), b.op("constant", value=bias), stride=(stride, stride),
             pad=(pad, pad), dilation=(dilation, dilation), group=c)
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(np.float32)}
    with torch.no_grad():
        want = F.conv2d(torch.from_numpy(feeds["x"]), torch.from_numpy(weight), torch.from_numpy(bias),
                        stride=stride, padding=pad, dilation=dilation, groups=c).numpy()
    if epilogue == "relu":
        y = b.op("relu", y)
        want = np.maximum(want, 0)
    elif epilogue == "add":
        r = Value(TensorType(want.shape, "float32"), name="r")
        g.inputs["r"] = r
        feeds["r"] = rng.standard_normal(want.shape).astype(np.float32)
        y = b.op("add", y, r)
        want = want + feeds["r"]
    g.outputs["y"] = y
    return Plan(optimize(g, ("choose_layout",)), {}, {}, threads=threads), feeds, want


@pytest.mark.parametrize("n, c, mult, hw, stride, pad, threads", [
    (1, 3, 1, (9, 8), 1, 1, 1),         # one vector a row, masked at both ends
    (2, 4, 1, (7, 21), 1, 1, 2),        # 21 columns: the last vector overlaps, two threads
    (1, 2, 2, (6, 40), 1, 0, 1),        # unpadded, a channel multiplier
    (1, 3, 1, (11, 37), 2, 1, 1),       # stride 2: even and odd columns, 19 outputs
    (2, 2, 3, (8, 32), 2, 1, 2),        # stride 2, multiplier, the padding read at the left only
    (1, 2, 1, (9, 35), 2, 0, 1),        # stride 2 unpadded
    (1, 3, 1, (9, 7), 1, 1, 1),         # under 8 outputs a row: one masked vector, 7 lanes stored
    (2, 5, 1, (14, 14), 2, 1, 2),       # 7 outputs a row at stride 2 (MobileNet's last stride 2)
    (1, 3, 1, (7, 7), 1, 1, 1),         # its 7x7 layers
    (1, 4, 1, (112, 112), 1, 1, 1),     # MobileNet's widest stride-1 layer, whole interior vectors
    (1, 4, 1, (112, 112), 2, 1, 1),     # and its stride-2 one
    (1, 2, 1, (7, 40), 1, 0, 1),        # stride 1 by pairs of rows: 5 rows unpadded, the last one alone
    (2, 3, 1, (2, 19), 1, 1, 2),        # one pair reading a row of zeros above and below
    (1, 2, 2, (3, 6), 1, 0, 1),         # one output row of 4: no pair, one masked vector
    (1, 3, 1, (14, 14), 1, 1, 1),       # MobileNet's 14x14 layers: both vectors of a pair masked
    (1, 2, 1, (11, 20), 2, 0, 1),       # stride 2 by pairs sharing a row: 5 rows unpadded, the last alone
])
@pytest.mark.parametrize("epilogue", [None, "relu"])
def test_plane_function_equals_torch(rng, n, c, mult, hw, stride, pad, threads, epilogue):
    plan, feeds, want = _plan(rng, n, c, mult, hw, stride, pad, epilogue, threads)
    assert "tk_dw3x3(" in plan.native_source
    assert "tk_maxf" not in plan.native_source.split("tk_dw3x3(")[-1]   # the ReLU in the store, no pass after
    got = np.asarray(plan.run(feeds)["y"])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


def test_relu_keeps_nan(rng):
    plan, feeds, want = _plan(rng, 1, 2, 1, (6, 30), 1, 1, "relu")
    feeds["x"][0, 1, 3, 0] = np.nan                      # reaches outputs in a masked edge vector
    feeds["x"][0, 1, 3, 15] = np.nan                     # and in interior ones
    got = np.asarray(plan.run(feeds)["y"])
    nan = np.zeros_like(got, bool)
    nan[0, 1, 2:5, 0:2] = True
    nan[0, 1, 2:5, 14:17] = True
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_allclose(got[~nan], want[~nan], rtol=0, atol=2e-6 * float(np.abs(want[~nan]).max()))


@pytest.mark.parametrize("hw, stride, dilation, epilogue", [
    ((9, 30), 1, 2, None),              # dilated
    ((9, 30), 1, 1, "add"),             # a residual after it
])
def test_other_depthwise_keep_the_loop_kernel(rng, hw, stride, dilation, epilogue):
    plan, feeds, want = _plan(rng, 1, 3, 1, hw, stride, 1 + (dilation > 1), epilogue, dilation=dilation)
    assert "tk_dw3x3(" not in plan.native_source and "depthwise" in plan.native_source
    got = np.asarray(plan.run(feeds)["y"])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * float(np.abs(want).max()))


def test_a_compiler_without_avx2_compiles_the_plain_form(rng, monkeypatch):
    """A compiler that does not target AVX2 (here: told not to) compiles the plain C form of the
    same function, equal to PyTorch, rather than failing the unit."""
    monkeypatch.setattr(toolchain, "FLAGS", toolchain.FLAGS + ("-mno-avx2", "-mno-fma"))
    for args in [(1, 3, 2, (7, 21), 1, 1, "relu"), (1, 2, 1, (11, 37), 2, 1, None)]:
        plan, feeds, want = _plan(rng, *args)
        assert "tk_dw3x3(" in plan.native_source
        assert plan.impls.count("native") == len(plan.impls)
        np.testing.assert_allclose(np.asarray(plan.run(feeds)["y"]), want, rtol=0,
                                   atol=2e-6 * float(np.abs(want).max()))

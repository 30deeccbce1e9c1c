"""3x3 stride-1 convolutions through Winograd's F(2x2, 3x3) (toolkit/kernels/native/winograd.py)
against PyTorch's conv2d: a frozen weight (transformed once when the plan is built) and a weight
fed at run time (transformed in the kernel each run, as in training), padding 0 and 1, odd output
sizes, a bias, a fused ReLU, one image with two threads (the stages split) and several (an image
per thread), float64; and the shapes it declines (too few tiles or channels) stay on im2col."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from toolkit import settings  # noqa: E402
from toolkit.codegen import toolchain  # noqa: E402
from toolkit.ir.graph import Graph, TensorType, Value  # noqa: E402
from toolkit.ops.base import Builder  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

pytestmark = pytest.mark.skipif(toolchain.compiler() is None, reason="no C compiler on this machine")
# of the largest output: Winograd's transforms amplify float32 rounding (F(4x4, 3x3) more than
# direct summation), and how the channel sum is split over threads follows how busy the machine
# is, so a loaded machine lands up to about 3.2e-6 on the 256-channel case
TOL = {"float32": 5e-6, "float64": 1e-12}


@pytest.fixture(autouse=True)
def native_on():
    with settings.use(native=True):
        yield


def _conv_plan(n, c, o, h, w, pad, bias, frozen, dtype, rng, threads=2):
    g = Graph("infer")
    x = Value(TensorType((n, c, h, w), dtype), name="x")
    g.inputs["x"] = x
    b = Builder(g, "conv")
    weight = (rng.standard_normal((o, c, 3, 3)) * 0.1).astype(dtype)
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(dtype)}
    if frozen:
        wv = b.op("constant", value=weight)
    else:
        wv = Value(TensorType((o, c, 3, 3), dtype), name="w")
        g.inputs["w"] = wv
        feeds["w"] = weight
    ins = [x, wv]
    if bias:
        bv = Value(TensorType((o,), dtype), name="b")
        g.inputs["b"] = bv
        ins.append(bv)
        feeds["b"] = rng.standard_normal(o).astype(dtype)
    g.outputs["y"] = b.op("relu", b.op("conv2d", *ins, stride=(1, 1), pad=(pad, pad), dilation=(1, 1), group=1))
    plan = Plan(g, {}, {}, threads=threads)
    with torch.no_grad():
        want = F.relu(F.conv2d(torch.from_numpy(feeds["x"]), torch.from_numpy(weight),
                               torch.from_numpy(feeds["b"]) if bias else None, padding=pad)).numpy()
    return plan, feeds, want


def _uses_winograd(plan) -> bool:
    return any(p.name == "wino_u" for linked in plan.made.linked for call in linked.calls
               for p in call.kernel.params)


@pytest.mark.parametrize("n, c, o, h, w, pad, bias, frozen", [
    (1, 128, 128, 14, 14, 1, True, True),       # one image, two threads: each stage split
    (1, 128, 136, 13, 9, 1, False, False),      # odd output sizes: the last blocks cut
    (3, 128, 128, 16, 16, 0, True, True),       # no padding, an image per thread
    (4, 256, 128, 16, 15, 1, True, False),      # the weight fed at run time: transformed each run
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_winograd_equals_torch(rng, n, c, o, h, w, pad, bias, frozen, dtype):
    plan, feeds, want = _conv_plan(n, c, o, h, w, pad, bias, frozen, dtype, rng)
    assert _uses_winograd(plan)
    got = plan.run(feeds)["y"]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype] * scale)


def test_one_thread_and_the_kill_switch(rng):
    plan, feeds, want = _conv_plan(2, 128, 128, 12, 12, 1, True, True, "float32", rng, threads=1)
    assert _uses_winograd(plan)
    np.testing.assert_allclose(plan.run(feeds)["y"], want, rtol=0, atol=2e-6 * float(np.abs(want).max()))
    with settings.use(winograd=False):
        plan, feeds, want = _conv_plan(2, 128, 128, 12, 12, 1, True, True, "float32", rng)
    assert not _uses_winograd(plan)


@pytest.mark.parametrize("c, h", [(32, 56), (128, 7)], ids=["few channels", "few tiles"])
def test_shapes_where_it_loses_stay_on_im2col(rng, c, h):
    plan, feeds, want = _conv_plan(1, c, c, h, h, 1, False, True, "float32", rng)
    assert not _uses_winograd(plan)
    np.testing.assert_allclose(plan.run(feeds)["y"], want, rtol=0, atol=1e-5 * float(np.abs(want).max()))

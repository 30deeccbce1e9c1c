"""Grouped convolutions with fewer images than threads (AlexNet's conv2, conv4 and conv5 at
batch 1 on two threads): the groups run side by side, each thread with its own columns, or the
blocks of output rows do where an image's columns are blocked; equal to PyTorch, with bias,
ReLU and a residual applied as the kernel stores, and the outputs of one thread equal to two's."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from toolkit.codegen import toolchain  # noqa: E402
from toolkit.ir.graph import Graph, TensorType, Value  # noqa: E402
from toolkit.ops.base import Builder  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

pytestmark = pytest.mark.skipif(toolchain.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(autouse=True)
def native_on(monkeypatch):
    monkeypatch.setenv("TOOLKIT_NATIVE", "1")


@pytest.mark.parametrize("n, c, o, hw, k, pad, group, frozen", [
    (1, 96, 256, 27, 5, 2, 2, True),      # AlexNet's conv2: columns blocked by output rows
    (1, 384, 256, 13, 3, 1, 2, True),     # conv5: groups side by side
    (1, 12, 18, 9, 3, 1, 3, False),       # three groups on two threads, the weight fed
    (2, 8, 8, 6, 1, 0, 4, True),          # as many images as threads: an image each
])
def test_grouped_convolution_on_two_threads_equals_torch(rng, n, c, o, hw, k, pad, group, frozen):
    g = Graph("infer")
    x = Value(TensorType((n, c, hw, hw), "float32"), name="x")
    g.inputs["x"] = x
    b = Builder(g, "conv")
    weight = (rng.standard_normal((o, c // group, k, k)) / np.sqrt(c // group * k * k)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    feeds = {"x": rng.standard_normal((n, c, hw, hw)).astype(np.float32)}
    if frozen:
        wv = b.op("constant", value=weight)
    else:
        wv = Value(TensorType(weight.shape, "float32"), name="w")
        g.inputs["w"] = wv
        feeds["w"] = weight
    conv = b.op("conv2d", x, wv, b.op("constant", value=bias), stride=(1, 1), pad=(pad, pad), dilation=(1, 1),
                group=group)
    out_c = conv.shape[1]
    residual = Value(TensorType(conv.shape, "float32"), name="r")
    g.inputs["r"] = residual
    feeds["r"] = rng.standard_normal(conv.shape).astype(np.float32)
    g.outputs["y"] = b.op("relu", b.op("add", conv, residual))
    with torch.no_grad():
        t = F.conv2d(torch.from_numpy(feeds["x"]), torch.from_numpy(weight), torch.from_numpy(bias), padding=pad,
                     groups=group)
        want = F.relu(t + torch.from_numpy(feeds["r"])).numpy()
    assert out_c == o
    got = {}
    for threads in (1, 2):
        plan = Plan(g, {}, {}, threads=threads)
        assert "native" in plan.impls
        got[threads] = np.array(plan.run(feeds)["y"])
        np.testing.assert_allclose(got[threads], want, rtol=0, atol=3e-6 * float(np.abs(want).max()))
    np.testing.assert_array_equal(got[1], got[2])

"""The blocked channel layout (NCHW16c): the layout pass (toolkit/passes/layout.py) and the
generated kernels it chooses (kernels/native/blocked.py over codegen/blocked.py).

- Each kernel against PyTorch through the pass pipeline, as a net is compiled: the tiles' edges
  (positions that do not fill a tile, output blocks that do not fill a group of four), strides,
  padding, dilation, depthwise, the epilogue applied in the store (bias, residual, ReLU with
  NaN kept), batches, two threads, and the plain C form a compiler without AVX-512 builds.
- The pass: what it chooses and says, the reorders it leaves (one per boundary, none between
  blocked neighbours), what follows the layout, and random nets equal with and without it."""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from toolkit import settings  # noqa: E402
from toolkit.codegen import microkernel, toolchain  # noqa: E402
from toolkit.compile import optimize  # noqa: E402
from toolkit.ir.graph import Graph, TensorType, Value  # noqa: E402
from toolkit.ops.base import Builder  # noqa: E402
from toolkit.ops.interpreter import interpret  # noqa: E402
from toolkit.passes import layout  # noqa: E402
from toolkit.passes.context import PassContext  # noqa: E402
from toolkit.passes.pipeline import run_pipeline  # noqa: E402
from toolkit.runtime.plan import Plan  # noqa: E402

pytestmark = pytest.mark.skipif(toolchain.compiler() is None or not microkernel.available(),
                                reason="needs a C compiler and an AVX-512 processor (the blocked kernels' block)")


@pytest.fixture(autouse=True)
def native_on():
    with settings.use(native=True):
        yield


@pytest.fixture
def every_candidate(monkeypatch):
    """The kernel tests block every convolution the kernels can run, whatever the cost rule says
    of a lone convolution's two reorders."""
    monkeypatch.setattr(layout, "worthwhile", lambda graph, candidates, followers: ({id(n) for n in candidates}, []))


def tt(a):
    return torch.from_numpy(np.ascontiguousarray(a))


class Net:
    """A graph built with NCHW ops and constant (frozen) weights, and its PyTorch twin."""

    def __init__(self, rng, shape):
        self.rng = rng
        self.graph = Graph("infer")
        x = Value(TensorType(tuple(shape), "float32"), name="x")
        self.graph.inputs["x"] = x
        self.b = Builder(self.graph, "net")
        self.x = x
        self.feed = rng.standard_normal(shape).astype(np.float32)

    def const(self, array):
        return self.b.op("constant", value=np.asarray(array, np.float32))

    def conv(self, v, t, o, k, stride=1, pad=0, dilation=1, group=1, bias=True):
        c = v.shape[1]
        w = (self.rng.standard_normal((o, c // group, k, k)) / np.sqrt(c * k * k / group)).astype(np.float32)
        bvec = self.rng.standard_normal(o).astype(np.float32) if bias else None
        attrs = dict(stride=(stride, stride), pad=(pad, pad), dilation=(dilation, dilation), group=group)
        inputs = [v, self.const(w)] + ([self.const(bvec)] if bias else [])
        tw = F.conv2d(t, tt(w), tt(bvec) if bias else None, stride=stride, padding=pad, dilation=dilation,
                      groups=group)
        return self.b.op("conv2d", *inputs, **attrs), tw

    def plan(self, out, threads=1, disable=()):
        self.graph.outputs["y"] = out
        graph = optimize(self.graph, tuple(disable))
        return Plan(graph, {}, {}, threads=threads), graph


def run_against_torch(net, out, want, threads=1):
    plan, graph = net.plan(out, threads)
    got = np.asarray(plan.run({"x": net.feed})["y"])
    want = want.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6 * max(float(np.nanmax(np.abs(want))), 1.0))
    assert plan.impls.count("native") == len(plan.impls), list(zip([n.op for n in graph.nodes], plan.impls))
    return plan, graph


@pytest.mark.parametrize("n, c, o, hw, k, stride, pad, dilation, threads", [
    (1, 32, 48, (7, 7), 1, 1, 0, 1, 1),      # 49 positions: 8 tiles of 6 and a 1-row tail; 3 blocks
    (2, 16, 80, (13, 11), 1, 1, 0, 1, 2),    # 5 output blocks: a group of 4 and one of 1; two threads
    (1, 64, 64, (14, 14), 1, 2, 0, 1, 2),    # strided 1x1: positions through the origin table
    (2, 16, 64, (9, 10), 3, 1, 1, 1, 1),     # padded 3x3 on the image's zero-bordered copy
    (1, 32, 32, (11, 9), 3, 2, 1, 1, 2),     # batch 1 on two threads: position ranges split
    (1, 16, 32, (10, 10), 3, 1, 2, 2, 1),    # dilated
    (1, 32, 16, (8, 12), 5, 1, 2, 1, 1),     # 5x5
    (2, 24, 48, (7, 9), 1, 1, 0, 1, 1),      # padded blocks: 24 in (2 blocks, the second half empty)
    (1, 48, 40, (6, 6), 3, 1, 1, 1, 2),      # 40 out: the last block 8 lanes
])
def test_dense_blocked_convolution_equals_torch(every_candidate, rng, n, c, o, hw, k, stride, pad, dilation, threads):
    net = Net(rng, (n, c, *hw))
    y, want = net.conv(net.x, tt(net.feed), o, k, stride, pad, dilation)
    plan, graph = run_against_torch(net, net.b.op("relu", y), F.relu(want), threads)
    assert "tk_bconv(" in plan.native_source
    assert [nd.op for nd in graph.nodes if nd.op in ("to_blocked", "from_blocked")] == ["to_blocked", "from_blocked"]


@pytest.mark.parametrize("n, c, o, hw, k, group, threads", [
    (1, 96, 256, (13, 13), 5, 2, 2),     # AlexNet's conv2 on a smaller map: 48 -> 128 a group
    (2, 64, 128, (9, 8), 3, 4, 1),       # four groups of 16 -> 32
    (1, 32, 96, (7, 7), 1, 2, 2),        # 16 -> 48 a group: three blocks, a tile of 3 in each group
])
def test_grouped_blocked_convolution_equals_torch(every_candidate, rng, n, c, o, hw, k, group, threads):
    """Grouped with whole blocks per group (AlexNet's conv2, conv4, conv5): each group's output
    blocks read the group's input blocks only; a tile of output blocks never crosses groups."""
    net = Net(rng, (n, c, *hw))
    y, want = net.conv(net.x, tt(net.feed), o, k, pad=k // 2, group=group)
    plan, graph = run_against_torch(net, net.b.op("relu", y), F.relu(want), threads)
    assert "tk_bconv(" in plan.native_source
    assert [dict(nd.attrs).get("group", dict(dict(nd.attrs).get("head_attrs", ())).get("group"))
            for nd in graph.nodes if "conv2d_blocked" in (nd.op, dict(nd.attrs).get("head"))] == [group]


@pytest.mark.parametrize("n, c, o, hw, k, stride, pad, threads", [
    (2, 3, 32, (15, 17), 3, 2, 1, 1),      # MobileNet's first layer: an RGB image, 3 channels
    (1, 3, 64, (23, 21), 7, 2, 3, 2),      # ResNet's and GoogLeNet's 7x7 stride 2, two threads
    (1, 3, 40, (27, 27), 11, 4, 0, 1),     # AlexNet's 11x11 stride 4; 40 out: a padded block
    (1, 5, 16, (6, 6), 1, 1, 0, 1),        # 1x1, no padded copy
])
def test_an_rgb_image_is_read_as_nchw_and_written_blocked(every_candidate, rng, n, c, o, hw, k, stride, pad, threads):
    """Fewer input channels than a block: the convolution reads the NCHW planes (blocks of one
    channel) and writes the blocked layout, so no reorder comes before it."""
    net = Net(rng, (n, c, *hw))
    y, want = net.conv(net.x, tt(net.feed), o, k, stride, pad)
    y = net.b.op("relu", y)
    plan, graph = run_against_torch(net, net.b.op("max_pool2d", y, kernel=(2, 2), stride=(2, 2), pad=(0, 0),
                                                  ceil_mode=False), F.max_pool2d(F.relu(want), 2, 2), threads)
    ops = [nd.op for nd in graph.nodes]
    assert "to_blocked" not in ops and "max_pool2d_blocked" in ops, ops
    assert "tk_bconv(" in plan.native_source


@pytest.mark.parametrize("n, c, hw, k, stride, pad, threads", [
    (1, 48, (14, 14), 3, 1, 1, 2),      # 8 inside positions a tile, the border's one at a time
    (2, 32, (15, 15), 3, 2, 1, 1),      # stride 2 over an odd map
    (1, 16, (9, 11), 5, 1, 2, 1),       # 5x5: 25 taps, a border two windows deep
    (1, 16, (8, 8), 3, 1, 0, 1),        # unpadded: every window inside
    (1, 16, (61, 70), 3, 1, 1, 2),      # a large map on two threads
    (2, 16, (57, 40), 3, 2, 1, 1),      # stride 2, rows whose inside run is not a multiple of 8
    (1, 16, (40, 64), 5, 1, 2, 1),
    (1, 16, (12, 13), 3, 1, 2, 1),      # padding 2 > what a 3x3 window needs: all-padding taps
    (2, 24, (10, 9), 3, 1, 1, 1),       # 24 channels: a padded second block
    (1, 32, (6, 28), 3, 1, 1, 2),       # a row's inside run of 26: tiles of 8, 8, 8 and 2
    (1, 16, (7, 15), 3, 1, 1, 1),       # 13: 8, 4 and one alone
])
def test_depthwise_blocked_convolution_equals_torch(every_candidate, rng, n, c, hw, k, stride, pad, threads):
    net = Net(rng, (n, c, *hw))
    y, want = net.conv(net.x, tt(net.feed), c, k, stride, pad, group=c)
    plan, _ = run_against_torch(net, net.b.op("relu", y), F.relu(want), threads)
    assert "tk_bdw_direct(" in plan.native_source


@pytest.mark.parametrize("c, k, hw", [
    (32, 3, 7),        # the 3x3 conv's positions through the origin table (rows of 7 on the padded copy)
    (16, 1, 9),        # 1x1 convs of 1, 2 and 3 output blocks: the wide tiles over positions
    (32, 1, 9),        # side by side (81 = 6 x 12 + 9, 5 x 14 + 11, 10 x 8 + 1: each with a tail)
    (48, 1, 9),
])
def test_residual_and_relu_are_applied_in_the_store_with_nan_kept(every_candidate, rng, c, k, hw):
    """A ResNet bottleneck's end: conv + bias + shortcut, then ReLU, as one blocked kernel; a NaN
    in the input stays NaN through the ReLU (numpy's maximum), as PyTorch's does."""
    net = Net(rng, (1, c, hw, hw))
    net.feed[0, 3, 2, 2] = np.nan
    t = tt(net.feed)
    a, ta = net.conv(net.x, t, c, 1)
    a = net.b.op("relu", a)
    ta = F.relu(ta)
    y, ty = net.conv(a, ta, c, k, pad=k // 2)
    out = net.b.op("relu", net.b.op("add", y, net.x))
    plan, graph = run_against_torch(net, out, F.relu(ty + t))
    assert np.isnan(np.asarray(plan.run({"x": net.feed})["y"])).any()
    fused = [nd for nd in graph.nodes if nd.op == "fused_epilogue"]
    assert [dict(nd.attrs)["head"] for nd in fused] == ["conv2d_blocked"] * 2
    assert len(fused[1].attrs["program"]) == 2                   # add then relu, in the store


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("hw, k, stride, pad, ceil", [
    ((11, 11), 3, 2, 0, False),      # SqueezeNet's pools: windows inside
    ((7, 8), 3, 2, 1, True),         # padding and the ceil-mode edge: taps outside skipped
    ((6, 5), 3, 1, 1, False),        # GoogLeNet's inception pools: stride 1, padded
    ((8, 8), 2, 2, 0, False),
])
def test_blocked_max_pooling_equals_torch_with_nan_kept(rng, dtype, hw, k, stride, pad, ceil):
    """max_pool2d_blocked on its own against PyTorch's max pooling of the NCHW form, with a NaN
    planted: the windows that hold it give NaN (numpy's maximum, PyTorch's rule), the others are
    unchanged, and the plan runs it natively."""
    n, c = 2, 32
    x = rng.standard_normal((n, c, *hw)).astype(dtype)
    x[1, 17, 2, 3] = np.nan
    g = Graph("infer")
    xb = Value(TensorType((n, c // 16, *hw, 16), dtype), name="x")
    g.inputs["x"] = xb
    attrs = dict(kernel=(k, k), stride=(stride, stride), pad=(pad, pad), ceil_mode=ceil)
    g.outputs["y"] = Builder(g, "t").op("max_pool2d_blocked", xb, block=16, **attrs)
    plan = Plan(g, {}, {})
    blocked_x = np.ascontiguousarray(x.reshape(n, c // 16, 16, *hw).transpose(0, 1, 3, 4, 2))
    got = np.asarray(plan.run({"x": blocked_x})["y"])
    got = got.transpose(0, 1, 4, 2, 3).reshape(n, c, *got.shape[2:4])
    want = F.max_pool2d(torch.from_numpy(x), k, stride, pad, ceil_mode=ceil).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want).sum() >= 1
    np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want))
    assert plan.impls == ["native"]


def fire_module(net, squeeze=16, expand=32):
    """SqueezeNet's fire module: a 1x1 squeeze, 1x1 and 3x3 expands side by side, concatenated."""
    t = tt(net.feed)
    s, ts = net.conv(net.x, t, squeeze, 1)
    s, ts = net.b.op("relu", s), F.relu(ts)
    e1, te1 = net.conv(s, ts, expand, 1)
    e3, te3 = net.conv(s, ts, expand, 3, pad=1)
    cat = net.b.op("concat", net.b.op("relu", e1), net.b.op("relu", e3), axis=1)
    return cat, torch.cat([F.relu(te1), F.relu(te3)], 1)


@pytest.mark.parametrize("n, threads", [(1, 1), (3, 1), (3, 2)])
def test_a_fire_modules_concatenation_is_gathered_at_any_batch(every_candidate, rng, n, threads):
    """The two blocked expands write their halves of each image of the concatenation straight
    into its output (at batch n > 1 through a strided view: the images lie a whole output image
    apart): no concatenation step runs, and the result is PyTorch's."""
    net = Net(rng, (n, 32, 9, 9))
    cat, want = fire_module(net)
    plan, graph = run_against_torch(net, cat, want, threads)
    assert [nd.op for nd in plan.steps].count("concat") == 0
    assert sum(1 for nd in graph.nodes if nd.op == "concat") == 1
    assert len(plan.memory.image_stride_of) == (2 if n > 1 else 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_part_reordered_into_the_blocked_layout_is_written_into_its_slot(every_candidate, rng, threads):
    """An NCHW part (GoogLeNet's 3x3 branch, whose Winograd kernel stays NCHW) reaches the
    blocked concatenation through to_blocked, which writes its images straight into their
    slots of the output, as the blocked convolution beside it does."""
    net = Net(rng, (3, 32, 7, 7))
    t = tt(net.feed)
    a, ta = net.conv(net.x, t, 48, 1)
    cat = net.b.op("concat", a, net.b.op("sigmoid", net.x), axis=1)
    plan, graph = run_against_torch(net, net.b.op("relu", cat), F.relu(torch.cat([ta, torch.sigmoid(t)], 1)), threads)
    assert "to_blocked" in [nd.op for nd in plan.steps]
    assert [nd.op for nd in plan.steps].count("concat") == 0 and len(plan.memory.image_stride_of) == 2


def test_a_strided_part_read_by_another_op_is_not_gathered(every_candidate, rng):
    """At batch 2 a part that something else reads too would hand that reader a strided view:
    the concatenation copies instead."""
    net = Net(rng, (2, 32, 7, 7))
    cat, want = fire_module(net)
    e1 = cat.producer.inputs[0]
    net.graph.outputs["e1_sum"] = net.b.op("reduce_sum", e1, axes=(1, 2, 3), keepdims=False)
    plan, _ = run_against_torch(net, cat, want)
    assert [nd.op for nd in plan.steps].count("concat") == 1
    np.testing.assert_allclose(np.asarray(plan.run({"x": net.feed})["e1_sum"]),
                               want[:, :32].sum(dim=(1, 2, 3)).detach().numpy(), rtol=1e-5)


def test_a_strided_part_made_by_the_numpy_kernel_is_copied_into_its_view(every_candidate, rng, monkeypatch):
    """Where the blocked convolution's native kernel is not built (here: every native kernel
    declines), its numpy kernel writes a contiguous array that the plan copies into the view."""
    net = Net(rng, (2, 32, 7, 7))
    cat, want = fire_module(net)
    net.graph.outputs["y"] = cat
    graph = optimize(net.graph, ())
    plan = Plan(graph, {}, {}, native=False)
    assert plan.impls.count("native") == 0
    assert [nd.op for nd in plan.steps].count("concat") == 0 and len(plan.memory.image_stride_of) == 2
    got = np.asarray(plan.run({"x": net.feed})["y"])
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=0, atol=3e-6 * float(want.abs().max()))


def _explain(graph_builder, disable=()):
    ctx = PassContext(disabled=frozenset(disable))
    graph = run_pipeline(graph_builder, ctx)
    return graph, [n for n in ctx.notes if n.startswith("choose_layout")]


def test_a_mobilenet_chain_is_blocked_with_no_reorder_and_says_so(rng):
    """conv (3 input channels, read as NCHW, written blocked) -> depthwise / pointwise pairs ->
    global pooling -> a 1000-way classifier over one position (NCHW): no reorder in, none out
    (the pooled [N, C, 1, 1] is the same memory in both layouts), and the notes name what
    stayed NCHW and why."""
    net = Net(rng, (2, 3, 16, 16))
    t = tt(net.feed)
    v, t = net.conv(net.x, t, 32, 3, stride=2, pad=1)
    v, t = net.b.op("relu", v), F.relu(t)
    for c_out, stride in [(64, 1), (64, 2), (128, 1)]:
        v, t = net.conv(v, t, v.shape[1], 3, stride=stride, pad=1, group=v.shape[1])
        v, t = net.b.op("relu", v), F.relu(t)
        v, t = net.conv(v, t, c_out, 1)
        v, t = net.b.op("relu", v), F.relu(t)
    v = net.b.op("reduce_mean", v, axes=(2, 3), keepdims=True)
    t = t.mean(dim=(2, 3), keepdim=True)
    v, t = net.conv(v, t, 1000, 1)
    net.graph.outputs["y"] = v
    graph, notes = _explain(net.graph)
    # the six ReLUs and the pooling follow
    assert notes[0] == ("choose_layout: 7 of 8 convolutions in NCHW16c (4 dense, 3 depthwise), 8 op(s) follow "
                        "the layout; reorders: 0 to NCHW16c, 0 back to NCHW")
    assert notes[1] == "choose_layout: kept NCHW: net (one output position: a matrix-vector product)"
    ops = [nd.op for nd in graph.nodes]
    assert ops.count("to_blocked") == 0 and ops.count("from_blocked") == 0
    plan = Plan(graph, {}, {})
    np.testing.assert_allclose(np.asarray(plan.run({"x": net.feed})["y"]), t.detach().numpy(), rtol=0, atol=2e-5)


def test_concatenation_pooling_and_per_channel_constants_follow_the_layout(every_candidate, rng):
    """An inception-like join: two blocked branches concatenated along channels, scaled by a
    per-channel constant, plus a scalar, a sigmoid, a max pooling: all blocked, so the only
    reorders are at the ends; a softmax over channels (NCHW only) reads the NCHW form."""
    net = Net(rng, (1, 32, 9, 9))
    t = tt(net.feed)
    a, ta = net.conv(net.x, t, 16, 1)
    b, tb = net.conv(net.x, t, 32, 3, pad=1)
    cat = net.b.op("concat", a, b, axis=1)
    scale = rng.uniform(0.5, 1.5, (48, 1, 1)).astype(np.float32)
    v = net.b.op("add", net.b.op("mul", cat, net.const(scale)), net.const(np.float32(0.25)))
    v = net.b.op("sigmoid", v)
    v = net.b.op("max_pool2d", v, kernel=(3, 3), stride=(2, 2), pad=(1, 1), ceil_mode=True)
    net.graph.outputs["y"] = net.b.op("softmax", v, axis=1)
    tv = F.max_pool2d(torch.sigmoid(torch.cat([ta, tb], 1) * tt(scale) + 0.25), 3, 2, 1, ceil_mode=True)
    graph, notes = _explain(net.graph)
    assert notes[0].endswith("5 op(s) follow the layout; reorders: 1 to NCHW16c, 1 back to NCHW")
    assert "max_pool2d_blocked" in [nd.op for nd in graph.nodes]
    plan = Plan(graph, {}, {})
    got = np.asarray(plan.run({"x": net.feed})["y"])
    np.testing.assert_allclose(got, F.softmax(tv, 1).detach().numpy(), rtol=0, atol=1e-6)
    assert plan.impls.count("native") == len(plan.impls)


def test_padded_blocks_stay_zero_and_what_would_not_keep_them_zero_reads_nchw(every_candidate, rng):
    """24 channels are two blocks, the second half empty. A square follows the layout (0 -> 0);
    a log would turn the empty lanes into -inf, and inf times the next convolution's zero
    weights is NaN, so it reads the NCHW form and the next convolution a fresh, zero-padded
    reorder. The 1000-way classifier after global pooling is padded to 1008 and cut back."""
    net = Net(rng, (2, 32, 6, 6))
    t = tt(net.feed)
    v, t = net.conv(net.x, t, 24, 1)
    v, t = net.b.op("mul", v, v), t * t
    v, t = net.b.op("log", v), torch.log(t)
    v, t = net.conv(v, t, 32, 3, pad=1)
    v = net.b.op("reduce_mean", v, axes=(2, 3), keepdims=False)
    t = t.mean(dim=(2, 3))
    w = rng.standard_normal((1000, 32)).astype(np.float32) / 6
    net.graph.outputs["y"] = net.b.op("add", net.b.op("matmul", v, net.const(np.ascontiguousarray(w.T)),
                                                      trans_a=False, trans_b=False),
                                      net.const(np.float32(0.5)))
    t = t @ tt(w.T) + 0.5
    graph, notes = _explain(net.graph)
    ops = {nd.op for nd in graph.nodes}
    log, = [nd for nd in graph.nodes if nd.op == "log"]
    assert log.inputs[0].producer.op == "from_blocked" and log.inputs[0].shape == (2, 24, 6, 6)
    assert "conv2d_blocked" in ops or "fused_epilogue" in ops
    got = np.asarray(Plan(graph, {}, {}).run({"x": net.feed})["y"])
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, t.numpy(), rtol=2e-5, atol=2e-5 * float(t.abs().max()))


def test_a_concatenation_with_a_padded_block_reads_nchw(every_candidate, rng):
    """24 channels blocked are two blocks of which the second is half padding: concatenated as
    blocks, the next input's channels would land 8 lanes late, so the join reads NCHW."""
    net = Net(rng, (1, 32, 5, 5))
    t = tt(net.feed)
    a, ta = net.conv(net.x, t, 24, 1)
    b, tb = net.conv(net.x, t, 16, 1)
    net.graph.outputs["y"] = net.b.op("concat", a, b, axis=1)
    graph, _ = _explain(net.graph)
    cat, = [nd for nd in graph.nodes if nd.op == "concat"]
    assert [v.rank for v in cat.inputs] == [4, 4]
    got = np.asarray(Plan(graph, {}, {}).run({"x": net.feed})["y"])
    np.testing.assert_allclose(got, torch.cat([ta, tb], 1).detach().numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("op, scalar, keeps", [
    ("relu", None, True), ("sigmoid", None, False), ("add", 0.0, True), ("add", 1.0, False),
    ("mul", 3.0, True), ("div", 2.0, True), ("maximum", -1.0, True), ("maximum", 1.0, False), ("tanh", None, True),
])
def test_which_elementwise_ops_keep_a_padded_blocks_zeros(op, scalar, keeps):
    g = Graph("infer")
    x = Value(TensorType((1, 24, 2, 2), "float32"), name="x")
    g.inputs["x"] = x
    b = Builder(g, "t")
    operands = [x] if scalar is None else [x, b.op("constant", value=np.asarray(scalar, np.float32))]
    y = b.op(op, *operands)
    assert layout.keeps_padding_zero(y.producer) is keeps


def test_a_lone_convolution_goes_blocked_only_where_it_saves_more_than_its_reorders(rng):
    """The cost rule: a 1x1 convolution on a 28x28 map between two NCHW ones (groups of 8
    channels, which the blocked kernels do not run) would save less than its two reorders cost; the same on a
    7x7 map of 512 channels saves about a fifth of its 0.25 ms, far more than reordering 25k
    values twice."""
    for hw, c, blocked in [((28, 28), 32, False), ((7, 7), 512, True)]:
        net = Net(rng, (1, c, *hw))
        t = tt(net.feed)
        v, t = net.conv(net.x, t, c, 3, pad=1, group=c // 8)
        v, t = net.conv(v, t, c, 1)
        v, t = net.conv(v, t, c, 3, pad=1, group=c // 8)
        net.graph.outputs["y"] = v
        graph, notes = _explain(net.graph)
        assert any(nd.op == "conv2d_blocked" for nd in graph.nodes) == blocked
        if blocked:
            assert notes[1] == ("choose_layout: kept NCHW: net (group 64, 8 -> 8 channels a group: not whole blocks), "
                                "net (group 64, 8 -> 8 channels a group: not whole blocks)")
        else:
            assert notes == []        # nothing changed, nothing said
        got = np.asarray(Plan(graph, {}, {}).run({"x": net.feed})["y"])
        np.testing.assert_allclose(got, t.detach().numpy(), rtol=0, atol=3e-5 * float(t.abs().max()))


def test_a_second_run_finds_nothing_to_do(rng):
    """Run again over its own result (the pipeline's fixpoint), the pass changes nothing and
    says nothing."""
    net = Net(rng, (1, 3, 7, 7))
    t = tt(net.feed)
    v, t = net.conv(net.x, t, 512, 3, pad=1)
    v, t = net.conv(v, t, 512, 1)
    v, t = net.conv(v, t, 10, 1)
    net.graph.outputs["y"] = v
    graph, notes = _explain(net.graph)
    assert notes and any(nd.op == "conv2d_blocked" for nd in graph.nodes)
    again, notes = _explain(graph)
    assert notes == []


def test_switched_off_and_where_it_cannot_pay(rng):
    net = Net(rng, (1, 32, 7, 7))
    y, _ = net.conv(net.x, tt(net.feed), 32, 1)
    net.graph.outputs["y"] = y
    graph, notes = _explain(net.graph, disable=("choose_layout",))
    assert notes == [] and not any(nd.op.endswith("blocked") for nd in graph.nodes)


def _fed_weight_graph():
    g = Graph("train")
    x = Value(TensorType((1, 16, 5, 5), "float32"), name="x")
    w = Value(TensorType((16, 16, 1, 1), "float32"), name="w")
    g.inputs.update(x=x, w=w)
    b = Builder(g, "c")
    y = b.op("conv2d", x, w, stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1)
    g.outputs["y"] = y
    return g, b, w, y


def test_fed_weights_and_graphs_with_a_backward_pass_stay_nchw():
    """A weight fed at run time would be packed on every run, and a train step's backward
    kernels read NCHW: the pass leaves both alone."""
    from toolkit.ops.autodiff import differentiate
    g, _b, _w, _y = _fed_weight_graph()
    graph, notes = _explain(g)
    assert notes == [] and not any(nd.op.endswith("blocked") for nd in graph.nodes)
    g, b, w, y = _fed_weight_graph()
    loss = b.op("reduce_sum", y, axes=(0, 1, 2, 3), keepdims=False)
    g.outputs["dw"] = differentiate(g, loss, [w])[w.id]
    graph, notes = _explain(g)
    assert notes == [] and not any(nd.op.endswith("blocked") for nd in graph.nodes)


# -- random nets, with and without the pass -------------------------------------------------
def random_net(seed: int):
    """A random chain of what real nets put between convolutions: dense, depthwise and grouped
    convs of channel counts with and without whole blocks, strides, ReLU / sigmoid, residual adds,
    concatenations, per-channel scales, max pooling, global pooling."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3))
    net = Net(rng, (n, int(rng.choice([16, 32, 8])), int(rng.integers(5, 12)), int(rng.integers(5, 12))))
    v = net.x
    for _ in range(int(rng.integers(3, 8))):
        c, h, w = v.shape[1], v.shape[2], v.shape[3]
        kind = rng.choice(["dense", "dense3", "depthwise", "act", "residual", "concat", "scale", "pool", "grouped"])
        if kind == "dense":
            o = int(rng.choice([16, 32, 48, 24]))
            v = net.b.op("conv2d", v, net.const(rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)),
                         stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1)
        elif kind == "dense3" and min(h, w) >= 3:
            o = int(rng.choice([16, 32, 8]))
            stride = int(rng.choice([1, 2]))
            v = net.b.op("conv2d", v, net.const(rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)),
                         net.const(rng.standard_normal(o)), stride=(stride, stride), pad=(1, 1), dilation=(1, 1),
                         group=1)
        elif kind == "grouped" and c % 32 == 0 and min(h, w) >= 3:       # two groups of whole blocks
            v = net.b.op("conv2d", v, net.const(rng.standard_normal((32, c // 2, 3, 3)) / np.sqrt(4.5 * c)),
                         stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=2)
        elif kind == "depthwise" and min(h, w) >= 3:
            v = net.b.op("conv2d", v, net.const(rng.standard_normal((c, 1, 3, 3)) / 3), stride=(1, 1), pad=(1, 1),
                         dilation=(1, 1), group=c)
        elif kind == "act":
            v = net.b.op(str(rng.choice(["relu", "sigmoid", "tanh"])), v)
        elif kind == "residual":
            v = net.b.op("add", v, net.b.op("relu", v))
        elif kind == "concat":
            other = net.b.op("conv2d", v, net.const(rng.standard_normal((16, c, 1, 1)) / np.sqrt(c)),
                             stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1)
            v = net.b.op("concat", v, other, axis=1)
        elif kind == "scale":
            v = net.b.op("mul", v, net.const(rng.uniform(0.5, 1.5, (c, 1, 1))))
        elif kind == "pool" and min(h, w) >= 3:
            v = net.b.op("max_pool2d", v, kernel=(3, 3), stride=(2, 2), pad=(1, 1), ceil_mode=bool(rng.random() < 0.5))
    if rng.random() < 0.5:
        v = net.b.op("reduce_mean", v, axes=(2, 3), keepdims=bool(rng.random() < 0.5))
    net.graph.outputs["y"] = v
    return net


@pytest.mark.parametrize("seed", range(24))
def test_random_nets_are_equal_with_and_without_the_pass(every_candidate, seed):
    net = random_net(seed)
    reference, = interpret(net.graph, {"x": net.feed}, {})[0].values()
    results = {}
    for label, disable in [("with", ()), ("without", ("choose_layout",))]:
        graph = run_pipeline(copy.deepcopy(net.graph), PassContext(disabled=frozenset(disable)))
        results[label] = (np.asarray(Plan(graph, {}, {}).run({"x": net.feed})["y"]).copy(),
                          sum(nd.op == "conv2d_blocked" or (nd.op == "fused_epilogue"
                                                            and dict(nd.attrs)["head"] == "conv2d_blocked")
                              for nd in graph.nodes))
    scale = max(float(np.abs(reference).max()), 1.0)
    for label, (got, _) in results.items():
        np.testing.assert_allclose(got, reference, rtol=0, atol=2e-5 * scale, err_msg=label)
    assert results["without"][1] == 0


def test_the_random_nets_exercise_the_pass(every_candidate):
    """Most of the random nets above have blocked convolutions, and some also keep some NCHW."""
    fired = mixed = 0
    for seed in range(24):
        net = random_net(seed)
        _graph, notes = _explain(net.graph)
        fired += any(" convolutions in NCHW16c" in n for n in notes)
        mixed += any(" convolutions in NCHW16c" in n for n in notes) and any("kept NCHW" in n for n in notes)
    assert fired >= 12 and mixed >= 3, (fired, mixed)


def test_a_compiler_without_avx512_compiles_the_plain_form(every_candidate, rng, monkeypatch):
    """A compiler told not to target AVX-512 compiles the plain C form of both tiles, equal to
    PyTorch (bias, residual and ReLU included), rather than failing the unit."""
    monkeypatch.setattr(toolchain, "FLAGS", toolchain.FLAGS + ("-mno-avx512f",))
    net = Net(rng, (2, 3, 7, 6))
    t = tt(net.feed)
    x, t = net.conv(net.x, t, 32, 3, pad=1)                # an RGB image read as NCHW
    a, ta = net.conv(x, t, 32, 3, stride=1, pad=1, group=32)
    a, ta = net.b.op("relu", a), F.relu(ta)
    y, ty = net.conv(a, ta, 32, 1)
    plan, _ = run_against_torch(net, net.b.op("relu", net.b.op("add", y, x)), F.relu(ty + t))
    assert "tk_bconv(" in plan.native_source and "tk_bdw_direct(" in plan.native_source

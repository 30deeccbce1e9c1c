"""The quantize pass (toolkit/passes/quantize.py): what it rewrites (conv2d + bias + ReLU and an
InnerProduct's matmul + bias + ReLU into qconv2d / qgemm, quantize_linear where int8 begins,
dequantize_linear or a float32 output where it ends, int8 kept between quantized layers through a
reshape), its numbers against a float simulation written here in numpy (dequantize(quantize(v)) at
the same points, weights and biases rounded as the interface says), its notes for ``toolkit
compile --explain``, and where it must not fire."""
from __future__ import annotations

import numpy as np
import pytest
from pass_helpers import N, Tiny, apply, ops

from schemas.quantization import QuantizationSpec
from toolkit.ops import Builder
from toolkit.ops.interpreter import interpret
from toolkit.ops.verify import verify
from toolkit.passes.batchnorm import fold_batch_norm
from toolkit.passes.context import PassContext
from toolkit.passes.pipeline import pass_names, run_pipeline
from toolkit.passes.prune import eliminate_dead_code
from toolkit.passes.quantize import quantize
from toolkit.runtime.plan import Plan

RNG = np.random.default_rng(49)
W1 = RNG.normal(0, 0.4, (4, 2, 3, 3)).astype(np.float32)
B1 = RNG.normal(0, 0.1, 4).astype(np.float32)
W2 = RNG.normal(0, 0.2, (5, 144)).astype(np.float32)       # InnerProduct's [O, I]
B2 = RNG.normal(0, 0.1, 5).astype(np.float32)
W3 = RNG.normal(0, 0.5, (3, 5)).astype(np.float32)
B3 = RNG.normal(0, 0.1, 3).astype(np.float32)
X = RNG.uniform(0, 1, (6, 2, 6, 6)).astype(np.float32)


def float_net(x, top="ip2"):
    """The float net in float64 (numpy only); ``top``: conv1 or ip1 stops there."""
    h = np.maximum(conv(x.astype(np.float64), W1, B1), 0)
    if top == "conv1":
        return h
    h = np.maximum(h.reshape(len(x), -1) @ W2.T + B2, 0)
    return h if top == "ip1" else h @ W3.T + B3


def conv(x, w, b):
    """3x3, pad 1, stride 1, by explicit windows."""
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            y += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return y + b[None, :, None, None]


# what min/max calibration says (uint8; these tops are ReLU's, so rmin = 0 and the zero point 0)
SCALES = {"data": {"scale": 1 / 255, "zero_point": 0},
          **{top: {"scale": float(float_net(X, top).max() / 255), "zero_point": 0} for top in ("conv1", "ip1")}}


def section(activations=None, float_layers=()):
    return QuantizationSpec.model_validate({"activations": activations or SCALES, "float": list(float_layers)})


def net(quant=None, weight_input: bool = False, phase: str = "infer"):
    """data -> conv1 (+bias, ReLU) -> flatten -> ip1 (+bias, ReLU) -> ip2 (+bias): output ip2."""
    t = Tiny(phase)
    x = t.input("data", (N, 2, 6, 6), "float32")
    x.name = "data"
    b = Builder(t.g, "conv1")
    w1 = t.weight("conv1.weight", W1.shape, "float32") if weight_input else b.op("constant", value=W1)
    c = b.op("conv2d", x, w1, b.op("constant", value=B1), stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1)
    c.name = "conv1"
    r = Builder(t.g, "relu1").op("relu", c)
    r.name = "conv1"
    b = Builder(t.g, "ip1")
    m = b.op("matmul", b.reshape(r, (N, 144)), b.op("constant", value=W2), trans_a=False, trans_b=True)
    h = b.add(m, b.op("constant", value=B2))
    h.name = "ip1"
    r2 = Builder(t.g, "relu2").op("relu", h)
    r2.name = "ip1"
    b = Builder(t.g, "ip2")
    y = b.add(b.op("matmul", r2, b.op("constant", value=W3.T.copy()), trans_a=False, trans_b=False),
              b.op("constant", value=B3))
    y.name = "ip2"
    t.out("ip2", y)
    t.g.quantization = quant
    return t.g


# -- the float simulation: numpy only, from the interface's definitions ----------------------------
def fq(v, scale, zero_point=0, lo=0, hi=255):
    """dequantize(quantize(v)): round half to even in float32, as QuantizeLinear."""
    q = np.clip(np.rint(v.astype(np.float32) / np.float32(scale)) + zero_point, lo, hi)
    return ((q - zero_point) * scale).astype(np.float64)


def fq_weights(w):
    rows = w.reshape(w.shape[0], -1).astype(np.float64)
    s = np.abs(rows).max(axis=1) / 127
    return (np.clip(np.rint(rows / s[:, None]), -127, 127) * s[:, None]).reshape(w.shape), s


def fq_bias(bias, x_scale, w_scales):
    step = x_scale * w_scales
    return np.rint(bias / step) * step


def simulated(x):
    s = {k: v["scale"] for k, v in SCALES.items()}
    w1, ws1 = fq_weights(W1)
    a1 = fq(np.maximum(conv(fq(x, s["data"]), w1, fq_bias(B1, s["data"], ws1)), 0), s["conv1"])
    w2, ws2 = fq_weights(W2)
    a2 = fq(np.maximum(a1.reshape(len(x), -1) @ w2.T + fq_bias(B2, s["conv1"], ws2), 0), s["ip1"])
    w3, ws3 = fq_weights(W3)
    return a2 @ w3.T + fq_bias(B3, s["ip1"], ws3)


def run(graph, x):
    outs = Plan(graph, {"N": len(x)}, {}).run({"data": x})
    got = np.array(outs["ip2"])
    ref, _ = interpret(graph, {"data": x}, {})
    np.testing.assert_array_equal(got, ref["ip2"])        # plan kernels == the ops' references
    return got


# -- what it changes, and the numbers --------------------------------------------------------------
def test_conv_and_inner_products_become_int8_and_match_the_float_simulation():
    ctx = PassContext()
    g = apply(net(section()), quantize, ctx=ctx)
    verify(g)
    run_pipeline(g, PassContext(disabled=frozenset(n for n in pass_names() if n != "eliminate_dead_code")))
    assert ops(g).count("qconv2d") == 1 and ops(g).count("qgemm") == 2
    assert not {"conv2d", "matmul", "relu", "add"} & set(ops(g))
    # int8 enters once (the input) and never leaves before the output: conv1 -> ip1 -> ip2 stay u8
    assert ops(g).count("quantize_linear") == 1 and "dequantize_linear" not in ops(g)
    qconv = next(n for n in g.nodes if n.op == "qconv2d")
    assert qconv.attrs["relu"] and qconv.attrs["out_dtype"] == "uint8"
    assert qconv.attrs["y_scale"] == SCALES["conv1"]["scale"]
    ip1, ip2 = [n for n in g.nodes if n.op == "qgemm"]
    assert ip1.attrs["relu"] and ip1.attrs["out_dtype"] == "uint8" and ip1.inputs[0].producer.op == "reshape"
    assert ip2.attrs["out_dtype"] == "float32" and not ip2.attrs["relu"]
    assert ctx.notes == [
        "quantize: conv1: int8: qconv2d + relu, uint8 in, uint8 out",
        "quantize: relu1: int8: folded into conv1",
        "quantize: ip1: int8: qgemm + add + relu, uint8 in, uint8 out",
        "quantize: relu2: int8: folded into ip1",
        "quantize: ip2: int8: qgemm + add, uint8 in, float32 out (no scale for its output)"]
    got = run(g, X)
    sim = simulated(X)
    exact = float_net(X)
    # the int8 net is the simulation up to float32 rounding (and a rare tie a step apart), while
    # the float net is many steps away: the test sees quantization, not just a working graph
    assert np.abs(got - sim).max() < 1e-5, np.abs(got - sim).max()
    assert np.abs(exact - sim).max() > 10 * np.abs(got - sim).max()


def test_a_graph_output_inside_the_int8_region_is_dequantized():
    g = net(section())
    g.outputs["conv1"] = next(v for n in g.nodes for v in n.outputs if n.op == "relu")
    apply(g, quantize)
    dq = g.outputs["conv1"].producer
    assert dq.op == "dequantize_linear" and dq.attrs == SCALES["conv1"]
    assert dq.inputs[0].producer.op == "qconv2d"
    outs = Plan(g, {"N": 6}, {}).run({"data": X})
    s = SCALES["data"]["scale"]
    w1, ws1 = fq_weights(W1)
    want = fq(np.maximum(conv(fq(X, s), w1, fq_bias(B1, s, ws1)), 0), SCALES["conv1"]["scale"])
    assert np.mean(np.isclose(np.array(outs["conv1"]), want, atol=1e-6)) > 0.999


# -- where it must not fire ------------------------------------------------------------------------
def structure_of(g):
    return [(n.op, tuple(v.id for v in n.inputs)) for n in g.nodes]


@pytest.mark.parametrize("make", [lambda: net(None), lambda: net(section(), phase="train"),
                                  lambda: net(section(), weight_input=True, phase="test")],
                         ids=["no-section", "train-phase", "test-phase-of-a-training-run"])
def test_nothing_without_a_section_or_in_the_train_phase(make):
    g = make()
    before = structure_of(g)
    ctx = PassContext()
    assert apply(g, quantize, ctx=ctx) is g and structure_of(g) == before and ctx.notes == []


def test_a_listed_float_layer_stays_float_and_its_reader_quantizes_its_output():
    ctx = PassContext()
    g = apply(net(section(float_layers=[{"layer": "conv1", "reason": "first layer"}])), quantize, ctx=ctx)
    assert ops(g).count("conv2d") == 1 and ops(g).count("qgemm") == 2
    q = next(n for n in g.nodes if n.op == "quantize_linear")
    assert q.attrs["scale"] == SCALES["conv1"]["scale"] and q.inputs[0].producer.op == "reshape"     # at conv1's scale
    assert ctx.notes[0] == "quantize: conv1: float: listed float: first layer"


def test_no_scale_for_an_input_keeps_the_layer_float_and_says_so():
    ctx = PassContext()
    g = apply(net(section({k: v for k, v in SCALES.items() if k != "data"})), quantize, ctx=ctx)
    assert ops(g).count("conv2d") == 1 and ops(g).count("qgemm") == 2
    assert "quantize: conv1: float: no scale for its input 'data'" in ctx.notes


def test_a_weight_given_at_run_time_is_not_quantized():
    ctx = PassContext()
    g = apply(net(section(), weight_input=True), quantize, ctx=ctx)
    assert "conv2d" in ops(g)
    assert ("quantize: conv1: float: conv2d's weight is not a constant (weights given at run time)"
            in ctx.notes)


def test_the_pipeline_runs_it_after_batchnorm_folding_and_before_layout_and_fusion():
    names = pass_names()
    assert names.index("fold_batch_norm") < names.index("quantize") < names.index("choose_layout")
    assert names.index("quantize") < min(names.index(n) for n in ("fuse_epilogue", "fuse_elementwise"))
    on = run_pipeline(net(section()), PassContext())
    off = run_pipeline(net(section()), PassContext(disabled=frozenset({"quantize"})))
    assert "qconv2d" in ops(on) and not {"qconv2d", "qgemm", "quantize_linear"} & set(ops(off))


def test_a_folded_batchnorm_keeps_its_tops_scale():
    """conv -> per-channel scale and shift (a BatchNorm, top 'bn1', no ReLU) -> InnerProduct: once
    folded, the convolution writes the BatchNorm's top, and its uint8 output has that top's scale."""
    t = Tiny()
    x = t.input("data", (N, 2, 6, 6), "float32")
    x.name = "data"
    b = Builder(t.g, "conv1")
    c = b.op("conv2d", x, b.op("constant", value=W1), stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1)
    b = Builder(t.g, "bn1")
    bn = b.add(b.mul(c, b.op("constant", value=np.full((1, 4, 1, 1), 0.5, np.float32))),
               b.op("constant", value=np.full((1, 4, 1, 1), 0.25, np.float32)))
    bn.name = "bn1"
    b = Builder(t.g, "ip1")
    t.out("ip1", b.op("matmul", b.reshape(bn, (N, 144)), b.op("constant", value=W2), trans_a=False, trans_b=True))
    t.g.quantization = section({"data": SCALES["data"], "bn1": {"scale": 0.03, "zero_point": 40}})
    g = run_pipeline(t.g, PassContext(check=True))
    qconv = next(n for n in g.nodes if n.op == "qconv2d")
    assert (qconv.attrs["out_dtype"], qconv.attrs["y_scale"], qconv.attrs["y_zero_point"]) == ("uint8", 0.03, 40)
    assert fold_batch_norm.__name__ in pass_names()


def test_max_pooling_keeps_the_int8_region_and_commutes_exactly():
    """conv1 (+ReLU) -> 3x3 max pooling, stride 2, pad 1 -> flatten -> ip1: the pooling runs on
    int8 at conv1's scale and zero point -100 (its padding -128, never a maximum: a padding of 0
    would beat the values from -100 to -1), equal to pooling the dequantized values."""
    t = Tiny()
    x = t.input("data", (N, 2, 6, 6), "float32")
    x.name = "data"
    b = Builder(t.g, "conv1")
    c = b.op("conv2d", x, b.op("constant", value=W1), b.op("constant", value=B1), stride=(1, 1), pad=(1, 1),
             dilation=(1, 1), group=1)
    r = Builder(t.g, "relu1").op("relu", c)
    r.name = "conv1"
    p = Builder(t.g, "pool1").op("max_pool2d", r, kernel=(3, 3), stride=(2, 2), pad=(1, 1), ceil_mode=False)
    p.name = "pool1"
    t.out("pool1", p)
    b = Builder(t.g, "ip1")
    t.out("ip1", b.op("matmul", b.reshape(p, (N, 36)), b.op("constant", value=W2[:, :36].copy()),
                      trans_a=False, trans_b=True))
    scale = float(float_net(X, "conv1").max() / 227)
    t.g.quantization = section({**SCALES, "conv1": {"scale": scale, "zero_point": -100, "dtype": "int8"}})
    ctx = PassContext()
    g = apply(t.g, quantize, eliminate_dead_code, ctx=ctx)
    pool, = [n for n in g.nodes if n.op == "max_pool2d"]
    assert pool.inputs[0].producer.op == "qconv2d" and pool.outputs[0].dtype == "int8"
    assert "quantize: pool1: int8: max_pool2d on int8 (commutes with quantization: keeps its input's scale)" \
        in ctx.notes
    got = np.array(Plan(g, {"N": 6}, {}).run({"data": X})["pool1"])
    s = SCALES["data"]["scale"]
    w1, ws1 = fq_weights(W1)
    a1 = fq(np.maximum(conv(fq(X, s), w1, fq_bias(B1, s, ws1)), 0), scale, -100, -128, 127)
    want = np.full((6, 4, 3, 3), -np.inf)
    padded = np.pad(a1, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    for i in range(3):
        for j in range(3):
            want = np.maximum(want, padded[:, :, i:i + 5:2, j:j + 5:2])
    assert np.mean(np.isclose(got, want, atol=1e-6, rtol=0)) > 0.999


# -- int8 through a residual add, global average pooling, average pooling and a concatenation --------
WR = RNG.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)
BR = RNG.normal(0, 0.1, 4).astype(np.float32)
WF = RNG.normal(0, 0.5, (3, 4)).astype(np.float32)
BF = RNG.normal(0, 0.1, 3).astype(np.float32)


def conv_op(t, x, w, b, scope, top):
    bld = Builder(t.g, scope)
    c = bld.op("conv2d", x, bld.op("constant", value=w), bld.op("constant", value=b), stride=(1, 1), pad=(1, 1),
               dilation=(1, 1), group=1)
    c.name = top
    return c


def named(t, scope, op, *xs, top, **attrs):
    v = Builder(t.g, scope).op(op, *xs, **attrs)
    v.name = top
    return v


def resnet_floats(x):
    """The residual net in float64: conv1 (+ReLU) -> conv2 -> conv1 + conv2 (+ReLU) -> mean over
    H and W -> fc. Each top's value, for the scales."""
    c1 = np.maximum(conv(x.astype(np.float64), W1, B1), 0)
    c2 = conv(c1, WR, BR)
    res = np.maximum(c1 + c2, 0)
    pool = res.mean(axis=(2, 3), keepdims=True)
    return {"data": x, "conv1": c1, "conv2": c2, "res": res, "pool": pool, "fc": pool.reshape(len(x), 4) @ WF.T + BF}


def minmax(v, dtype="uint8"):
    from toolkit.quantization.scales import scale_zero_point
    scale, zp = scale_zero_point(float(v.min()), float(v.max()), dtype)
    return {"scale": scale, "zero_point": zp, "dtype": dtype}


def resnet_net(dtype="uint8"):
    t = Tiny()
    x = t.input("data", (N, 2, 6, 6), "float32")
    x.name = "data"
    c1 = named(t, "relu1", "relu", conv_op(t, x, W1, B1, "conv1", "conv1"), top="conv1")
    c2 = conv_op(t, c1, WR, BR, "conv2", "conv2")
    res = named(t, "res_relu", "relu", named(t, "res", "add", c1, c2, top="res"), top="res")
    pool = named(t, "pool", "reduce_mean", res, axes=(2, 3), keepdims=True, top="pool")
    b = Builder(t.g, "fc")
    fc = b.add(b.op("matmul", b.reshape(pool, (N, 4)), b.op("constant", value=WF), trans_a=False, trans_b=True),
               b.op("constant", value=BF))
    fc.name = "fc"
    t.out("fc", fc)
    floats = resnet_floats(X)
    t.g.quantization = section({k: minmax(v, dtype) for k, v in floats.items() if k != "fc"})
    return t.g, floats


def simulated_resnet(x, acts):
    """The int8 net as dequantize(quantize(v)) at each top's parameters, weights and biases rounded
    as the interface says, in float64."""
    def fq_act(v, top):
        a = acts[top]
        lo, hi = (0, 255) if a["dtype"] == "uint8" else (-128, 127)
        return fq(v, a["scale"], a["zero_point"], lo, hi)
    s = {k: a["scale"] for k, a in acts.items()}
    w1, ws1 = fq_weights(W1)
    c1 = fq_act(np.maximum(conv(fq_act(x, "data"), w1, fq_bias(B1, s["data"], ws1)), 0), "conv1")
    wr, wsr = fq_weights(WR)
    c2 = fq_act(conv(c1, wr, fq_bias(BR, s["conv1"], wsr)), "conv2")
    res = fq_act(np.maximum(c1 + c2, 0), "res")
    pool = fq_act(res.mean(axis=(2, 3)), "pool")
    wf, wsf = fq_weights(WF)
    return pool @ wf.T + fq_bias(BF, s["pool"], wsf)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_a_residual_block_and_global_pooling_stay_int8(dtype):
    """conv -> conv -> residual add (+ReLU) -> global average pooling -> InnerProduct: int8 from the
    input's one quantize_linear to the classifier's float32 output, no dequantize_linear between
    (the add and the pooling used to run in float: conv1's result dequantized for the add, the
    pooled value quantized again for the classifier, two quantize_linear and one dequantize_linear);
    within a stated bound of the float net, and nearer the float simulation of the int8 net."""
    g, floats = resnet_net(dtype)
    ctx = PassContext()
    g = apply(g, quantize, eliminate_dead_code, ctx=ctx)
    verify(g)
    assert (ops(g).count("quantize_linear"), ops(g).count("dequantize_linear")) == (1, 0)
    assert not {"conv2d", "matmul", "add", "relu", "reduce_mean"} & set(ops(g)), ops(g)
    qadd, = [n for n in g.nodes if n.op == "qadd"]
    pool, = [n for n in g.nodes if n.op == "qglobal_avg_pool"]
    assert qadd.attrs["relu"] and [x.producer.op for x in qadd.inputs] == ["qconv2d", "qconv2d"]
    assert pool.inputs[0] is qadd.outputs[0] and pool.outputs[0].dtype == dtype
    acts = g.quantization.activations
    assert (qadd.attrs["y_scale"], qadd.attrs["y_zero_point"]) == (acts["res"].scale, acts["res"].zero_point)
    assert f"quantize: res: int8: qadd + relu, {dtype} + {dtype} in, {dtype} out" in ctx.notes
    assert "quantize: res_relu: int8: folded into res" in ctx.notes
    assert f"quantize: pool: int8: qglobal_avg_pool, {dtype} in, {dtype} out" in ctx.notes
    assert f"quantize: conv2: int8: qconv2d, {dtype} in, {dtype} out" in ctx.notes
    got = np.array(Plan(g, {"N": 6}, {}).run({"data": X})["fc"])
    ref, _ = interpret(g, {"data": X}, {})
    np.testing.assert_array_equal(got, ref["fc"])
    sim = simulated_resnet(X, {k: v.model_dump() for k, v in acts.items()})
    exact = floats["fc"]
    # the stated bound: two steps of the pooled value through the classifier's weights
    bound = 2 * acts["pool"].scale * np.abs(WF).sum(axis=1).max()
    assert np.abs(got - exact).max() < bound, (np.abs(got - exact).max(), bound)
    # and it is quantization that is seen: the simulation is much nearer than the float net
    assert np.abs(got - sim).max() < 0.3 * np.abs(exact - sim).max() + 1e-6, (np.abs(got - sim).max(),
                                                                               np.abs(exact - sim).max())


def test_a_residual_add_of_a_float_layer_quantizes_that_input_once():
    """conv2 listed float: the add reads its float result quantized at conv2's top (one more
    quantize_linear), and stays int8."""
    g, _ = resnet_net()
    g.quantization = section({k: v.model_dump() for k, v in g.quantization.activations.items()},
                             float_layers=[{"layer": "conv2", "reason": "measured"}])
    ctx = PassContext()
    g = apply(g, quantize, eliminate_dead_code, ctx=ctx)
    assert ops(g).count("qadd") == 1 and ops(g).count("conv2d") == 1
    q = [n for n in g.nodes if n.op == "quantize_linear"]
    assert sorted(n.attrs["scale"] for n in q) == sorted([g.quantization.activations["data"].scale,
                                                          g.quantization.activations["conv2"].scale])
    # conv2 reads conv1 as float: one dequantize_linear, after conv1
    assert [n.inputs[0].producer.op for n in g.nodes if n.op == "dequantize_linear"] == ["qconv2d"]


def test_an_add_without_a_scale_for_its_result_stays_float_and_says_why():
    g, _ = resnet_net()
    acts = {k: v.model_dump() for k, v in g.quantization.activations.items() if k != "res"}
    g.quantization = section(acts)
    ctx = PassContext()
    g = apply(g, quantize, eliminate_dead_code, ctx=ctx)
    assert "qadd" not in ops(g) and "add" in ops(g)
    assert "quantize: res: float: no scale for its output" in ctx.notes


def test_average_pooling_and_a_concatenation_stay_int8():
    """conv1 (+ReLU) -> 3x3 average pooling (stride 1, pad 1) -> concat(conv1, pooled) -> flatten ->
    InnerProduct: the pooling's result has a scale of its own, so the concatenation copies one
    input and requantizes the other."""
    t = Tiny()
    x = t.input("data", (N, 2, 6, 6), "float32")
    x.name = "data"
    c1 = named(t, "relu1", "relu", conv_op(t, x, W1, B1, "conv1", "conv1"), top="conv1")
    pooled = named(t, "pool", "avg_pool2d", c1, kernel=(3, 3), stride=(1, 1), pad=(1, 1), ceil_mode=False,
                   count_include_pad=False, top="pool")
    cat = named(t, "cat", "concat", c1, pooled, axis=1, top="cat")
    t.out("cat", cat)
    t.out("conv1", c1)
    b = Builder(t.g, "ip")
    t.out("ip", b.op("matmul", b.reshape(cat, (N, 288)), b.op("constant", value=np.tile(W2, 2)),
                     trans_a=False, trans_b=True))
    c1f = float_net(X, "conv1")
    pf = np.array(interpret(t.g, {"data": X}, {})[0]["cat"])[:, 4:]
    acts = {"data": SCALES["data"], "conv1": minmax(c1f), "pool": minmax(pf), "cat": minmax(c1f)}
    t.g.quantization = section(acts)
    ctx = PassContext()
    g = apply(t.g, quantize, eliminate_dead_code, ctx=ctx)
    assert (ops(g).count("quantize_linear"), ops(g).count("qavg_pool2d"), ops(g).count("qconcat")) == (1, 1, 1)
    assert "avg_pool2d" not in ops(g) and "concat" not in ops(g)
    assert "quantize: pool: int8: qavg_pool2d, uint8 in, uint8 out" in ctx.notes
    assert "quantize: cat: int8: qconcat, 2 x uint8 in, uint8 out" in ctx.notes
    qcat, = [n for n in g.nodes if n.op == "qconcat"]
    assert [x.producer.op for x in qcat.inputs] == ["qconv2d", "qavg_pool2d"]
    vals, _ = interpret(g, {"data": X}, {})
    outs = Plan(g, {"N": 6}, {}).run({"data": X})
    np.testing.assert_array_equal(np.array(outs["ip"]), vals["ip"])
    # the concatenation's int8 result, read back through its dequantize: conv1's values copied
    # (same parameters), the pooled ones requantized; against the float values within a step
    got, c1q = np.array(outs["cat"]), np.array(outs["conv1"])
    np.testing.assert_array_equal(got[:, :4], c1q)
    padded = np.pad(c1q.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones((6, 6)), 1)
    sums = sum(padded[:, :, i:i + 6, j:j + 6] for i in range(3) for j in range(3))
    mean = sums / sum(ones[i:i + 6, j:j + 6] for i in range(3) for j in range(3))
    # the mean of conv1's int8 values, rounded once at the pooling's scale, once at the concat's
    assert np.abs(got[:, 4:] - mean).max() <= (acts["pool"]["scale"] + acts["cat"]["scale"]) / 2 + 1e-6

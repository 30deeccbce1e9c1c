"""Caffe's remaining layers: PReLU, Bias, Threshold, Clip, Swish, MVN, its other losses
(MultinomialLogistic, Infogain, Hinge, Contrastive), SPP and LSTMUnit, each lowered to primitives
(their gradients come from the primitives' rules; Threshold's step has none, as in Caffe, whose
Threshold layer has no backward)."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from schemas.base import Bool, LayerBase, Number, ParamLayerBase

from .registry import LayerError, layer, layer_axis, need_float_input, static_dim
from .scale import ZERO, _scaled_axes


class PReLUParams(ParamLayerBase):
    """y = max(0, x) + a * min(0, x), a learned per channel (axis 1), or one for all with
    channel_shared; Caffe's and PyTorch's default a is 0.25."""
    type: Literal["PReLU"]
    channel_shared: Bool = False


@layer(PReLUParams)
def lower_prelu(p: PReLUParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "PReLU")
    b = ctx.b
    channels = 1 if p.channel_shared or x.rank < 2 else static_dim(x.shape[1], "the input's channels", "bottom")
    a = ctx.param("weight", (channels,), default_filler={"type": "constant", "value": 0.25},
                  filler_key="weight_filler")
    if x.rank >= 2 and not p.channel_shared:
        a = b.reshape(a, (channels,) + (1,) * (x.rank - 2))
    positive = b.op("relu", x)
    return [b.add(positive, b.mul(b.sub(x, positive), a))]


class BiasParams(ParamLayerBase):
    """y = x + bias, the bias spanning the input's axes [axis, axis + num_axes) (learned, Caffe's
    default filler 0) or the second bottom, broadcast over the others (Caffe's BiasLayer)."""
    type: Literal["Bias"]
    axis: int = 1
    num_axes: int = 1
    BOTTOMS: ClassVar = (1, 2)


@layer(BiasParams)
def lower_bias(p: BiasParams, ctx, bottoms):
    x = bottoms[0]
    need_float_input(x, "Bias")
    b = ctx.b
    if len(bottoms) == 2:
        bias = bottoms[1]
        axis = layer_axis(p.axis, x, ctx) if bias.rank else x.rank
        if tuple(x.shape[axis: axis + bias.rank]) != tuple(bias.shape):
            raise LayerError(f"the bias bottom {ctx.fmt(bias)} must have the shape of the input {ctx.fmt(x)}'s "
                             f"axes from axis {p.axis}", "bottom")
        shape = tuple(bias.shape)
    else:
        axis, count = _scaled_axes(p, x, ctx)
        shape = tuple(static_dim(d, f"axis {i} of the input {ctx.fmt(x)} (given a learned bias)", "axis")
                      for i, d in enumerate(x.shape[axis: axis + count], start=axis))
        bias = ctx.param("bias", shape, default_filler=ZERO, filler_key="bias_filler")
    trailing = (1,) * (x.rank - axis - len(shape))
    return [b.add(x, b.reshape(bias, shape + trailing) if shape else bias)]


class ThresholdParams(LayerBase):
    """y = 1 where x > threshold, else 0."""
    type: Literal["Threshold"]
    threshold: Number = 0.0


@layer(ThresholdParams)
def lower_threshold(p: ThresholdParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "Threshold")
    b = ctx.b
    # x > t is 1 - (t >= x)
    return [b.sub(b.scalar(1.0, x.dtype), b.op("ge_mask", b.scalar(float(p.threshold), x.dtype), x))]


class ClipParams(LayerBase):
    """y = min(max(x, min), max)."""
    type: Literal["Clip"]
    min: Number
    max: Number


@layer(ClipParams)
def lower_clip(p: ClipParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "Clip")
    if p.min > p.max:
        raise LayerError(f"min {p.min} is above max {p.max}", "min")
    b = ctx.b
    low = b.op("maximum", x, b.scalar(float(p.min), x.dtype))
    return [b.op("neg", b.op("maximum", b.op("neg", low), b.scalar(-float(p.max), x.dtype)))]


class SwishParams(LayerBase):
    """y = x * sigmoid(beta * x)."""
    type: Literal["Swish"]
    beta: Number = 1.0


@layer(SwishParams)
def lower_swish(p: SwishParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "Swish")
    b = ctx.b
    inner = x if p.beta == 1.0 else b.mul(x, b.scalar(float(p.beta), x.dtype))
    return [b.mul(x, b.op("sigmoid", inner))]


class MVNParams(LayerBase):
    """Caffe's mean-variance normalisation of each example: x minus its mean over the spatial
    axes (and the channels with across_channels), divided by (its standard deviation + eps) with
    normalize_variance, the deviation the biased one (Caffe divides by the count)."""
    type: Literal["MVN"]
    normalize_variance: Bool = True
    across_channels: Bool = False
    eps: Number = 1e-9


@layer(MVNParams)
def lower_mvn(p: MVNParams, ctx, bottoms):
    x, = bottoms
    need_float_input(x, "MVN")
    if x.rank < 2:
        raise LayerError(f"MVN needs an input [N, C, ...], got {ctx.fmt(x)}", "bottom")
    b = ctx.b
    axes = tuple(range(1 if p.across_channels else 2, x.rank))
    if not axes:
        raise LayerError(f"MVN over the spatial axes needs some, the input is {ctx.fmt(x)}", "bottom")
    centred = b.sub(x, b.op("reduce_mean", x, axes=axes, keepdims=True))
    if not p.normalize_variance:
        return [centred]
    deviation = b.op("sqrt", b.op("reduce_mean", b.op("square", centred), axes=axes, keepdims=True))
    return [b.div(centred, b.add(deviation, b.scalar(float(p.eps), x.dtype)))]


# -- Caffe's other losses ----------------------------------------------------------------------

LOG_THRESHOLD = 1e-20          # Caffe's kLOG_THRESHOLD: probabilities below it count as it


def _class_count(scores, ctx) -> int:
    if scores.rank != 2:
        raise LayerError(f"the scores must be [N, C], got {ctx.fmt(scores)}", "bottom")
    return static_dim(scores.shape[1], "the number of classes", "bottom")


def _clipped_log(ctx, p):
    b = ctx.b
    return b.op("log", b.op("maximum", p, b.scalar(LOG_THRESHOLD, p.dtype)))


def _need_labels(label, ctx):
    from toolkit.ir.graph import INT_DTYPES
    if label.dtype not in INT_DTYPES or label.rank != 1:
        raise LayerError(f"the label must be integers [N], got {ctx.fmt(label)}", "bottom")


class MultinomialLogisticLossParams(LayerBase):
    """-mean over the batch of log p[label], p the given probabilities [N, C] (clipped at 1e-20)."""
    type: Literal["MultinomialLogisticLoss"]
    BOTTOMS: ClassVar = (2, 2)


@layer(MultinomialLogisticLossParams)
def lower_multinomial_logistic_loss(p, ctx, bottoms):
    prob, label = bottoms
    need_float_input(prob, "MultinomialLogisticLoss")
    _class_count(prob, ctx)
    _need_labels(label, ctx)
    return [ctx.b.op("nll_loss", _clipped_log(ctx, prob), label, axis=1, ignore_index=None)]


class InfogainLossParams(LayerBase):
    """Caffe's InfogainLoss: -mean over the batch of sum_k H[label, k] log softmax(x)_k, the
    infogain matrix H [C, C] the third bottom, or else the layer's own ``infogain`` weight, which
    no gradient updates (the identity unless the weights file holds it: Caffe's H from a file;
    the identity makes it SoftmaxWithLoss)."""
    type: Literal["InfogainLoss"]
    axis: int = 1
    BOTTOMS: ClassVar = (2, 3)


@layer(InfogainLossParams)
def lower_infogain_loss(p, ctx, bottoms):
    scores, label = bottoms[:2]
    need_float_input(scores, "InfogainLoss")
    classes = _class_count(scores, ctx)
    _need_labels(label, ctx)
    infogain = bottoms[2] if len(bottoms) == 3 else ctx.state("infogain", (classes, classes), 0.0,
                                                               init={"type": "identity"})
    if tuple(infogain.shape) != (classes, classes):
        raise LayerError(f"the infogain matrix must be [{classes}, {classes}], got {ctx.fmt(infogain)}", "bottom")
    b = ctx.b
    prob = b.op("softmax", scores, axis=1)
    rows = b.op("embedding", infogain, label, layer=ctx.layer.name)          # H[label]: [N, C]
    per_example = b.op("reduce_sum", b.mul(rows, _clipped_log(ctx, prob)), axes=(1,), keepdims=False)
    return [b.op("neg", b.op("reduce_mean", per_example, axes=(0,), keepdims=False))]


class HingeLossParams(LayerBase):
    """Caffe's HingeLoss: with t +1 at the label and -1 elsewhere, the batch mean of
    sum_k max(0, 1 - t_k x_k) (norm l1) or of its squares (l2)."""
    type: Literal["HingeLoss"]
    norm: Literal["l1", "l2"] = "l1"
    BOTTOMS: ClassVar = (2, 2)


@layer(HingeLossParams)
def lower_hinge_loss(p, ctx, bottoms):
    import numpy as np
    scores, label = bottoms
    need_float_input(scores, "HingeLoss")
    classes = _class_count(scores, ctx)
    _need_labels(label, ctx)
    b = ctx.b
    signs = b.op("constant", value=(2 * np.eye(classes) - 1).astype(scores.dtype))       # rows: t for each label
    t = b.op("embedding", signs, label, layer=ctx.layer.name)
    margin = b.op("relu", b.sub(b.scalar(1.0, scores.dtype), b.mul(t, scores)))
    if p.norm == "l2":
        margin = b.op("square", margin)
    per_example = b.op("reduce_sum", margin, axes=(1,), keepdims=False)
    return [b.op("reduce_mean", per_example, axes=(0,), keepdims=False)]


class ContrastiveLossParams(LayerBase):
    """Caffe's ContrastiveLoss on pairs (a, b, y), y 1 for a similar pair: the batch mean of
    y d^2 + (1 - y) max(margin - d, 0)^2, halved, d the Euclidean distance (legacy_version:
    max(margin - d^2, 0) for the dissimilar)."""
    type: Literal["ContrastiveLoss"]
    margin: Number = 1.0
    legacy_version: Bool = False
    BOTTOMS: ClassVar = (3, 3)


@layer(ContrastiveLossParams)
def lower_contrastive_loss(p, ctx, bottoms):
    a, other, similar = bottoms
    need_float_input(a, "ContrastiveLoss")
    if tuple(a.shape) != tuple(other.shape) or a.rank != 2:
        raise LayerError(f"ContrastiveLoss needs two [N, C] bottoms of one shape, got {ctx.fmt(a)} and "
                         f"{ctx.fmt(other)}", "bottom")
    b = ctx.b
    y = b.reshape(similar if similar.dtype == a.dtype else b.op("cast", similar, dtype=a.dtype), (a.shape[0],))
    d2 = b.op("reduce_sum", b.op("square", b.sub(a, other)), axes=(1,), keepdims=False)
    margin = b.scalar(float(p.margin), a.dtype)
    if p.legacy_version:
        far = b.op("relu", b.sub(margin, d2))
    else:
        far = b.op("square", b.op("relu", b.sub(margin, b.op("sqrt", d2))))
    one = b.scalar(1.0, a.dtype)
    per_pair = b.add(b.mul(y, d2), b.mul(b.sub(one, y), far))
    return [b.mul(b.op("reduce_mean", per_pair, axes=(0,), keepdims=False), b.scalar(0.5, a.dtype))]


# -- spatial pyramid pooling and Caffe's LSTM step -------------------------------------------------

class SPPParams(LayerBase):
    """Caffe's spatial pyramid pooling: for each level l < pyramid_height a pooling into 2^l x 2^l
    bins (kernel ceil(H / bins), stride the kernel, pad (kernel * bins - H + 1) // 2, Caffe's
    rounding up), each flattened, all concatenated: [N, C * sum of 4^l]."""
    type: Literal["SPP"]
    pyramid_height: Annotated[int, Field(ge=1)]
    pool: Literal["max", "ave"] = "max"


@layer(SPPParams)
def lower_spp(p: SPPParams, ctx, bottoms):
    import math
    x, = bottoms
    need_float_input(x, "SPP")
    if x.rank != 4:
        raise LayerError(f"SPP needs an input [N, C, H, W], got {ctx.fmt(x)}", "bottom")
    b = ctx.b
    channels = static_dim(x.shape[1], "the input's channels", "bottom")
    h = static_dim(x.shape[2], "the input's height", "bottom")
    w = static_dim(x.shape[3], "the input's width", "bottom")
    levels = []
    for level in range(p.pyramid_height):
        bins = 2 ** level
        kernel = (math.ceil(h / bins), math.ceil(w / bins))
        pad = ((kernel[0] * bins - h + 1) // 2, (kernel[1] * bins - w + 1) // 2)
        if 2 * pad[0] > kernel[0] or 2 * pad[1] > kernel[1]:
            raise LayerError(f"level {level} needs {bins} bins over {h} x {w}, more than the input can give "
                             "(a padding of over half the kernel)", "pyramid_height")
        attrs = dict(kernel=kernel, stride=kernel, pad=pad, ceil_mode=True)
        pooled = (b.op("max_pool2d", x, **attrs) if p.pool == "max"
                  else b.op("avg_pool2d", x, count_include_pad=True, **attrs))
        levels.append(b.reshape(pooled, (x.shape[0], channels * bins * bins)))
    return [levels[0] if len(levels) == 1 else b.op("concat", *levels, axis=1)]


class LSTMUnitParams(LayerBase):
    """Caffe's LSTMUnit, one step of its LSTM: bottoms [c_prev, x (the four gates' inputs, i f o g,
    on the last axis), cont]; c = cont * f * c_prev + i * g, h = o * tanh(c), i f o sigmoid and g
    tanh; tops [c, h]. cont (0 at a sequence's start) gets no gradient, as in Caffe."""
    type: Literal["LSTMUnit"]
    BOTTOMS: ClassVar = (3, 3)
    TOPS: ClassVar = (2, 2)


@layer(LSTMUnitParams)
def lower_lstm_unit(p: LSTMUnitParams, ctx, bottoms):
    c_prev, x, cont = bottoms
    need_float_input(c_prev, "LSTMUnit")
    hidden = static_dim(c_prev.shape[-1], "the cell's width", "bottom")
    if tuple(x.shape[:-1]) != tuple(c_prev.shape[:-1]) or x.shape[-1] != 4 * hidden:
        raise LayerError(f"the gates' input must be {ctx.fmt(c_prev)} with 4 x {hidden} on its last axis, got "
                         f"{ctx.fmt(x)}", "bottom")
    if tuple(cont.shape) != tuple(c_prev.shape[:-1]):
        raise LayerError(f"cont must be the cell's shape without its last axis, got {ctx.fmt(cont)}", "bottom")
    b = ctx.b
    axis = x.rank - 1

    def gate(k):
        return b.op("slice", x, axis=axis, start=k * hidden, stop=(k + 1) * hidden)
    i, f, o = (b.op("sigmoid", gate(k)) for k in range(3))
    g = b.op("tanh", gate(3))
    keep = cont if cont.dtype == c_prev.dtype else b.op("cast", cont, dtype=c_prev.dtype)
    keep = b.reshape(keep, tuple(cont.shape) + (1,))
    c = b.add(b.mul(b.mul(keep, f), c_prev), b.mul(i, g))
    return [c, b.mul(o, b.op("tanh", c))]


class CaffeLSTMParams(ParamLayerBase):
    """Caffe's LSTM: gates i f o g = W_xc x_t + b_c (+ W_static x_static) + W_hc (cont_t h_{t-1});
    c_t = cont_t f c_{t-1} + i g, h_t = o tanh(c_t); weights weight_x [4D, I], bias [4D],
    weight_static [4D, S], weight_h [4D, D] (Caffe's blob order). Output h [T, N, D]."""
    type: Literal["CaffeLSTM"]
    num_output: Annotated[int, Field(ge=1)]
    expose_hidden: Bool = False
    BOTTOMS: ClassVar = (2, 5)
    TOPS: ClassVar = (1, 3)


class CaffeRNNParams(ParamLayerBase):
    """Caffe's RNN: h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h (+ W_static x_static)),
    o_t = tanh(W_ho h_t + b_o); weights weight_x [D, I], bias [D], weight_static [D, S],
    weight_h [D, D], weight_out [D, D], bias_out [D]. Output o [T, N, D]."""
    type: Literal["CaffeRNN"]
    num_output: Annotated[int, Field(ge=1)]
    expose_hidden: Bool = False
    BOTTOMS: ClassVar = (2, 4)
    TOPS: ClassVar = (1, 2)


def _recurrent_bottoms(p, bottoms, states: int, ctx):
    """(x, cont, static or None, initial states or None) of a Caffe recurrent layer's bottoms."""
    x, cont = bottoms[0], bottoms[1]
    rest = list(bottoms[2:])
    initial = None
    if p.expose_hidden:
        if len(rest) < states:
            raise LayerError(f"expose_hidden needs the {states} initial state bottom(s) after x, cont (and the "
                             "static input)", "bottom")
        initial, rest = rest[-states:], rest[:-states]
    if len(rest) > 1:
        raise LayerError("too many bottoms: x, cont, an optional static input, and with expose_hidden the "
                         "initial state", "bottom")
    static = rest[0] if rest else None
    if x.rank < 3:
        raise LayerError(f"x must be time-major [T, N, ...], got {ctx.fmt(x)}", "bottom")
    if tuple(cont.shape) != tuple(x.shape[:2]):
        raise LayerError(f"cont must be [T, N] as x's first axes, got {ctx.fmt(cont)}", "bottom")
    return x, cont, static, initial


def _flat_rows(b, v, start_axis: int):
    """[..., a, b, c] as [rows, features] from ``start_axis`` on (features a fixed size)."""
    from toolkit.ir.dims import product
    features = static_dim(product(v.shape[start_axis:]), "the input's size per example", "bottom")
    return b.reshape(v, tuple(v.shape[:start_axis]) + (features,)), features


def _unrolled_steps(p, ctx, bottoms, gates_per_unit: int, states: int):
    tops = len(ctx.layer.tops)
    if tops != (1 + states if p.expose_hidden else 1):
        wanted = f"the output and {states} final state top(s)" if p.expose_hidden else "one top"
        raise LayerError(f"{p.type} has {wanted}"
                         f" ({'expose_hidden' if p.expose_hidden else 'without expose_hidden'}), got {tops}", "top")
    b = ctx.b
    x, cont, static, initial = _recurrent_bottoms(p, bottoms, states, ctx)
    need_float_input(x, p.type)
    steps = static_dim(x.shape[0], "the number of time steps (T, unrolled)", "bottom")
    n = x.shape[1]
    d = p.num_output
    xs, inputs = _flat_rows(b, x, 2)                                     # [T, N, I]
    width = gates_per_unit * d
    w_x = ctx.param("weight_x", (width, inputs), fan_in=inputs, fan_out=width)
    bias = ctx.param("bias", (width,), default_filler={"type": "constant", "value": 0.0})
    # every step's input projection in one GEMM: [T, N, I] as [T*N, I]
    projected = b.add(b.op("matmul", b.reshape(xs, (steps * n, inputs)), w_x, trans_a=False, trans_b=True), bias)
    projected = b.reshape(projected, (steps, n, width))
    static_term = None
    if static is not None:
        flat_static, s_width = _flat_rows(b, static, 1)
        w_s = ctx.param("weight_static", (width, s_width), fan_in=s_width, fan_out=width)
        static_term = b.op("matmul", flat_static, w_s, trans_a=False, trans_b=True)
    w_h = ctx.param("weight_h", (width, d), fan_in=d, fan_out=width)
    keep = cont if cont.dtype == x.dtype else b.op("cast", cont, dtype=x.dtype)
    return b, x, steps, n, d, projected, static_term, w_h, keep, initial


def _step(b, tensor, t: int, n, width: int):
    return b.reshape(b.op("slice", tensor, axis=0, start=t, stop=t + 1), (n, width))


@layer(CaffeLSTMParams)
def lower_caffe_lstm(p: CaffeLSTMParams, ctx, bottoms):
    b, x, steps, n, d, projected, static_term, w_h, keep, initial = _unrolled_steps(p, ctx, bottoms, 4, 2)
    if initial is not None:
        h, c = (b.reshape(v, (n, d)) for v in initial)
    else:
        h = c = None
    outputs = []
    for t in range(steps):
        gates = _step(b, projected, t, n, 4 * d)
        if static_term is not None:
            gates = b.add(gates, static_term)
        cont_t = b.reshape(b.op("slice", keep, axis=0, start=t, stop=t + 1), (n, 1))
        if h is not None:
            gates = b.add(gates, b.op("matmul", b.mul(h, cont_t), w_h, trans_a=False, trans_b=True))
        i, f, o = (b.op("sigmoid", b.op("slice", gates, axis=1, start=k * d, stop=(k + 1) * d)) for k in range(3))
        g = b.op("tanh", b.op("slice", gates, axis=1, start=3 * d, stop=4 * d))
        new_c = b.mul(i, g) if c is None else b.add(b.mul(b.mul(cont_t, f), c), b.mul(i, g))
        c = new_c
        h = b.mul(o, b.op("tanh", c))
        outputs.append(b.reshape(h, (1, n, d)))
    sequence = outputs[0] if len(outputs) == 1 else b.op("concat", *outputs, axis=0)
    if p.expose_hidden:
        return [sequence, b.reshape(h, (1, n, d)), b.reshape(c, (1, n, d))]
    return [sequence]


@layer(CaffeRNNParams)
def lower_caffe_rnn(p: CaffeRNNParams, ctx, bottoms):
    b, x, steps, n, d, projected, static_term, w_h, keep, initial = _unrolled_steps(p, ctx, bottoms, 1, 1)
    w_o = ctx.param("weight_out", (d, d), fan_in=d, fan_out=d)
    b_o = ctx.param("bias_out", (d,), default_filler={"type": "constant", "value": 0.0}, filler_key="bias_filler")
    h = b.reshape(initial[0], (n, d)) if initial is not None else None
    outputs = []
    for t in range(steps):
        pre = _step(b, projected, t, n, d)
        if static_term is not None:
            pre = b.add(pre, static_term)
        if h is not None:
            cont_t = b.reshape(b.op("slice", keep, axis=0, start=t, stop=t + 1), (n, 1))
            pre = b.add(pre, b.op("matmul", b.mul(h, cont_t), w_h, trans_a=False, trans_b=True))
        h = b.op("tanh", pre)
        o = b.op("tanh", b.add(b.op("matmul", h, w_o, trans_a=False, trans_b=True), b_o))
        outputs.append(b.reshape(o, (1, n, d)))
    sequence = outputs[0] if len(outputs) == 1 else b.op("concat", *outputs, axis=0)
    if p.expose_hidden:
        return [sequence, b.reshape(h, (1, n, d))]
    return [sequence]

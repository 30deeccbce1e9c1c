"""Each primitive of the toolkit's graph (loops and ifs aside: ``onnx_control``) as one ONNX
node or a few: elementwise ops, shapes, reductions, matrix products, convolution and pooling,
softmax, indexing and the losses."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Node
from ..onnxtypes import ONNX_TYPE_NUMBER
from .onnx_writer import Scope, converts

# -- elementwise --------------------------------------------------------------------------------
_SAME = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max", "abs": "Abs", "exp": "Exp",
         "log": "Log", "neg": "Neg", "relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "sqrt": "Sqrt",
         "softplus": "Softplus", "sign": "Sign", "erf": "Erf"}


@converts(*_SAME)
def _same(s: Scope, node: Node, ins: list[str]) -> list[str]:
    return [s.one(_SAME[node.op], ins)]


@converts("square")
def _square(s, node, ins):
    return [s.one("Mul", [ins[0], ins[0]])]


@converts("rsqrt")
def _rsqrt(s, node, ins):
    return [s.one("Reciprocal", [s.one("Sqrt", ins)])]


@converts("power")
def _power(s, node, ins):
    return [s.one("Pow", [ins[0], s.scalar(node.attrs["exponent"], node.inputs[0].dtype)])]


@converts("elu", "leaky_relu")
def _alpha_activation(s, node, ins):
    return [s.one({"elu": "Elu", "leaky_relu": "LeakyRelu"}[node.op], ins, alpha=float(node.attrs["alpha"]))]


@converts("gelu")
def _gelu(s, node, ins):
    x, dt = ins[0], node.inputs[0].dtype
    if node.attrs["approximate"] == "tanh":
        cube = s.one("Mul", [s.one("Mul", [x, x]), x])
        inner = s.one("Mul", [s.one("Add", [x, s.one("Mul", [cube, s.scalar(0.044715, dt)])]),
                              s.scalar(np.sqrt(2 / np.pi), dt)])
        core = s.one("Tanh", [inner])
    else:
        core = s.one("Erf", [s.one("Mul", [x, s.scalar(1 / np.sqrt(2), dt)])])
    return [s.one("Mul", [s.one("Mul", [x, s.scalar(0.5, dt)]), s.one("Add", [core, s.scalar(1.0, dt)])])]


@converts("sigmoid_cross_entropy")
def _sigmoid_ce(s, node, ins):
    x, t = ins
    dt = node.inputs[0].dtype
    zero, one = s.scalar(0.0, dt), s.scalar(1.0, dt)
    soft = s.one("Log", [s.one("Add", [one, s.one("Exp", [s.one("Neg", [s.one("Abs", [x])])])])])
    return [s.one("Add", [s.one("Sub", [s.one("Max", [x, zero]), s.one("Mul", [x, t])]), soft])]


@converts("ge_mask")
def _ge_mask(s, node, ins):
    return [s.one("Cast", [s.one("GreaterOrEqual", ins)], to=ONNX_TYPE_NUMBER[node.outputs[0].dtype])]


@converts("select")
def _select(s, node, ins):
    cond, a, b = ins
    test = s.one("Greater", [cond, s.scalar(0, node.inputs[0].dtype)])
    return [s.one("Where", [test, a, b])]


@converts("cast")
def _cast(s, node, ins):
    return [s.one("Cast", ins, to=ONNX_TYPE_NUMBER[node.attrs["dtype"]])]


@converts("scalar")
def _scalar(s, node, ins):
    return [s.scalar(node.attrs["value"], node.attrs["dtype"])]


@converts("constant")
def _constant(s, node, ins):
    return [s.model.initializer(np.asarray(node.attrs["value"]).astype(node.outputs[0].dtype), "constant")]


# -- shapes -------------------------------------------------------------------------------------
@converts("reshape")
def _reshape(s, node, ins):
    return [s.one("Reshape", [ins[0], s.model.shape(node.attrs["shape"])])]


@converts("iota")
def _iota(s, node, ins):
    """Positions: a constant for a fixed shape; else Range over the dimension's run-time size,
    reshaped onto its axis and expanded to the shape (a causal mask over a dynamic T)."""
    shape, dtype = tuple(node.attrs["shape"]), node.attrs["dtype"]
    axis = node.attrs["axis"] % len(shape)
    along = [-1 if k == axis else 1 for k in range(len(shape))]
    if all(isinstance(d, int) for d in shape):
        value = np.broadcast_to(np.arange(shape[axis]).reshape(along), shape).astype(dtype)
        return [s.model.initializer(value, "iota")]
    limit = s.one("Reshape", [s.model.dim(shape[axis]), s.model.const_i64([], "scalar_shape")])
    ramp = s.one("Range", [s.scalar(0, "int64"), limit, s.scalar(1, "int64")])
    ramp = s.one("Cast", [ramp], to=ONNX_TYPE_NUMBER[dtype])
    return [s.one("Expand", [s.one("Reshape", [ramp, s.model.const_i64(along)]), s.model.shape(shape)])]


@converts("broadcast_to")
def _broadcast_to(s, node, ins):
    return [s.one("Expand", [ins[0], s.model.shape(node.attrs["shape"])])]


@converts("transpose")
def _transpose(s, node, ins):
    return [s.one("Transpose", ins, perm=[int(p) for p in node.attrs["perm"]])]


@converts("concat")
def _concat(s, node, ins):
    return [s.one("Concat", ins, axis=int(node.attrs["axis"]))] if len(ins) > 1 else [s.one("Identity", ins)]


@converts("slice")
def _slice(s, node, ins):
    a = node.attrs
    axis = a["axis"] % node.inputs[0].rank
    return [s.one("Slice", [ins[0], s.model.dim(a["start"]), s.model.dim(a["stop"]), s.model.const_i64([axis])])]


@converts("pad_axis")
def _pad_axis(s, node, ins):
    a, rank = node.attrs, node.inputs[0].rank
    axis = a["axis"] % rank
    if not all(isinstance(d, int) for d in (a["before"], a["after"])):
        pads = [s.model.dim(a["before"] if i == axis else 0) for i in range(rank)] + \
               [s.model.dim(a["after"] if i == axis else 0) for i in range(rank)]
        return [s.one("Pad", [ins[0], s.model.top_node("Concat", pads, "pads", axis=0)])]
    pads = [0] * (2 * rank)
    pads[axis], pads[rank + axis] = a["before"], a["after"]
    return [s.one("Pad", [ins[0], s.model.const_i64(pads, "pads")])]


def _reduce(s: Scope, op: str, node: Node, ins: list[str]) -> str:
    axes = [int(x) % max(node.inputs[0].rank, 1) for x in node.attrs["axes"]]
    if not axes:
        return s.one("Identity", ins)
    keep = int(bool(node.attrs["keepdims"]))
    # ReduceSum takes its axes as an input from opset 13, the other reductions from opset 18
    if op == "ReduceSum" or s.model.opset >= 18:
        return s.one(op, [ins[0], s.model.const_i64(axes, "axes")], keepdims=keep)
    return s.one(op, ins, axes=axes, keepdims=keep)


@converts("reduce_sum", "reduce_mean")
def _reductions(s, node, ins):
    return [_reduce(s, {"reduce_sum": "ReduceSum", "reduce_mean": "ReduceMean"}[node.op], node, ins)]


# -- linear algebra, convolution, pooling -------------------------------------------------------
def _swap_last(s: Scope, x: str, rank: int) -> str:
    perm = list(range(rank))
    perm[-2:] = perm[-1], perm[-2]
    return s.one("Transpose", [x], perm=perm)


@converts("matmul")
def _matmul(s, node, ins):
    a, b = ins
    if node.attrs["trans_a"]:
        a = _swap_last(s, a, node.inputs[0].rank)
    if node.attrs["trans_b"]:
        b = _swap_last(s, b, node.inputs[1].rank)
    return [s.one("MatMul", [a, b])]


@converts("conv2d")
def _conv(s, node, ins):
    a = node.attrs
    (ph, pw) = a["pad"]
    kh, kw = node.inputs[1].shape[2:]
    return [s.one("Conv", ins, kernel_shape=[kh, kw], strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                  dilations=list(a["dilation"]), group=int(a["group"]))]


@converts("conv2d_grad_input")
def _conv_transpose(s, node, ins):
    a = node.attrs
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["pad"], a["dilation"]
    h, w = node.inputs[0].shape[2:]
    kh, kw = node.inputs[1].shape[2:]
    oh, ow = a["input_hw"]
    if not all(isinstance(d, int) for d in (h, w)):
        s.fail("a transposed convolution over a symbolic image size")
    extra = [oh - ((h - 1) * sh - 2 * ph + dh * (kh - 1) + 1), ow - ((w - 1) * sw - 2 * pw + dw * (kw - 1) + 1)]
    return [s.one("ConvTranspose", ins, kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw],
                  dilations=[dh, dw], group=int(a["group"]), output_padding=extra)]


@converts("max_pool2d", "avg_pool2d")
def _pool(s, node, ins):
    a = node.attrs
    (ph, pw) = a["pad"]
    attrs = dict(kernel_shape=list(a["kernel"]), strides=list(a["stride"]), pads=[ph, pw, ph, pw],
                 ceil_mode=int(a["ceil_mode"]))
    if node.op == "max_pool2d":
        return [s.one("MaxPool", ins, **attrs)]
    if a["ceil_mode"] and a["count_include_pad"] and (ph or pw):
        # the toolkit (as PyTorch) divides an overhanging last window by its part inside the padded
        # input, which ONNX leaves open: the padding made real zeros, then count_include_pad=0
        # divides by the part inside them; a last window that would start in the right padding,
        # which PyTorch drops and ONNX may not, is cut off after
        padded = s.one("Pad", [ins[0], s.model.const_i64([0, 0, ph, pw, 0, 0, ph, pw], "pads")])
        y = s.one("AveragePool", [padded], count_include_pad=0, **{**attrs, "pads": [0, 0, 0, 0]})
        oh, ow = node.outputs[0].shape[2:]
        return [s.one("Slice", [y, s.model.const_i64([0, 0]), s.model.shape((oh, ow)), s.model.const_i64([2, 3])])]
    return [s.one("AveragePool", ins, count_include_pad=int(a["count_include_pad"]), **attrs)]


# -- softmax, indexing, losses -------------------------------------------------------------------
@converts("softmax", "log_softmax")
def _softmax(s, node, ins):
    return [s.one({"softmax": "Softmax", "log_softmax": "LogSoftmax"}[node.op], ins, axis=int(node.attrs["axis"]))]


@converts("embedding")
def _embedding(s, node, ins):
    return [s.one("Gather", ins, axis=0)]


@converts("topk")
def _topk(s, node, ins):
    a = node.attrs
    values, indices = s.emit("TopK", [ins[0], s.model.const_i64([a["k"]])], 2, axis=int(a["axis"]))
    return [values] if a["values"] else [s.one("Cast", [indices], to=ONNX_TYPE_NUMBER[node.outputs[0].dtype])]


def _class_axis_last(s: Scope, x: str, rank: int, axis: int) -> str:
    axis %= rank
    if axis == rank - 1:
        return x
    perm = [i for i in range(rank) if i != axis] + [axis]
    return s.one("Transpose", [x], perm=perm)


@converts("nll_loss")
def _nll_loss(s, node, ins):
    logp, label = ins
    rank, axis = node.inputs[0].rank, node.attrs["axis"] % node.inputs[0].rank
    if axis != 1:
        perm = [0, axis] + [i for i in range(1, rank) if i != axis] if axis else None
        if perm is None:
            s.fail("a class axis 0")
        logp = s.one("Transpose", [logp], perm=perm)
    label = s.one("Cast", [label], to=ONNX_TYPE_NUMBER["int64"])
    attrs = {"reduction": "mean"}
    if node.attrs.get("ignore_index") is not None:
        attrs["ignore_index"] = int(node.attrs["ignore_index"])
    return [s.one("NegativeLogLikelihoodLoss", [logp, label], **attrs)]


@converts("accuracy")
def _accuracy(s, node, ins):
    scores, label = ins
    rank = node.inputs[0].rank
    flat = _class_axis_last(s, scores, rank, node.attrs["axis"])
    dt = node.inputs[0].dtype
    lab = s.one("Unsqueeze", [s.one("Cast", [label], to=ONNX_TYPE_NUMBER["int64"]), s.model.const_i64([-1])])
    true_score = s.one("GatherElements", [flat, lab], axis=-1)
    higher = s.one("ReduceSum", [s.one("Cast", [s.one("Greater", [flat, true_score])], to=ONNX_TYPE_NUMBER[dt]),
                                 s.model.const_i64([-1])], keepdims=0)
    hit = s.one("Cast", [s.one("Less", [higher, s.scalar(float(node.attrs["top_k"]), dt)])], to=ONNX_TYPE_NUMBER[dt])
    return [s.one("ReduceMean", [hit], keepdims=0)]          # no axes: every axis, in every opset

"""ONNX's normalisations: Softmax and LogSoftmax, BatchNormalization (inference, and training
mode with its running statistics), LayerNormalization, InstanceNormalization and LRN."""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import Value

from ..convert import is_const
from .base import converts, float_input


@converts("Softmax", "LogSoftmax")
def _softmax(imp, node):
    x = float_input(imp, node.input[0])
    axis = imp.attr(node, "axis", -1) % x.rank
    return [imp.b.op({"Softmax": "softmax", "LogSoftmax": "log_softmax"}[node.op_type], x, axis=axis)]


def _channel_shaped(imp, v: Value, rank: int) -> Value:
    return imp.b.reshape(v, (v.shape[0],) + (1,) * (rank - 2))


@converts("BatchNormalization")
def _batch_norm(imp, node):
    if imp.attr(node, "training_mode", 0):
        return _batch_norm_training(imp, node)
    x = float_input(imp, node.input[0])
    eps = float(imp.attr(node, "epsilon", 1e-5))
    consts = [imp.env[n] for n in node.input[1:5]]
    b = imp.b
    if all(is_const(c) or (isinstance(c, Value) and c.name in imp.weights) for c in consts):
        scale, bias, mean, var = (c if is_const(c) else imp.weights[c.name] for c in consts)
        a = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
        shift = np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * a
        shape = (a.shape[0],) + (1,) * (x.rank - 2)
        a_v = imp.materialize(a.reshape(shape).astype(x.dtype), x)
        s_v = imp.materialize(shift.reshape(shape).astype(x.dtype), x)
        return [b.add(b.mul(x, a_v), s_v)]
    scale, bias, mean, var = (_channel_shaped(imp, imp.value(n, x), x.rank) for n in node.input[1:5])
    inv = b.op("rsqrt", b.add(var, b.scalar(eps, x.dtype)))
    return [b.add(b.mul(b.mul(b.sub(x, mean), inv), scale), bias)]


def _batch_norm_training(imp, node):
    """training_mode 1: normalised by the batch's own mean and (biased) variance over every axis
    but the channels; the running mean and variance outputs moved toward them by 1 - momentum."""
    x = float_input(imp, node.input[0])
    b = imp.b
    eps, momentum = float(imp.attr(node, "epsilon", 1e-5)), float(imp.attr(node, "momentum", 0.9))
    axes = tuple(i for i in range(x.rank) if i != 1)
    mean = b.op("reduce_mean", x, axes=axes, keepdims=True)
    centred = b.sub(x, mean)
    var = b.op("reduce_mean", b.op("square", centred), axes=axes, keepdims=True)
    scale, bias = (_channel_shaped(imp, imp.value(n, x), x.rank) for n in node.input[1:3])
    y = b.add(b.mul(b.mul(centred, b.op("rsqrt", b.add(var, b.scalar(eps, x.dtype)))), scale), bias)
    channels = (x.shape[1],)
    running = [b.add(b.scale(imp.value(n, x), momentum), b.scale(b.reshape(stat, channels), 1.0 - momentum))
               for n, stat in zip(node.input[3:5], (mean, var))]
    return [y] + running


def _normalize(imp, x: Value, axes: tuple, eps: float) -> Value:
    b = imp.b
    mean = b.op("reduce_mean", x, axes=axes, keepdims=True)
    centred = b.sub(x, mean)
    var = b.op("reduce_mean", b.op("square", centred), axes=axes, keepdims=True)
    return b.mul(centred, b.op("rsqrt", b.add(var, b.scalar(eps, x.dtype))))


@converts("LayerNormalization")
def _layer_norm(imp, node):
    x = float_input(imp, node.input[0])
    axis = imp.attr(node, "axis", -1) % x.rank
    b = imp.b
    axes = tuple(range(axis, x.rank))
    mean = b.op("reduce_mean", x, axes=axes, keepdims=True)
    centred = b.sub(x, mean)
    var = b.op("reduce_mean", b.op("square", centred), axes=axes, keepdims=True)
    inv = b.op("rsqrt", b.add(var, b.scalar(float(imp.attr(node, "epsilon", 1e-5)), x.dtype)))
    y = b.mul(b.mul(centred, inv), imp.value(node.input[1], x))
    bias = imp.optional(node, 2)
    return [b.add(y, imp.value(bias, x)) if bias is not None else y, mean, inv]


@converts("InstanceNormalization")
def _instance_norm(imp, node):
    x = float_input(imp, node.input[0])
    y = _normalize(imp, x, tuple(range(2, x.rank)), float(imp.attr(node, "epsilon", 1e-5)))
    scale = _channel_shaped(imp, imp.value(node.input[1], x), x.rank)
    bias = _channel_shaped(imp, imp.value(node.input[2], x), x.rank)
    return [imp.b.add(imp.b.mul(y, scale), bias)]


@converts("LRN")
def _lrn(imp, node):
    """x / (bias + alpha/size * sum of x^2 over the size channels around)^beta: the window sum
    as an average pool over the channel axis."""
    x = float_input(imp, node.input[0])
    if x.rank != 4:
        imp.fail("LRN of a [N, C, H, W] input only")
    size = int(imp.attr(node, "size"))
    alpha, beta, bias = (float(imp.attr(node, k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    b = imp.b
    n, c, h, w = x.shape
    sq = b.reshape(b.op("square", x), (n, 1, c, h * w))
    sq = b.op("pad_axis", sq, axis=2, before=(size - 1) // 2, after=size // 2)
    mean = b.op("avg_pool2d", sq, kernel=(size, 1), stride=(1, 1), pad=(0, 0), ceil_mode=False,
                count_include_pad=True)
    denom = b.add(b.scale(b.reshape(mean, (n, c, h, w)), alpha), b.scalar(bias, x.dtype))
    return [b.div(x, b.op("power", denom, exponent=beta))]

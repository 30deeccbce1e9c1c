"""Elementwise primitives (numpy broadcasting) with their gradient rules.

Each op's numpy expression takes an optional ``out=`` so that the same code is the reference
and, through ``ELEMENTWISE_IMPL``, the CPU kernel writing into a preallocated buffer.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ir.graph import DTYPES, FLOAT_DTYPES, TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import binary_broadcast, broadcast_shapes, elementwise_flops, like_input, need_float, same_dtype, unary_same

ELEMENTWISE_IMPL: dict[str, Callable] = {}


def _special():
    """scipy.special, imported on first use: erf and expit are exact where numpy has no equal."""
    import scipy.special
    return scipy.special


def _define(name: str, impl: Callable, infer, grad=None, flops_per: int = 1, pure: bool = True, doc: str = ""):
    ELEMENTWISE_IMPL[name] = impl

    def reference(*arrays, **attrs):
        return impl(*arrays, out=None, **attrs)

    register(OpDef(name, infer, reference, grad, elementwise_flops(flops_per), pure=pure,
                   elementwise=True, batch_rows=pure, doc=doc))


def _zero_grad(b, node, gouts):
    """Piecewise-constant ops (masks, sign): the gradient is zero almost everywhere."""
    return [None] * len(node.inputs)


# -- constants ---------------------------------------------------------------------------
def _scalar_infer(types, attrs):
    if attrs["dtype"] not in DTYPES:
        raise ShapeError(f"unknown dtype {attrs['dtype']}")
    return [TensorType((), attrs["dtype"])]


register(OpDef("scalar", _scalar_infer, lambda value, dtype: np.asarray(value, dtype=dtype),
               flops=lambda i, o, a: 0, doc="a 0-d constant"))


def _constant_infer(types, attrs):
    arr = attrs["value"]
    return [TensorType(tuple(arr.shape), str(arr.dtype))]


register(OpDef("constant", _constant_infer, lambda value: np.array(value),
               flops=lambda i, o, a: 0, doc="an array constant"))


# -- binary arithmetic -------------------------------------------------------------------
def _add_grad(b: Builder, node, gouts):
    g, = gouts
    x, y = node.inputs
    return [b.sum_to(g, x.shape), b.sum_to(g, y.shape)]


def _sub_grad(b: Builder, node, gouts):
    g, = gouts
    x, y = node.inputs
    return [b.sum_to(g, x.shape), b.sum_to(b.op("neg", g), y.shape)]


def _mul_grad(b: Builder, node, gouts):
    g, = gouts
    x, y = node.inputs
    return [b.sum_to(b.mul(g, y), x.shape), b.sum_to(b.mul(g, x), y.shape)]


def _div_grad(b: Builder, node, gouts):
    g, = gouts
    x, y = node.inputs
    gx = b.div(g, y)                                         # d(x/y)/dx = 1/y
    gy = b.op("neg", b.mul(gx, node.outputs[0]))             # d(x/y)/dy = -(x/y)/y
    return [b.sum_to(gx, x.shape), b.sum_to(gy, y.shape)]


def _maximum_grad(b: Builder, node, gouts):
    g, = gouts
    x, y = node.inputs
    gx = b.mul(g, b.op("ge_mask", x, y))                     # ties go to the first input
    return [b.sum_to(gx, x.shape), b.sum_to(b.sub(g, gx), y.shape)]


_define("add", lambda a, b, out: np.add(a, b, out=out), binary_broadcast, _add_grad)
_define("sub", lambda a, b, out: np.subtract(a, b, out=out), binary_broadcast, _sub_grad)
_define("mul", lambda a, b, out: np.multiply(a, b, out=out), binary_broadcast, _mul_grad)
_define("div", lambda a, b, out: np.divide(a, b, out=out), binary_broadcast, _div_grad)
_define("maximum", lambda a, b, out: np.maximum(a, b, out=out), binary_broadcast, _maximum_grad)


def _ge_mask(a, b, out):
    mask = np.greater_equal(a, b)
    if out is None:
        return mask.astype(np.result_type(a, b))
    np.copyto(out, mask)
    return out


_define("ge_mask", _ge_mask, binary_broadcast, _zero_grad, doc="1 where a >= b else 0, in the inputs' dtype")


# -- unary math ----------------------------------------------------------------------------
def _neg_grad(b, node, gouts):
    return [b.op("neg", gouts[0])]


def _exp_grad(b, node, gouts):
    return [b.mul(gouts[0], node.outputs[0])]                # d exp(x) = exp(x)


def _log_grad(b, node, gouts):
    return [b.div(gouts[0], node.inputs[0])]                 # d log(x) = 1/x


def _abs_grad(b, node, gouts):
    return [b.mul(gouts[0], b.op("sign", node.inputs[0]))]   # d|x| = sign(x)


def _sqrt_grad(b, node, gouts):
    half_over_y = b.div(b.scalar(0.5, node.outputs[0].dtype), node.outputs[0])
    return [b.mul(gouts[0], half_over_y)]                    # d sqrt(x) = 1/(2 sqrt(x))


def _rsqrt_grad(b, node, gouts):
    y = node.outputs[0]
    y3 = b.mul(b.mul(y, y), y)
    return [b.mul(gouts[0], b.scale(y3, -0.5))]              # d x^-1/2 = -x^-3/2 / 2


def _square_grad(b, node, gouts):
    return [b.mul(gouts[0], b.scale(node.inputs[0], 2.0))]   # d x^2 = 2x


def _rsqrt(x, out):
    out = np.sqrt(x, out=out)
    return np.divide(1.0, out, out=out)


_define("neg", lambda x, out: np.negative(x, out=out), unary_same, _neg_grad)
_define("exp", lambda x, out: np.exp(x, out=out), unary_same, _exp_grad)
_define("log", lambda x, out: np.log(x, out=out), unary_same, _log_grad)
_define("abs", lambda x, out: np.abs(x, out=out), unary_same, _abs_grad)
_define("sign", lambda x, out: np.sign(x, out=out), unary_same, _zero_grad)
_define("sqrt", lambda x, out: np.sqrt(x, out=out), unary_same, _sqrt_grad)
_define("rsqrt", _rsqrt, unary_same, _rsqrt_grad, flops_per=2)
_define("square", lambda x, out: np.multiply(x, x, out=out), unary_same, _square_grad)


def _power(x, out, exponent):
    return np.power(x, x.dtype.type(exponent), out=out)   # a scalar of x's type: CuPy takes no 0-d numpy array


def _power_grad(b, node, gouts):
    p = node.attrs["exponent"]
    x = node.inputs[0]
    if p == 0:
        return [None]
    slope = x if p == 2 else b.op("power", x, exponent=p - 1.0)      # d x^p = p x^(p-1)
    return [b.mul(gouts[0], b.scale(slope, p))]


_define("power", _power, unary_same, _power_grad, flops_per=8, doc="x ** exponent (a number)")

# -- activations -----------------------------------------------------------------------------
def _relu_grad(b, node, gouts):
    return [b.op("relu_grad", gouts[0], node.outputs[0])]


def _relu_grad_impl(g, y, out):
    return np.multiply(g, y > 0, out=out)


def _leaky_relu(x, out, alpha):
    if out is None:
        return np.where(x > 0, x, x * alpha)
    np.multiply(x, alpha, out=out)
    return np.maximum(x, out, out=out) if alpha <= 1 else np.minimum(x, out, out=out)


def _leaky_relu_grad_rule(b, node, gouts):
    return [b.op("leaky_relu_grad", gouts[0], node.inputs[0], alpha=node.attrs["alpha"])]


def _leaky_relu_grad_impl(g, x, out, alpha):
    factor = np.where(x > 0, 1.0, alpha).astype(g.dtype, copy=False)
    return np.multiply(g, factor, out=out)


def _sigmoid(x, out):
    return _special().expit(x, out=out) if out is not None else _special().expit(x)


def _sigmoid_grad(b, node, gouts):
    y = node.outputs[0]
    one_minus_y = b.sub(b.scalar(1.0, y.dtype), y)
    return [b.mul(b.mul(gouts[0], y), one_minus_y)]          # sigma' = y (1 - y)


def _tanh_grad(b, node, gouts):
    y = node.outputs[0]
    one_minus_y2 = b.sub(b.scalar(1.0, y.dtype), b.mul(y, y))
    return [b.mul(gouts[0], one_minus_y2)]                   # tanh' = 1 - y^2


def _elu(x, out, alpha):
    if out is None:
        out = np.empty_like(x)
    np.minimum(x, 0, out=out)
    np.expm1(out, out=out)
    np.multiply(out, alpha, out=out)
    np.copyto(out, x, where=x > 0)
    return out


def _elu_grad_rule(b, node, gouts):
    return [b.op("elu_grad", gouts[0], node.inputs[0], node.outputs[0], alpha=node.attrs["alpha"])]


def _elu_grad_impl(g, x, y, out, alpha):
    factor = np.where(x > 0, 1.0, y + alpha).astype(g.dtype, copy=False)   # y + alpha = alpha e^x
    return np.multiply(g, factor, out=out)


def _softplus(x, out):
    out = np.logaddexp(0, x, out=out)
    np.copyto(out, x, where=x > 20)                          # PyTorch's threshold: linear above 20
    return out


def _softplus_grad(b, node, gouts):
    return [b.mul(gouts[0], b.op("sigmoid", node.inputs[0]))]


def _gelu(x, out, approximate):
    if out is None:
        out = np.empty_like(x)
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
        np.tanh(inner, out=out)
    else:
        _special().erf(x * (1 / math.sqrt(2)), out=out)
    np.add(out, 1.0, out=out)
    np.multiply(out, x, out=out)
    return np.multiply(out, 0.5, out=out)


def _gelu_grad_rule(b, node, gouts):
    return [b.op("gelu_grad", gouts[0], node.inputs[0], approximate=node.attrs["approximate"])]


def _gelu_grad_impl(g, x, out, approximate):
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (x + 0.044715 * x ** 3))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        cdf = 0.5 * (1 + _special().erf(x * (1 / math.sqrt(2))))
        pdf = np.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
        d = cdf + x * pdf
    return np.multiply(g, d.astype(g.dtype, copy=False), out=out)


_define("relu", lambda x, out: np.maximum(x, 0, out=out), unary_same, _relu_grad)
_define("relu_grad", _relu_grad_impl, like_input(0), doc="g where y > 0 else 0")
_define("leaky_relu", _leaky_relu, unary_same, _leaky_relu_grad_rule, flops_per=2)
_define("leaky_relu_grad", _leaky_relu_grad_impl, like_input(0))
_define("sigmoid", _sigmoid, unary_same, _sigmoid_grad, flops_per=4)
_define("tanh", lambda x, out: np.tanh(x, out=out), unary_same, _tanh_grad, flops_per=4)
_define("elu", _elu, unary_same, _elu_grad_rule, flops_per=4)
_define("elu_grad", _elu_grad_impl, like_input(0))
_define("softplus", _softplus, unary_same, _softplus_grad, flops_per=4)
_define("gelu", _gelu, unary_same, _gelu_grad_rule, flops_per=8)
_define("gelu_grad", _gelu_grad_impl, like_input(0))


# -- losses and masks ------------------------------------------------------------------------
def _sigmoid_ce(x, t, out):
    """max(x, 0) - x t + log(1 + exp(-|x|)): the stable form PyTorch uses."""
    loss = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
    if out is None:
        return loss
    np.copyto(out, loss)
    return out


def _sigmoid_ce_grad(b, node, gouts):
    g, = gouts
    x, t = node.inputs
    gx = b.mul(g, b.sub(b.op("sigmoid", x), t))              # d/dx = sigma(x) - t
    gt = b.mul(g, b.op("neg", x))                            # d/dt = -x
    return [b.sum_to(gx, x.shape), b.sum_to(gt, t.shape)]


_define("sigmoid_cross_entropy", _sigmoid_ce, binary_broadcast, _sigmoid_ce_grad, flops_per=6)


def _cast_infer(types, attrs):
    return [TensorType(types[0].shape, attrs["dtype"])]


def _cast_grad(b, node, gouts):
    if node.inputs[0].dtype not in FLOAT_DTYPES:
        return [None]
    return [b.op("cast", gouts[0], dtype=node.inputs[0].dtype)]


def _cast(x, out, dtype):
    if out is None:
        return x.astype(dtype)
    np.copyto(out, x, casting="unsafe")
    return out


_define("cast", _cast, _cast_infer, _cast_grad)


def _select_infer(types, attrs):
    need_float(types[0], "condition")
    dtype = same_dtype(types[1:])
    return [TensorType(broadcast_shapes(*(t.shape for t in types)), dtype)]


def _select(c, a, b, out):
    """``a`` where ``c > 0``, else ``b``: unlike ``c*a + (1-c)*b``, an inf or nan in the branch
    not taken stays out (the mixed-precision step keeps the old weights this way)."""
    picked = np.where(c > 0, a, b)
    if out is None:
        return picked
    np.copyto(out, picked)
    return out


def _select_grad(b, node, gouts):
    g, = gouts
    c, x, y = node.inputs
    zero = b.scalar(0.0, g.dtype)
    return [None, b.sum_to(b.op("select", c, g, zero), x.shape), b.sum_to(b.op("select", c, zero, g), y.shape)]


_define("select", _select, _select_infer, _select_grad, doc="a where the condition is > 0, else b")


def _dropout_mask_infer(types, attrs):
    unary_same(types, attrs)
    if not 0.0 <= attrs["ratio"] < 1.0:
        raise ShapeError(f"dropout ratio must be in [0, 1), got {attrs['ratio']}")
    return [types[0]]


def _dropout_mask(x, out, ratio, rng):
    """0 with probability ``ratio``, else 1/(1-ratio): inverted dropout's scaled keep mask."""
    keep = rng.random(x.shape, dtype=np.float64 if x.dtype == np.float64 else np.float32) >= ratio
    if out is None:
        out = np.empty_like(x)
    return np.multiply(keep, 1.0 / (1.0 - ratio), out=out)


_define("dropout_mask", _dropout_mask, _dropout_mask_infer, _zero_grad, pure=False,
        doc="random keep mask scaled by 1/(1-ratio); needs the executor's rng")

"""Elementwise primitives (numpy broadcasting): each op's numpy expression (the reference and,
through ``ELEMENTWISE_IMPL``, the CPU kernel writing into ``out=``), gradient rule, whether it may
run in place, and its scalar expression for generated C and CUDA code.
"""
from __future__ import annotations

import math
import string
from typing import Callable

import numpy as np

from ..codegen.loops import Const, call, lift, maximum, select
from ..ir.graph import ALL_DTYPES, FLOAT_DTYPES, TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import binary_broadcast, broadcast_shapes, elementwise_flops, like_input, need_float, same_dtype, unary_same

ELEMENTWISE_IMPL: dict[str, Callable] = {}


def _special():
    """scipy.special, imported on first use: erf and expit are exact where numpy has no equal."""
    import scipy.special
    return scipy.special


def _from_call(template: str) -> Callable:
    """The function a one-call template states: "np.add({0}, {1}, out={out})" is
    ``lambda x0, x1, out: np.add(x0, x1, out=out)``."""
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f and f.isdigit()]
    names = [f"x{i}" for i in range(1 + max(map(int, fields)))]
    return eval(f"lambda {', '.join(names)}, out: {template.format(*names, out='out')}", {"np": np})


def _define(name: str, impl: Callable | str, infer, grad=None, *, in_place: bool, scalar: Callable | None = None,
            flops_per: int = 1, pure: bool = True, doc: str = ""):
    """``impl(*arrays, out, **attrs)`` is the numpy expression, or a one-call template (see
    ``_from_call``) that generated Python also writes out. ``in_place``: whether ``out`` may be an
    input of its shape (claimed only where the expression reads each part of an input before it
    writes over it). ``scalar(*operands, dtype, **attrs)``: the same function of one element as a
    loop-program expression computed in ``dtype``, or None where generated code has none."""
    numpy_call = impl if isinstance(impl, str) else None
    if numpy_call is not None:
        impl = _from_call(numpy_call)
    ELEMENTWISE_IMPL[name] = impl

    def reference(*arrays, **attrs):
        return impl(*arrays, out=None, **attrs)

    register(OpDef(name, infer, reference, grad, elementwise_flops(flops_per), pure=pure,
                   elementwise=True, batch_rows=pure, in_place=in_place, scalar_expr=scalar,
                   numpy_call=numpy_call, doc=doc))


def _c(value: float, dtype: str) -> Const:
    """A constant of the dtype a scalar expression computes in."""
    return Const(float(value), dtype)


def _zero_grad(b, node, gouts):
    """Piecewise-constant ops (masks, sign): the gradient is zero almost everywhere."""
    return [None] * len(node.inputs)


# -- constants ---------------------------------------------------------------------------
def _scalar_infer(types, attrs):
    if attrs["dtype"] not in ALL_DTYPES:
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


_define("add", "np.add({0}, {1}, out={out})", binary_broadcast, _add_grad, in_place=True,
        scalar=lambda x, y, dtype: x + y)
_define("sub", "np.subtract({0}, {1}, out={out})", binary_broadcast, _sub_grad, in_place=True,
        scalar=lambda x, y, dtype: x - y)
_define("mul", "np.multiply({0}, {1}, out={out})", binary_broadcast, _mul_grad, in_place=True,
        scalar=lambda x, y, dtype: x * y)
_define("div", "np.divide({0}, {1}, out={out})", binary_broadcast, _div_grad, in_place=True,
        scalar=lambda x, y, dtype: x / y)
_define("maximum", "np.maximum({0}, {1}, out={out})", binary_broadcast, _maximum_grad, in_place=True,
        scalar=lambda x, y, dtype: maximum(x, y))


def _ge_mask(a, b, out):
    mask = np.greater_equal(a, b)
    if out is None:
        return mask.astype(np.result_type(a, b))
    np.copyto(out, mask)
    return out


_define("ge_mask", _ge_mask, binary_broadcast, _zero_grad, in_place=True,
        scalar=lambda x, y, dtype: select(x.ge(y), _c(1, dtype), _c(0, dtype)),
        doc="1 where a >= b else 0, in the inputs' dtype")


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


def _sign_scalar(x, dtype):
    one, zero = _c(1, dtype), _c(0, dtype)
    return select(x.gt(zero), one, select(x.lt(zero), -one, x * zero))      # x * 0 keeps a nan


_define("neg", "np.negative({0}, out={out})", unary_same, _neg_grad, in_place=True, scalar=lambda x, dtype: -x)
_define("exp", "np.exp({0}, out={out})", unary_same, _exp_grad, in_place=True,
        scalar=lambda x, dtype: call("exp", x))
_define("log", "np.log({0}, out={out})", unary_same, _log_grad, in_place=True,
        scalar=lambda x, dtype: call("log", x))
_define("abs", "np.abs({0}, out={out})", unary_same, _abs_grad, in_place=True,
        scalar=lambda x, dtype: call("abs", x))
_define("sign", "np.sign({0}, out={out})", unary_same, _zero_grad, in_place=True, scalar=_sign_scalar)
_define("sqrt", "np.sqrt({0}, out={out})", unary_same, _sqrt_grad, in_place=True,
        scalar=lambda x, dtype: call("sqrt", x))
_define("rsqrt", _rsqrt, unary_same, _rsqrt_grad, in_place=True, flops_per=2,
        scalar=lambda x, dtype: _c(1, dtype) / call("sqrt", x))
_define("square", "np.multiply({0}, {0}, out={out})", unary_same, _square_grad, in_place=True,
        scalar=lambda x, dtype: x * x)


def _power(x, out, exponent):
    return np.power(x, x.dtype.type(exponent), out=out)   # a scalar of x's type: CuPy takes no 0-d numpy array


def _power_grad(b, node, gouts):
    p = node.attrs["exponent"]
    x = node.inputs[0]
    if p == 0:
        return [None]
    slope = x if p == 2 else b.op("power", x, exponent=p - 1.0)      # d x^p = p x^(p-1)
    return [b.mul(gouts[0], b.scale(slope, p))]


def _power_scalar(x, dtype, exponent):
    """x ** exponent in generated code. LRN's x^(-0.75) (and the square roots) as square roots,
    which the compiler vectorises, where pow is a library call per element: GoogLeNet's conv2/norm2
    spent 4.1 ms there, 0.42 now. Within 3 ulp of pow (x^-0.75 rounds four times; tested on 1000 values);
    pow(-inf, y) is +inf for y > 0 and +0 for y < 0 where the square root gives NaN, so -inf is
    selected apart (for 0.5 numpy itself takes the square root, NaN and -0 included)."""
    if exponent == 2:
        return x * x                                    # one rounding, as pow's
    if exponent == 0.5:
        return call("sqrt", x)                          # numpy's own fast path: sqrt(-inf) is NaN there too
    if exponent in (-0.5, 0.75, -0.75):
        half = call("sqrt", x + _c(0.0, dtype))         # + 0: pow(-0, y) is +0 or +inf, sqrt(-0) is -0
        root = half if abs(exponent) == 0.5 else half * call("sqrt", half)     # no x^1.5 to overflow
        value = root if exponent > 0 else _c(1.0, dtype) / root
        return select(x.eq(_c(float("-inf"), dtype)), _c(float("inf") if exponent > 0 else 0.0, dtype), value)
    return call("pow", x, _c(exponent, dtype))


_define("power", _power, unary_same, _power_grad, in_place=True, flops_per=8,
        scalar=_power_scalar, doc="x ** exponent (a number)")

# -- activations -----------------------------------------------------------------------------
def _relu_grad(b, node, gouts):
    return [b.op("relu_grad", gouts[0], node.outputs[0])]


def _relu_grad_impl(g, y, out):
    return np.multiply(g, y > 0, out=out)


def _relu_grad_scalar(g, y, dtype):
    return g * select(y.gt(_c(0, dtype)), _c(1, dtype), _c(0, dtype))


def _leaky_relu(x, out, alpha):
    if out is None:
        return np.where(x > 0, x, x * alpha)
    np.multiply(x, alpha, out=out)
    return np.maximum(x, out, out=out) if alpha <= 1 else np.minimum(x, out, out=out)


def _leaky_relu_scalar(x, dtype, alpha):
    scaled = x * _c(alpha, dtype)
    return maximum(x, scaled) if alpha <= 1 else call("min", x, scaled)


def _leaky_relu_grad_rule(b, node, gouts):
    return [b.op("leaky_relu_grad", gouts[0], node.inputs[0], alpha=node.attrs["alpha"])]


def _leaky_relu_grad_impl(g, x, out, alpha):
    factor = np.where(x > 0, 1.0, alpha).astype(g.dtype, copy=False)
    return np.multiply(g, factor, out=out)


def _leaky_relu_grad_scalar(g, x, dtype, alpha):
    return g * select(x.gt(_c(0, dtype)), _c(1, dtype), _c(alpha, dtype))


def _sigmoid(x, out):
    return _special().expit(x, out=out) if out is not None else _special().expit(x)


def _sigmoid_scalar(x, dtype):
    one = _c(1, dtype)
    return one / (one + call("exp", -x))


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


def _elu_scalar(x, dtype, alpha):
    zero = _c(0, dtype)
    return select(x.gt(zero), x, call("expm1", call("min", x, zero)) * _c(alpha, dtype))


def _elu_grad_rule(b, node, gouts):
    return [b.op("elu_grad", gouts[0], node.inputs[0], node.outputs[0], alpha=node.attrs["alpha"])]


def _elu_grad_impl(g, x, y, out, alpha):
    factor = np.where(x > 0, 1.0, y + alpha).astype(g.dtype, copy=False)   # y + alpha = alpha e^x
    return np.multiply(g, factor, out=out)


def _elu_grad_scalar(g, x, y, dtype, alpha):
    return g * select(x.gt(_c(0, dtype)), _c(1, dtype), y + _c(alpha, dtype))


def _softplus(x, out):
    out = np.logaddexp(0, x, out=out)
    np.copyto(out, x, where=x > 20)                          # PyTorch's threshold: linear above 20
    return out


def _softplus_scalar(x, dtype):
    soft = maximum(x, _c(0, dtype)) + call("log1p", call("exp", -call("abs", x)))
    return select(x.gt(_c(20, dtype)), x, soft)


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


def _gelu_scalar(x, dtype, approximate):
    if approximate == "tanh":
        inner = _c(math.sqrt(2 / math.pi), dtype) * (x + _c(0.044715, dtype) * x * x * x)
        return (call("tanh", inner) + _c(1, dtype)) * x * _c(0.5, dtype)
    return (call("erf", x * _c(1 / math.sqrt(2), dtype)) + _c(1, dtype)) * x * _c(0.5, dtype)


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


# leaky_relu, elu, softplus and gelu write part of ``out`` and then read ``x`` again: never in place
_define("relu", "np.maximum({0}, 0, out={out})", unary_same, _relu_grad, in_place=True,
        scalar=lambda x, dtype: maximum(x, _c(0, dtype)))
_define("relu_grad", _relu_grad_impl, like_input(0), in_place=True, scalar=_relu_grad_scalar,
        doc="g where y > 0 else 0")
_define("leaky_relu", _leaky_relu, unary_same, _leaky_relu_grad_rule, in_place=False, flops_per=2,
        scalar=_leaky_relu_scalar)
_define("leaky_relu_grad", _leaky_relu_grad_impl, like_input(0), in_place=True, scalar=_leaky_relu_grad_scalar)
_define("sigmoid", _sigmoid, unary_same, _sigmoid_grad, in_place=True, flops_per=4, scalar=_sigmoid_scalar)
_define("tanh", "np.tanh({0}, out={out})", unary_same, _tanh_grad, in_place=True, flops_per=4,
        scalar=lambda x, dtype: call("tanh", x))
def _erf(x, out):
    return _special().erf(x, out=out)


def _erf_grad(b, node, gouts):
    x = node.inputs[0]
    slope = b.scale(b.op("exp", b.op("neg", b.op("square", x))), 2 / math.sqrt(math.pi))
    return [b.mul(gouts[0], slope)]                          # erf' = 2/sqrt(pi) exp(-x^2)


_define("erf", _erf, unary_same, _erf_grad, in_place=True, flops_per=8,
        scalar=lambda x, dtype: call("erf", x), doc="the error function (ONNX's Erf)")
_define("elu", _elu, unary_same, _elu_grad_rule, in_place=False, flops_per=4, scalar=_elu_scalar)
_define("elu_grad", _elu_grad_impl, like_input(0), in_place=True, scalar=_elu_grad_scalar)
_define("softplus", _softplus, unary_same, _softplus_grad, in_place=False, flops_per=4, scalar=_softplus_scalar)
_define("gelu", _gelu, unary_same, _gelu_grad_rule, in_place=False, flops_per=8, scalar=_gelu_scalar)
_define("gelu_grad", _gelu_grad_impl, like_input(0), in_place=True)     # no scalar expression written yet


# -- losses and masks ------------------------------------------------------------------------
def _sigmoid_ce(x, t, out):
    """max(x, 0) - x t + log(1 + exp(-|x|)): the stable form PyTorch uses."""
    loss = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
    if out is None:
        return loss
    np.copyto(out, loss)
    return out


def _sigmoid_ce_scalar(x, t, dtype):
    return maximum(x, _c(0, dtype)) - x * t + call("log1p", call("exp", -call("abs", x)))


def _sigmoid_ce_grad(b, node, gouts):
    g, = gouts
    x, t = node.inputs
    gx = b.mul(g, b.sub(b.op("sigmoid", x), t))              # d/dx = sigma(x) - t
    gt = b.mul(g, b.op("neg", x))                            # d/dt = -x
    return [b.sum_to(gx, x.shape), b.sum_to(gt, t.shape)]


_define("sigmoid_cross_entropy", _sigmoid_ce, binary_broadcast, _sigmoid_ce_grad, in_place=False, flops_per=6,
        scalar=_sigmoid_ce_scalar)


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


# a change of dtype is no step of a program computed in one dtype: no scalar expression
_define("cast", _cast, _cast_infer, _cast_grad, in_place=False)


def _div_count(x, out, count):
    return np.divide(x, count, out=out)


def _div_count_scalar(x, dtype, count):
    # lift: a count of run-time sizes (a native kernel taking sizes at run time, a SizeInt) is
    # worked out when the kernel runs, never baked in from the first batch's size
    return x / lift(count, dtype)


def _div_count_grad(b, node, gouts):
    return [b.op("div_count", gouts[0], count=node.attrs["count"])]


# reduce_mean_grad's g / count as an elementwise op of g's own shape (passes/fuse.py spreads it
# through the group that reads it, so the full-size spread is never written)
_define("div_count", _div_count, unary_same, _div_count_grad, in_place=True, scalar=_div_count_scalar,
        doc="x / count, count a number of elements (symbolic until the plan binds sizes)")


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


_define("select", _select, _select_infer, _select_grad, in_place=True,
        scalar=lambda c, x, y, dtype: select(c.gt(_c(0, dtype)), x, y), doc="a where the condition is > 0, else b")


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


# draws from the executor's generator, which generated code does not reach: no scalar expression
_define("dropout_mask", _dropout_mask, _dropout_mask_infer, _zero_grad, in_place=False, pure=False,
        doc="random keep mask scaled by 1/(1-ratio); needs the executor's rng")

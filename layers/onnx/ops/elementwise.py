"""ONNX's elementwise ops: activations, arithmetic (Add...Mean), Where, comparisons and casts."""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import FLOAT_DTYPES, Value
from toolkit.onnxtypes import ONNX_ELEMENT_TYPES

from ..convert import is_const
from .base import converts, float_input, operand_pair

UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
         "Abs": "abs", "Neg": "neg", "Sign": "sign", "Erf": "erf", "Softplus": "softplus"}


@converts(*UNARY)
def _unary(imp, node):
    return [imp.b.op(UNARY[node.op_type], float_input(imp, node.input[0]))]


@converts("Identity", "Dropout")
def _identity(imp, node):
    x = imp.env[node.input[0]]
    if node.op_type != "Dropout":
        return [x]
    if len(node.input) > 2 and node.input[2]:
        mode = imp.const(node.input[2], "training_mode")
        ratio = imp.const(node.input[1], "the ratio") if bool(mode) and node.input[1] else np.array(0.5)
        if bool(mode) and float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
            imp.fail("training_mode true with a ratio above 0: dropout's random mask has no counterpart here")
    if len(node.output) < 2 or not node.output[1]:
        return [x]
    # nothing dropped: the mask is true everywhere
    like = x if isinstance(x, Value) else imp.materialize(x)
    ones = imp.materialize(np.ones([1] * like.rank, dtype=np.float32))
    mask = imp.b.op("broadcast_to", ones, shape=tuple(like.shape)) if like.rank else ones
    return [x, imp.b.op("cast", mask, dtype="bool")]


@converts("Reciprocal")
def _reciprocal(imp, node):
    x = float_input(imp, node.input[0])
    return [imp.b.div(imp.b.scalar(1.0, x.dtype), x)]


@converts("LeakyRelu", "Elu")
def _alpha(imp, node):
    alpha = imp.attr(node, "alpha", 0.01 if node.op_type == "LeakyRelu" else 1.0)
    return [imp.b.op({"LeakyRelu": "leaky_relu", "Elu": "elu"}[node.op_type], float_input(imp, node.input[0]),
                     alpha=float(alpha))]


@converts("Gelu")
def _gelu(imp, node):
    approximate = imp.attr(node, "approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return [imp.b.op("gelu", float_input(imp, node.input[0]), approximate=approximate)]


def _minimum(b, x: Value, y: Value) -> Value:
    return b.op("neg", b.op("maximum", b.op("neg", x), b.op("neg", y)))


@converts("Clip")
def _clip(imp, node):
    x = float_input(imp, node.input[0])
    lo, hi = imp.optional(node, 1), imp.optional(node, 2)
    if lo is not None:
        x = imp.b.op("maximum", x, imp.value(lo, x))
    if hi is not None:
        x = _minimum(imp.b, x, imp.value(hi, x))
    return [x]


@converts("HardSigmoid", "HardSwish")
def _hard_sigmoid(imp, node):
    x = float_input(imp, node.input[0])
    alpha, beta = (1 / 6, 0.5) if node.op_type == "HardSwish" else \
        (imp.attr(node, "alpha", 0.2), imp.attr(node, "beta", 0.5))
    b = imp.b
    y = b.add(b.scale(x, float(alpha)), b.scalar(float(beta), x.dtype))
    y = _minimum(b, b.op("maximum", y, b.scalar(0.0, x.dtype)), b.scalar(1.0, x.dtype))
    return [b.mul(x, y) if node.op_type == "HardSwish" else y]


@converts("Softsign")
def _softsign(imp, node):
    x = float_input(imp, node.input[0])
    return [imp.b.div(x, imp.b.add(imp.b.op("abs", x), imp.b.scalar(1.0, x.dtype)))]


@converts("Selu")
def _selu(imp, node):
    x = float_input(imp, node.input[0])
    alpha = float(imp.attr(node, "alpha", 1.67326319217681884765625))
    gamma = float(imp.attr(node, "gamma", 1.05070102214813232421875))
    return [imp.b.scale(imp.b.op("elu", x, alpha=alpha), gamma)]


@converts("PRelu")
def _prelu(imp, node):
    x = float_input(imp, node.input[0])
    slope = imp.value(node.input[1], x)
    b = imp.b
    if slope.rank == 1 and x.rank > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        slope = b.reshape(slope, (slope.shape[0],) + (1,) * (x.rank - 2))   # one per channel (old opsets)
    return [b.sub(b.op("relu", x), b.mul(slope, b.op("relu", b.op("neg", x))))]


BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@converts(*BINARY)
def _binary(imp, node):
    first = imp.env[node.input[0]]
    a = first if isinstance(first, Value) else None
    if a is None:
        other = imp.value(node.input[1])
        a = imp.materialize(first, other)
        b = other
    else:
        a, b = operand_pair(imp, node, a, node.input[1])
    if a.dtype not in FLOAT_DTYPES and a.dtype not in ("int32", "int64"):
        imp.fail(f"{node.op_type} of {a.dtype} values has no counterpart here")
    if node.op_type == "Div" and a.dtype in ("int32", "int64"):
        # integer division truncates toward zero: divided as float64 (exact quotient's sign and
        # integer part for every int32, and int64 below 2^53) and cast back, which truncates
        wide = [imp.b.op("cast", v, dtype="float64") for v in (a, b)]
        return [imp.b.op("cast", imp.b.op("div", *wide), dtype=a.dtype)]
    return [imp.b.op(BINARY[node.op_type], a, b)]


@converts("Max", "Min", "Sum", "Mean")
def _variadic(imp, node):
    values = [imp.value(n) if isinstance(imp.env[n], Value) else None for n in node.input]
    like = next(v for v in values if v is not None)
    values = [v if v is not None else imp.materialize(imp.env[n], like) for v, n in zip(values, node.input)]
    b = imp.b
    integer = like.dtype if like.dtype in ("int32", "int64") and node.op_type in ("Max", "Min") else None
    if integer:                 # compared as float64: exact for every int32, and int64 below 2^53
        values = [b.op("cast", v, dtype="float64") for v in values]
    out = values[0]
    for v in values[1:]:
        out = {"Max": lambda p, q: b.op("maximum", p, q), "Min": lambda p, q: _minimum(b, p, q),
               "Sum": b.add, "Mean": b.add}[node.op_type](out, v)
    if integer:
        return [b.op("cast", out, dtype=integer)]
    return [b.scale(out, 1 / len(values)) if node.op_type == "Mean" else out]


def _as_mask(imp, x: Value) -> Value:
    return x if x.dtype in FLOAT_DTYPES else imp.b.op("cast", x, dtype="float32")


@converts("Where")
def _where(imp, node):
    cond = imp.env[node.input[0]]
    a, b = imp.env[node.input[1]], imp.env[node.input[2]]
    like = a if isinstance(a, Value) else b if isinstance(b, Value) else None
    a_v, b_v = imp.value(node.input[1], like), imp.value(node.input[2], like)
    c = imp.materialize(np.asarray(cond, dtype=a_v.dtype if a_v.dtype in FLOAT_DTYPES else np.float32)) \
        if is_const(cond) else imp.b.op("cast", cond, dtype=a_v.dtype if a_v.dtype in FLOAT_DTYPES else "float32")
    return [imp.b.op("select", c, a_v, b_v)]


@converts("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal")
def _compare(imp, node):
    a0, b0 = imp.env[node.input[0]], imp.env[node.input[1]]
    like = a0 if isinstance(a0, Value) else b0
    a, b = imp.value(node.input[0], like), imp.value(node.input[1], like)
    if a.dtype in ("int32", "int64"):            # compared as float64: exact for every int32, and int64 below 2^53
        a, b = (imp.b.op("cast", v, dtype="float64") for v in (a, b))
    if a.dtype not in FLOAT_DTYPES:
        imp.fail(f"comparisons of {a.dtype} values have no counterpart here")
    ge = lambda p, q: imp.b.op("ge_mask", p, q)   # noqa: E731
    one = imp.b.scalar(1.0, a.dtype)
    mask = {"GreaterOrEqual": lambda: ge(a, b), "LessOrEqual": lambda: ge(b, a),
            "Greater": lambda: imp.b.sub(one, ge(b, a)), "Less": lambda: imp.b.sub(one, ge(a, b)),
            "Equal": lambda: imp.b.mul(ge(a, b), ge(b, a))}[node.op_type]()
    return [imp.b.op("cast", mask, dtype="bool")]


@converts("Cast")
def _cast(imp, node):
    to = ONNX_ELEMENT_TYPES.get(imp.attr(node, "to"))
    if to is None:
        from ..convert import type_name
        imp.fail(f"the element type {type_name(imp.attr(node, 'to'))} has no counterpart here")
    x = imp.value(node.input[0])
    return [x if x.dtype == to else imp.b.op("cast", x, dtype=to)]


@converts("CastLike")
def _cast_like(imp, node):
    target = imp.env[node.input[1]]
    to = target.dtype if isinstance(target, Value) else str(np.asarray(target).dtype)
    x = imp.value(node.input[0])
    return [x if x.dtype == to else imp.b.op("cast", x, dtype=to)]

"""ONNX ops the graph has no primitive of, written in the primitives it has: the boolean ops
(And, Or, Xor, Not) on 0/1 masks, ReduceProd as products of slices, and Pow with an exponent
computed at run time or of an integer type."""
from __future__ import annotations

import numpy as np

from toolkit.ir.graph import FLOAT_DTYPES, Value

from .convert import Importer, is_const
from .ops import axes_input, converts

# ReduceProd multiplies one slice per element of a reduced axis: past this many the graph would
# grow with the data, so a longer axis is refused in one line
MAX_PRODUCT_TERMS = 256


def _mask(imp: Importer, name: str) -> Value:
    """A boolean input as a float32 0/1 mask."""
    x = imp.value(name)
    if x.dtype != "bool":
        imp.fail(f"input '{name}' is {x.dtype}; this op takes bool values")
    return imp.b.op("cast", x, dtype="float32")


@converts("And", "Or", "Xor")
def _logical(imp, node):
    a, c = _mask(imp, node.input[0]), _mask(imp, node.input[1])
    b = imp.b
    out = {"And": lambda: b.mul(a, c), "Or": lambda: b.op("maximum", a, c),
           "Xor": lambda: b.op("square", b.sub(a, c))}[node.op_type]()
    return [b.op("cast", out, dtype="bool")]


@converts("Not")
def _not(imp, node):
    a = _mask(imp, node.input[0])
    return [imp.b.op("cast", imp.b.sub(imp.b.scalar(1.0, "float32"), a), dtype="bool")]


@converts("ReduceProd")
def _reduce_prod(imp, node):
    x = imp.value(node.input[0])
    if x.dtype == "bool":
        imp.fail("ReduceProd of bool values has no counterpart here")
    axes = axes_input(imp, node, 1, x.rank) if imp.opset >= 18 else \
        ([int(a) % x.rank for a in imp.attr(node, "axes")] if imp.attr(node, "axes") is not None else None)
    keep = bool(imp.attr(node, "keepdims", 1))
    if not axes:
        if imp.attr(node, "noop_with_empty_axes", 0):
            return [x]
        axes = list(range(x.rank))
    axes = sorted(set(axes))
    b = imp.b
    y = x
    for axis in axes:
        size = y.shape[axis]
        if not isinstance(size, int):
            imp.fail(f"ReduceProd over the symbolic axis {axis} has no counterpart here")
        if size > MAX_PRODUCT_TERMS:
            imp.fail(f"ReduceProd over an axis of {size} elements (more than {MAX_PRODUCT_TERMS}) has no "
                     "counterpart here")
        product = b.op("slice", y, axis=axis, start=0, stop=1)
        for i in range(1, size):
            product = b.mul(product, b.op("slice", y, axis=axis, start=i, stop=i + 1))
        y = product
    if not keep:
        y = b.reshape(y, tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return [y]


@converts("Pow")
def _pow(imp, node):
    """x ** y. An exponent known at import of a float x is the graph's power op; otherwise
    |x| ** y = exp(y log |x|) in float64, negated where x < 0 and y is odd, NaN where x < 0 and y
    has a fraction, 1 where y = 0, and
    rounded to the nearest integer for an integer x (ONNX's result has x's type)."""
    first, second = imp.env[node.input[0]], imp.env[node.input[1]]
    b = imp.b
    if is_const(second) and np.size(second) == 1 and isinstance(first, Value) and first.dtype in FLOAT_DTYPES:
        exponent = float(np.asarray(second).reshape(-1)[0])
        if exponent == 2.0:
            return [b.op("square", first)]
        if exponent == 0.5:
            return [b.op("sqrt", first)]
        return [b.op("power", first, exponent=exponent)]
    x = imp.value(node.input[0]) if isinstance(first, Value) else imp.materialize(np.asarray(first))
    y = imp.value(node.input[1]) if isinstance(second, Value) else imp.materialize(np.asarray(second))
    for v, name in ((x, node.input[0]), (y, node.input[1])):
        if v.dtype not in FLOAT_DTYPES + ("int32", "int64"):
            imp.fail(f"Pow of {v.dtype} values ('{name}') has no counterpart here")
    xf = x if x.dtype == "float64" else b.op("cast", x, dtype="float64")
    yf = y if y.dtype == "float64" else b.op("cast", y, dtype="float64")
    one, zero = b.scalar(1.0, "float64"), b.scalar(0.0, "float64")
    magnitude = b.op("exp", b.mul(yf, b.op("log", b.op("abs", xf))))
    magnitude = b.op("select", b.op("abs", yf), magnitude, one)              # x ** 0 is 1, 0 ** 0 too
    # y's parity: y - 2 trunc(y / 2), through int64, whose cast truncates
    half = b.op("cast", b.op("cast", b.scale(yf, 0.5), dtype="int64"), dtype="float64")
    odd = b.op("abs", b.sub(yf, b.scale(half, 2.0)))
    negative = b.sub(one, b.op("ge_mask", xf, zero))
    result = b.mul(magnitude, b.sub(one, b.scale(b.mul(negative, odd), 2.0)))
    # a negative x to a fractional y is not a real number: NaN, as numpy and ONNX Runtime give
    fraction = b.op("abs", b.sub(yf, b.op("cast", b.op("cast", yf, dtype="int64"), dtype="float64")))
    result = b.op("select", b.mul(negative, fraction), b.scalar(float("nan"), "float64"), result)
    if x.dtype in FLOAT_DTYPES:
        return [result if x.dtype == "float64" else b.op("cast", result, dtype=x.dtype)]
    rounded = b.add(result, b.scale(b.op("sign", result), 0.5))
    return [b.op("cast", rounded, dtype=x.dtype)]

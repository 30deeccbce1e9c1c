"""ONNX ops (opset 13 and up) as the toolkit's primitives: one converter per op type, each
``(importer, node) -> [outputs]``. What a converter cannot express raises ``NodeError``."""
from __future__ import annotations

import math

import numpy as np

from toolkit.ir.graph import FLOAT_DTYPES, Value
from .convert import CONVERTERS, DTYPES, NUMPY, Importer, NodeError, dims_of, is_const
from .windows import pad_explicit, pool_size, spatial_pads


def converts(*ops: str):
    def register(fn):
        for op in ops:
            CONVERTERS[op] = fn
        return fn
    return register


def _float(imp: Importer, name: str) -> Value:
    x = imp.value(name)
    if x.dtype not in FLOAT_DTYPES:
        imp.fail(f"input '{name}' is {x.dtype}; this op is computed for floats here")
    return x


def _pair(imp: Importer, node, a: Value, b_name: str) -> tuple[Value, Value]:
    """Both operands of a binary op as Values, a constant in the other's dtype."""
    b = imp.env[b_name]
    if is_const(b):
        return a, imp.materialize(b, a)
    if is_const(imp.env[node.input[0]]):
        return imp.materialize(imp.env[node.input[0]], b), b
    return a, b


# -- elementwise ------------------------------------------------------------------------------
UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
         "Abs": "abs", "Neg": "neg", "Sign": "sign", "Erf": "erf", "Softplus": "softplus"}


@converts(*UNARY)
def _unary(imp, node):
    return [imp.b.op(UNARY[node.op_type], _float(imp, node.input[0]))]


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
    x = _float(imp, node.input[0])
    return [imp.b.div(imp.b.scalar(1.0, x.dtype), x)]


@converts("LeakyRelu", "Elu")
def _alpha(imp, node):
    alpha = imp.attr(node, "alpha", 0.01 if node.op_type == "LeakyRelu" else 1.0)
    return [imp.b.op({"LeakyRelu": "leaky_relu", "Elu": "elu"}[node.op_type], _float(imp, node.input[0]),
                     alpha=float(alpha))]


@converts("Gelu")
def _gelu(imp, node):
    approximate = imp.attr(node, "approximate", "none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
    return [imp.b.op("gelu", _float(imp, node.input[0]), approximate=approximate)]


def _minimum(b, x: Value, y: Value) -> Value:
    return b.op("neg", b.op("maximum", b.op("neg", x), b.op("neg", y)))


@converts("Clip")
def _clip(imp, node):
    x = _float(imp, node.input[0])
    lo, hi = imp.optional(node, 1), imp.optional(node, 2)
    if lo is not None:
        x = imp.b.op("maximum", x, imp.value(lo, x))
    if hi is not None:
        x = _minimum(imp.b, x, imp.value(hi, x))
    return [x]


@converts("HardSigmoid", "HardSwish")
def _hard_sigmoid(imp, node):
    x = _float(imp, node.input[0])
    alpha, beta = (1 / 6, 0.5) if node.op_type == "HardSwish" else \
        (imp.attr(node, "alpha", 0.2), imp.attr(node, "beta", 0.5))
    b = imp.b
    y = b.add(b.scale(x, float(alpha)), b.scalar(float(beta), x.dtype))
    y = _minimum(b, b.op("maximum", y, b.scalar(0.0, x.dtype)), b.scalar(1.0, x.dtype))
    return [b.mul(x, y) if node.op_type == "HardSwish" else y]


@converts("Softsign")
def _softsign(imp, node):
    x = _float(imp, node.input[0])
    return [imp.b.div(x, imp.b.add(imp.b.op("abs", x), imp.b.scalar(1.0, x.dtype)))]


@converts("Selu")
def _selu(imp, node):
    x = _float(imp, node.input[0])
    alpha = float(imp.attr(node, "alpha", 1.67326319217681884765625))
    gamma = float(imp.attr(node, "gamma", 1.05070102214813232421875))
    return [imp.b.scale(imp.b.op("elu", x, alpha=alpha), gamma)]


@converts("PRelu")
def _prelu(imp, node):
    x = _float(imp, node.input[0])
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
        a, b = _pair(imp, node, a, node.input[1])
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
    to = DTYPES.get(imp.attr(node, "to"))
    if to is None:
        from .convert import type_name
        imp.fail(f"the element type {type_name(imp.attr(node, 'to'))} has no counterpart here")
    x = imp.value(node.input[0])
    return [x if x.dtype == to else imp.b.op("cast", x, dtype=to)]


@converts("CastLike")
def _cast_like(imp, node):
    target = imp.env[node.input[1]]
    to = target.dtype if isinstance(target, Value) else str(np.asarray(target).dtype)
    x = imp.value(node.input[0])
    return [x if x.dtype == to else imp.b.op("cast", x, dtype=to)]


# -- softmax, matrix products -----------------------------------------------------------------
@converts("Softmax", "LogSoftmax")
def _softmax(imp, node):
    x = _float(imp, node.input[0])
    axis = imp.attr(node, "axis", -1) % x.rank
    return [imp.b.op({"Softmax": "softmax", "LogSoftmax": "log_softmax"}[node.op_type], x, axis=axis)]


@converts("MatMul")
def _matmul(imp, node):
    a0, b0 = imp.env[node.input[0]], imp.env[node.input[1]]
    like = a0 if isinstance(a0, Value) else b0
    a, b = imp.value(node.input[0], like), imp.value(node.input[1], like)
    bb = imp.b
    squeeze = []
    if a.rank == 1:
        a = bb.reshape(a, (1,) + tuple(a.shape))
        squeeze.append(-2)
    if b.rank == 1:
        b = bb.reshape(b, tuple(b.shape) + (1,))
        squeeze.append(-1)
    y = bb.op("matmul", a, b, trans_a=False, trans_b=False)
    if squeeze:                     # numpy's rule: a 1-d operand's added axis is dropped again
        keep = [d for i, d in enumerate(y.shape) if i - y.rank not in squeeze]
        y = bb.reshape(y, tuple(keep))
    return [y]


@converts("Gemm")
def _gemm(imp, node):
    a0 = imp.env[node.input[0]]
    a = imp.value(node.input[0]) if isinstance(a0, Value) else None
    w = imp.value(node.input[1], a)
    a = a if a is not None else imp.value(node.input[0], w)
    b = imp.b
    y = b.op("matmul", a, w, trans_a=bool(imp.attr(node, "transA", 0)), trans_b=bool(imp.attr(node, "transB", 0)))
    y = b.scale(y, float(imp.attr(node, "alpha", 1.0)))
    c = imp.optional(node, 2)
    if c is not None:
        beta = float(imp.attr(node, "beta", 1.0))
        if beta:
            y = b.add(y, b.scale(imp.value(c, y), beta))
    return [y]


# -- convolution and pooling ------------------------------------------------------------------
def _image_input(imp, node, name: str) -> tuple[Value, bool]:
    """The input as [N, C, H, W]: a 1-d signal [N, C, L] gets H = 1 (returned True)."""
    x = _float(imp, name)
    if x.rank == 3:
        return imp.b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2])), True
    if x.rank != 4:
        imp.fail(f"only 1-d and 2-d images ([N, C, L] or [N, C, H, W]) are read here, got rank {x.rank}")
    return x, False


def _two(values, one_d: bool, fill: int) -> list[int]:
    values = [int(v) for v in values]
    if len(values) != 2 - one_d:
        raise NodeError(f"{len(values)} values {values[:8]} where the image's {2 - one_d} axes take one each")
    return [fill] + values if one_d else values


@converts("Conv")
def _conv(imp, node):
    if _float(imp, node.input[0]).rank == 5:
        from .windows import conv3d
        return [conv3d(imp, node, imp.value(node.input[0]))]
    x, one_d = _image_input(imp, node, node.input[0])
    w = imp.value(node.input[1], x)
    if one_d:
        w = imp.b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    kernel = [int(k) for k in w.shape[2:]]
    strides = _two(imp.attr(node, "strides", [1] * (2 - one_d)), one_d, 1)
    dilations = _two(imp.attr(node, "dilations", [1] * (2 - one_d)), one_d, 1)
    if one_d and imp.attr(node, "pads") is not None:
        p = list(imp.attr(node, "pads"))
        node_pads = [0, p[0], 0, p[1]]
    else:
        node_pads = None
    begin, end = ([node_pads[0], node_pads[1]], [node_pads[2], node_pads[3]]) if node_pads else \
        spatial_pads(imp, node, x, kernel, strides, dilations)
    symmetric = [lo if lo == hi else 0 for lo, hi in zip(begin, end)]
    x = pad_explicit(imp, x, [lo - s for lo, s in zip(begin, symmetric)], [hi - s for hi, s in zip(end, symmetric)])
    inputs = [x, w]
    bias = imp.optional(node, 2)
    if bias is not None:
        inputs.append(imp.value(bias, x))
    y = imp.b.op("conv2d", *inputs, stride=tuple(strides), pad=tuple(symmetric), dilation=tuple(dilations),
                 group=int(imp.attr(node, "group", 1)))
    return [imp.b.reshape(y, (y.shape[0], y.shape[1], y.shape[3])) if one_d else y]


@converts("ConvTranspose")
def _conv_transpose(imp, node):
    x, one_d = _image_input(imp, node, node.input[0])
    w = imp.value(node.input[1], x)
    if one_d:                       # a 1-d signal as an image one row high, its attributes so too
        w = imp.b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
    kernel = [int(k) for k in w.shape[2:]]
    strides = _two(imp.attr(node, "strides", [1] * (2 - one_d)), one_d, 1)
    dilations = _two(imp.attr(node, "dilations", [1] * (2 - one_d)), one_d, 1)
    extra = _two(imp.attr(node, "output_padding", [0] * (2 - one_d)), one_d, 0)
    group = int(imp.attr(node, "group", 1))
    sizes = [d for d in x.shape[2:]]
    if not all(isinstance(d, int) for d in sizes):
        imp.fail("a transposed convolution over a symbolic image size")
    natural = [(n - 1) * s + (k - 1) * d + 1 + e for n, s, k, d, e in zip(sizes, strides, kernel, dilations, extra)]
    wanted = imp.attr(node, "output_shape")
    auto = imp.attr(node, "auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = _two(list(wanted)[-(2 - one_d):], one_d, 1) if wanted is not None else \
            [n * s for n, s in zip(sizes, strides)]
        total = [nat - t for nat, t in zip(natural, target)]
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            begin = [t - t // 2 if auto == "SAME_LOWER" else t // 2 for t in total]
        else:                       # output_shape alone: the convolution's output from the start, cut or
            begin = [0] * len(total)    # zero-filled at the end (ONNX's reference)
        end = [t - b for t, b in zip(total, begin)]
    else:
        pads = [int(p) for p in imp.attr(node, "pads", [0] * 2 * (2 - one_d))]
        begin, end = _two(pads[:len(pads) // 2], one_d, 0), _two(pads[len(pads) // 2:], one_d, 0)
    # the toolkit's transposed convolution crops pad on both sides: crop the difference after; a
    # negative padding (an output_shape larger than the convolution gives) is zeros added after
    pad = [max(0, min(b, e)) for b, e in zip(begin, end)]
    out_hw = tuple(nat - 2 * p for nat, p in zip(natural, pad))
    y = imp.b.op("conv2d_grad_input", x, w, stride=tuple(strides), pad=tuple(pad), dilation=tuple(dilations),
                 group=group, input_hw=out_hw)
    for axis, (b_, e_, p) in enumerate(zip(begin, end, pad), start=2):
        crop_lo, crop_hi = max(0, b_ - p), max(0, e_ - p)
        if crop_lo or crop_hi:
            y = imp.b.op("slice", y, axis=axis, start=crop_lo, stop=y.shape[axis] - crop_hi)
        if b_ < 0 or e_ < 0:
            y = imp.b.op("pad_axis", y, axis=axis, before=max(0, -b_), after=max(0, -e_))
    bias = imp.optional(node, 2)
    if bias is not None:
        bv = imp.value(bias, y)
        y = imp.b.add(y, imp.b.reshape(bv, (bv.shape[0], 1, 1)))
    return [imp.b.reshape(y, (y.shape[0], y.shape[1], y.shape[3])) if one_d else y]


class _Unequal(Exception):
    """Padding the pooling primitives cannot express: the windows are written out instead."""


@converts("MaxPool", "AveragePool")
def _pool(imp, node):
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        imp.fail("the indices output of MaxPool has no counterpart here")
    x = _float(imp, node.input[0])
    spatial = x.rank - 2
    if spatial < 1:
        imp.fail(f"{node.op_type} of a rank-{x.rank} input has no counterpart here")
    dilations = [int(d) for d in imp.attr(node, "dilations", [1] * spatial)]
    if x.rank in (3, 4) and all(d == 1 for d in dilations):
        try:
            return _pool_primitive(imp, node)
        except _Unequal:
            pass
    from .windows import window_pool
    kernel = [int(k) for k in imp.attr(node, "kernel_shape")]
    strides = [int(s) for s in imp.attr(node, "strides", [1] * spatial)]
    begin, end = spatial_pads(imp, node, x, kernel, strides, dilations)
    include = bool(imp.attr(node, "count_include_pad", 0)) and node.op_type == "AveragePool"
    return [window_pool(imp, node, x, kernel, strides, dilations, begin, end, bool(imp.attr(node, "ceil_mode", 0)),
                        include)]


def _pool_primitive(imp, node):
    """Pooling of 1-d and 2-d images without dilation onto max_pool2d/avg_pool2d; padding they
    cannot express raises _Unequal."""
    x, one_d = _image_input(imp, node, node.input[0])
    kernel = _two(imp.attr(node, "kernel_shape"), one_d, 1)
    strides = _two(imp.attr(node, "strides", [1] * (2 - one_d)), one_d, 1)
    dilations = [1, 1]
    if one_d and imp.attr(node, "pads") is not None:
        p = list(imp.attr(node, "pads"))
        begin, end = [0, p[0]], [0, p[1]]
    else:
        begin, end = spatial_pads(imp, node, x, kernel, strides, dilations)
    if any(max(lo, hi) > k // 2 for lo, hi, k in zip(begin, end, kernel)):
        raise _Unequal                 # the primitives pad at most half a kernel
    ceil = bool(imp.attr(node, "ceil_mode", 0))
    include = bool(imp.attr(node, "count_include_pad", 0)) and node.op_type == "AveragePool"
    wanted = None
    if begin != end:
        if include and not ceil:
            x = pad_explicit(imp, x, begin, end)          # the padding's zeros counted: make them real
            begin = end = [0, 0]
        elif include:
            raise _Unequal
        else:
            # padding that no window counts: windows start at i*stride - begin either way, so pool
            # with the begin padding on both sides (ceil_mode where the end needs more windows)
            # and keep the windows the unequal padding gives
            wanted = [pool_size(n, k, s, lo, hi, ceil) for n, k, s, lo, hi in
                      zip(x.shape[2:], kernel, strides, begin, end)]
            if any(not isinstance(n, int) or w is None for n, w in zip(x.shape[2:], wanted)):
                imp.fail("unequal padding over a symbolic image size")
            if all(n + lo >= k for n, lo, k in zip(x.shape[2:], begin, kernel)):
                ceil = any(pool_size(n, k, s, lo, lo, False) < w for n, k, s, lo, w in
                           zip(x.shape[2:], kernel, strides, begin, wanted))
                skip = [0, 0]
            else:
                # a kernel larger than the input and its begin padding: pad both sides by the
                # larger amount and skip the windows that start earlier (whole strides only)
                bigger = [max(lo, hi) for lo, hi in zip(begin, end)]
                if any((p - lo) % s for p, lo, s in zip(bigger, begin, strides)):
                    raise _Unequal
                skip = [(p - lo) // s for p, lo, s in zip(bigger, begin, strides)]
                begin, ceil = bigger, False
    attrs = dict(kernel=tuple(kernel), stride=tuple(strides), pad=tuple(begin), ceil_mode=ceil)
    if node.op_type == "MaxPool":
        y = imp.b.op("max_pool2d", x, **attrs)
    else:
        y = imp.b.op("avg_pool2d", x, count_include_pad=include, **attrs)
    for axis, w in enumerate(wanted or [], start=2):
        first = skip[axis - 2]
        if y.shape[axis] < first + w:
            raise _Unequal
        if y.shape[axis] != w:
            y = imp.b.op("slice", y, axis=axis, start=first, stop=first + w)
    return [imp.b.reshape(y, (y.shape[0], y.shape[1], y.shape[3])) if one_d else y]





@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp, node):
    x = _float(imp, node.input[0])
    axes = tuple(range(2, x.rank))
    if node.op_type == "GlobalAveragePool":
        return [imp.b.op("reduce_mean", x, axes=axes, keepdims=True)]
    return [_reduce_max(imp, x, axes, True)]


def _reduce_max(imp, x: Value, axes, keepdims: bool) -> Value:
    """The largest along ``axes``: one top-1 per axis."""
    y = x
    for axis in axes:
        y = imp.b.op("topk", y, axis=axis, k=1, values=True)
    if not keepdims:
        y = imp.b.reshape(y, tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return y


# -- normalisation ----------------------------------------------------------------------------
def _channel_shaped(imp, v: Value, rank: int) -> Value:
    return imp.b.reshape(v, (v.shape[0],) + (1,) * (rank - 2))


@converts("BatchNormalization")
def _batch_norm(imp, node):
    if imp.attr(node, "training_mode", 0):
        return _batch_norm_training(imp, node)
    x = _float(imp, node.input[0])
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
    x = _float(imp, node.input[0])
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
    x = _float(imp, node.input[0])
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
    x = _float(imp, node.input[0])
    y = _normalize(imp, x, tuple(range(2, x.rank)), float(imp.attr(node, "epsilon", 1e-5)))
    scale = _channel_shaped(imp, imp.value(node.input[1], x), x.rank)
    bias = _channel_shaped(imp, imp.value(node.input[2], x), x.rank)
    return [imp.b.add(imp.b.mul(y, scale), bias)]


@converts("LRN")
def _lrn(imp, node):
    """x / (bias + alpha/size * sum of x^2 over the size channels around)^beta: the window sum
    as an average pool over the channel axis."""
    x = _float(imp, node.input[0])
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


# -- shapes -----------------------------------------------------------------------------------
def _reshape_dims(imp, x: Value, target, allowzero: bool) -> tuple:
    dims = list(dims_of(target))
    for i, d in enumerate(dims):
        if isinstance(d, int) and d == 0 and not allowzero:
            if i >= x.rank:             # a 0 copies the input's size on that axis: it has none
                imp.fail(f"a 0 on axis {i} of the shape {list(dims_of(target))}, past the rank-{x.rank} "
                         "input's axes")
            dims[i] = x.shape[i]
    if sum(1 for d in dims if isinstance(d, int) and d == -1) > 1:
        imp.fail("more than one -1 in the shape")
    if -1 in [d for d in dims if isinstance(d, int)]:
        known = 1
        for d in dims:
            if not (isinstance(d, int) and d == -1):
                known = known * d
        total = 1
        for d in x.shape:
            total = total * d
        dims[[i for i, d in enumerate(dims) if isinstance(d, int) and d == -1][0]] = total // known
    return tuple(dims)


@converts("Reshape")
def _reshape(imp, node):
    x = imp.value(node.input[0])
    target = imp.const(node.input[1], "the shape")
    return [imp.b.reshape(x, _reshape_dims(imp, x, target, bool(imp.attr(node, "allowzero", 0))))]


@converts("Flatten")
def _flatten(imp, node):
    x = imp.value(node.input[0])
    axis = imp.attr(node, "axis", 1) % (x.rank + 1) if imp.attr(node, "axis", 1) >= 0 \
        else imp.attr(node, "axis") + x.rank
    lead, rest = 1, 1
    for d in x.shape[:axis]:
        lead = lead * d
    for d in x.shape[axis:]:
        rest = rest * d
    return [imp.b.reshape(x, (lead, rest))]


@converts("Transpose")
def _transpose(imp, node):
    x = imp.value(node.input[0])
    perm = imp.attr(node, "perm", list(range(x.rank))[::-1])
    return [x if list(perm) == list(range(x.rank)) else imp.b.op("transpose", x, perm=tuple(int(p) for p in perm))]


def _axes(imp, node, index: int, rank: int, what: str = "the axes"):
    name = imp.optional(node, index)
    axes = list(imp.const(name, what).reshape(-1)) if name is not None else imp.attr(node, "axes")
    return None if axes is None else [int(a) % rank for a in axes]


@converts("Squeeze")
def _squeeze(imp, node):
    x = imp.value(node.input[0])
    axes = _axes(imp, node, 1, x.rank)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    for a in axes:
        if x.shape[a] != 1:
            imp.fail(f"axis {a} has size {x.shape[a]}, not 1")
    return [imp.b.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))]


@converts("Unsqueeze")
def _unsqueeze(imp, node):
    x = imp.value(node.input[0])
    name = imp.optional(node, 1)
    given = list(imp.const(name, "the axes").reshape(-1)) if name is not None else imp.attr(node, "axes")
    rank = x.rank + len(given)
    axes = sorted(int(a) % rank for a in given)
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return [imp.b.reshape(x, tuple(dims))]


@converts("Concat")
def _concat(imp, node):
    values = [imp.env[n] for n in node.input if n]
    values = [v for v in values if not (is_const(v) and v.size == 0)] or values[:1]
    like = next((v for v in values if isinstance(v, Value)), None)
    values = [v if isinstance(v, Value) else imp.materialize(v, like) for v in values]
    values = [v for v in values if v.shape[imp.attr(node, "axis") % v.rank] != 0] or values[:1]
    axis = imp.attr(node, "axis") % values[0].rank
    return [values[0] if len(values) == 1 else imp.b.op("concat", *values, axis=axis)]


def _clamp(index: int, size, what: str, imp) -> object:
    if isinstance(size, int):
        if index < 0:
            index += size
        return max(0, min(size, index))
    if index >= 2**31 - 1:
        return size
    if index < 0:
        return size + index
    return index


@converts("Slice")
def _slice(imp, node):
    x = imp.value(node.input[0])
    starts = [int(v) for v in imp.const(node.input[1], "the starts").reshape(-1)]
    ends = [int(v) for v in imp.const(node.input[2], "the ends").reshape(-1)]
    axes = _axes(imp, node, 3, x.rank) or list(range(len(starts)))
    steps_name = imp.optional(node, 4)
    steps = [int(v) for v in imp.const(steps_name, "the steps").reshape(-1)] if steps_name else [1] * len(starts)
    y = x
    for s, e, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            imp.fail("a step of 0")
        if step != 1:
            from .windows import stepped_slice
            y = stepped_slice(imp, y, axis, s, e, step)
            continue
        size = y.shape[axis]
        start, stop = _clamp(s, size, "start", imp), _clamp(e, size, "end", imp)
        if start == 0 and stop == size:
            continue
        y = imp.b.op("slice", y, axis=axis, start=start, stop=stop)
    return [y]


@converts("Split")
def _split(imp, node):
    x = imp.value(node.input[0])
    axis = imp.attr(node, "axis", 0) % x.rank
    name = imp.optional(node, 1)
    size = x.shape[axis]
    if name is not None:
        parts = [int(v) for v in imp.const(name, "the split sizes").reshape(-1)]
    else:
        count = imp.attr(node, "num_outputs", len(node.output))
        if not isinstance(size, int):
            imp.fail("an even split of a symbolic dimension")
        chunk = -(-size // count)
        parts = [min(chunk, size - i * chunk) for i in range(count)]
    outs, start = [], 0
    for p in parts:
        # the graph has no empty tensor: an empty part of known shape is an empty constant, which
        # Concat drops (a rotary embedding's split with nothing left unrotated); else uncomputed,
        # an error only where read
        if p:
            outs.append(imp.b.op("slice", x, axis=axis, start=start, stop=start + p))
        elif all(isinstance(d, int) for d in x.shape) and x.dtype in NUMPY:
            outs.append(np.zeros(tuple(0 if i == axis else d for i, d in enumerate(x.shape)), NUMPY[x.dtype]))
        else:
            outs.append(None)
        start += p
    return outs


@converts("Gather")
def _gather(imp, node):
    data = imp.env[node.input[0]]
    indices = imp.env[node.input[1]]
    x = data if isinstance(data, Value) else None
    axis = imp.attr(node, "axis", 0)
    b = imp.b
    rank = x.rank if x is not None else np.ndim(data)
    if not -rank <= axis < rank:                  # a scalar has no axis at all
        imp.fail(f"axis {axis} of an input of rank {rank}")
    if is_const(indices):
        x = x if x is not None else imp.materialize(data)
        axis %= x.rank
        idx = np.asarray(indices).astype(np.int64)
        size = x.shape[axis]
        if not isinstance(size, int) and (idx < 0).any():
            imp.fail("a negative index into a symbolic dimension")
        flat = [int(i) + (size if i < 0 else 0) for i in idx.reshape(-1)]
        pieces = [b.op("slice", x, axis=axis, start=i, stop=i + 1) for i in flat]
        y = pieces[0] if len(pieces) == 1 else b.op("concat", *pieces, axis=axis)
        shape = tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1:])
        return [b.reshape(y, shape)]
    table = x if x is not None else imp.materialize(data)
    axis %= table.rank
    size = table.shape[axis]
    if isinstance(size, int) and indices.dtype in ("int32", "int64"):
        # a negative index counts from the end: size added where it is below 0 (in float64, exact
        # for any index of a table that fits in memory)
        wide = b.op("cast", indices, dtype="float64")
        below = b.sub(b.scalar(1.0, "float64"), b.op("ge_mask", wide, b.scalar(0.0, "float64")))
        indices = b.op("cast", b.add(wide, b.scale(below, float(size))), dtype=indices.dtype)
    if axis != 0:
        # the axis read brought to the front, its rows gathered, the other axes put back around
        # the indices' own
        rest = [i for i in range(table.rank) if i != axis]
        moved = b.op("transpose", table, perm=tuple([axis] + rest))
        flat = b.reshape(moved, (size, math.prod(table.shape[i] for i in rest)))
        rows = b.op("embedding", flat, indices, layer=imp.b.scope)
        r = indices.rank
        rows = b.reshape(rows, tuple(indices.shape) + tuple(table.shape[i] for i in rest))
        perm = [r + i for i in range(axis)] + list(range(r)) + [r + i for i in range(axis, table.rank - 1)]
        return [b.op("transpose", rows, perm=tuple(perm))]
    if table.rank != 2:
        flat = b.reshape(table, (table.shape[0], math.prod(table.shape[1:])))
        rows = b.op("embedding", flat, indices, layer=imp.b.scope)
        return [b.reshape(rows, tuple(indices.shape) + tuple(table.shape[1:]))]
    return [b.op("embedding", table, indices, layer=imp.b.scope)]


@converts("Expand")
def _expand(imp, node):
    from toolkit.ops.rules import broadcast_shapes
    x = imp.value(node.input[0])
    shape = dims_of(imp.const(node.input[1], "the shape"))
    target = broadcast_shapes(tuple(x.shape), shape)
    return [x if target == tuple(x.shape) else imp.b.op("broadcast_to", x, shape=target)]


@converts("Tile")
def _tile(imp, node):
    x = imp.value(node.input[0])
    repeats = [int(r) for r in imp.const(node.input[1], "the repeats").reshape(-1)]
    if len(repeats) != x.rank or any(r < 1 for r in repeats):
        imp.fail(f"repeats {repeats} for a rank-{x.rank} input (one repeat of at least 1 per axis)")
    if all(isinstance(d, int) for d in x.shape):
        from toolkit.hostmem import human_bytes, too_big
        nbytes = math.prod(x.shape) * math.prod(repeats) * 8
        why = too_big(nbytes)
        if why:
            imp.fail(f"repeats {repeats} make a tensor of {human_bytes(nbytes)}, {why}")
    b = imp.b
    for axis, r in enumerate(repeats):
        if r != 1:
            # r copies side by side: a new axis of r in front of this one, broadcast, folded in
            shape = tuple(x.shape)
            spread = b.op("broadcast_to", b.reshape(x, shape[:axis] + (1,) + shape[axis:]),
                          shape=shape[:axis] + (r,) + shape[axis:])
            x = b.reshape(spread, shape[:axis] + (r * shape[axis],) + shape[axis + 1:])
    return [x]


@converts("Pad")
def _pad(imp, node):
    x = imp.value(node.input[0])
    mode = imp.attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "edge", "reflect", "wrap"):
        imp.fail(f"mode {mode} has no counterpart here")
    pads = [int(p) for p in imp.const(node.input[1], "the pads").reshape(-1)]
    if mode != "constant":
        from .windows import pad_mode
        axes = _axes(imp, node, 3, x.rank) or list(range(x.rank))
        half = len(pads) // 2
        for axis, lo, hi in zip(axes, pads[:half], pads[half:]):
            if lo < 0 or hi < 0:
                imp.fail(f"mode {mode} with a negative padding has no counterpart here")
            if lo or hi:
                x = pad_mode(imp, x, axis, lo, hi, mode)
        return [x]
    value = imp.optional(node, 2)
    fill = float(np.asarray(imp.const(value, "the value")).reshape(-1)[0]) if value is not None else 0.0
    if fill and x.dtype not in FLOAT_DTYPES:
        imp.fail(f"a padding value other than 0 for {x.dtype} values")
    if fill:                         # pad x - v with zeros, then add v back: v in the padding
        x = imp.b.sub(x, imp.b.scalar(fill, x.dtype))
    axes = _axes(imp, node, 3, x.rank) or list(range(x.rank))
    half = len(pads) // 2
    for axis, lo, hi in zip(axes, pads[:half], pads[half:]):
        if lo < 0 or hi < 0:
            x = imp.b.op("slice", x, axis=axis, start=max(0, -lo), stop=x.shape[axis] - max(0, -hi))
            lo, hi = max(0, lo), max(0, hi)
        if lo or hi:
            x = imp.b.op("pad_axis", x, axis=axis, before=lo, after=hi)
    return [imp.b.add(x, imp.b.scalar(fill, x.dtype)) if fill else x]


# -- reductions, top-k ------------------------------------------------------------------------
@converts("ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceL1", "ReduceMax", "ReduceMin",
          "ReduceLogSumExp")
def _reduce(imp, node):
    given = imp.value(node.input[0])
    if given.dtype == "bool" and node.op_type in ("ReduceMax", "ReduceMin"):     # any / all, on a 0/1 mask
        y = _reduce_floats(imp, node, imp.b.op("cast", given, dtype="float32"))
        return [imp.b.op("cast", y, dtype="bool")]
    return [_reduce_floats(imp, node, _float(imp, node.input[0]))]


def _reduce_floats(imp, node, x: Value) -> Value:
    op = node.op_type
    takes_input = op == "ReduceSum" or imp.opset >= 18
    axes = _axes(imp, node, 1, x.rank) if takes_input else \
        ([int(a) % x.rank for a in imp.attr(node, "axes")] if imp.attr(node, "axes") is not None else None)
    keep = bool(imp.attr(node, "keepdims", 1))
    if not axes:
        if imp.attr(node, "noop_with_empty_axes", 0):
            return x
        axes = list(range(x.rank))
    axes = tuple(sorted(set(axes)))
    b = imp.b
    if op == "ReduceMax":
        return _reduce_max(imp, x, axes, keep)
    if op == "ReduceMin":
        return b.op("neg", _reduce_max(imp, b.op("neg", x), axes, keep))
    if op == "ReduceMean":
        return b.op("reduce_mean", x, axes=axes, keepdims=keep)
    if op == "ReduceLogSumExp":
        top = _reduce_max(imp, x, axes, True)
        total = b.reduce_sum(b.op("exp", b.sub(x, top)), axes, keepdims=True)
        y = b.add(b.op("log", total), top)
        return y if keep else b.reshape(y, tuple(d for i, d in enumerate(x.shape) if i not in axes))
    source = {"ReduceSum": x, "ReduceSumSquare": b.op("square", x) if op == "ReduceSumSquare" else None,
              "ReduceL2": b.op("square", x) if op == "ReduceL2" else None,
              "ReduceL1": b.op("abs", x) if op == "ReduceL1" else None}[op]
    y = b.reduce_sum(source, axes, keepdims=keep)
    return b.op("sqrt", y) if op == "ReduceL2" else y


@converts("TopK")
def _topk(imp, node):
    given = imp.value(node.input[0])
    # integers ranked as float64: exact for every int32, and int64 below 2^53
    x = imp.b.op("cast", given, dtype="float64") if given.dtype in ("int32", "int64") else _float(imp, node.input[0])
    k = int(np.asarray(imp.const(node.input[1], "k")).reshape(-1)[0])
    axis = imp.attr(node, "axis", -1) % x.rank
    largest = imp.attr(node, "largest", 1)
    b = imp.b
    src = x if largest else b.op("neg", x)
    values = b.op("topk", src, axis=axis, k=k, values=True)
    indices = b.op("cast", b.op("topk", src, axis=axis, k=k, values=False), dtype="int64")
    values = values if largest else b.op("neg", values)
    return [values if values.dtype == given.dtype else b.op("cast", values, dtype=given.dtype), indices]


@converts("ArgMax", "ArgMin")
def _argmax(imp, node):
    x = _float(imp, node.input[0])
    axis = imp.attr(node, "axis", 0) % x.rank
    b = imp.b
    if imp.attr(node, "select_last_index", 0):
        from .windows import last_index_arg
        y = last_index_arg(imp, x, axis, node.op_type == "ArgMax")
    else:
        src = x if node.op_type == "ArgMax" else b.op("neg", x)
        y = b.op("cast", b.op("topk", src, axis=axis, k=1, values=False), dtype="int64")
    if not imp.attr(node, "keepdims", 1):
        y = b.reshape(y, tuple(d for i, d in enumerate(x.shape) if i != axis))
    return [y]


@converts("ConstantOfShape")
def _constant_of_shape(imp, node):
    from .fold import _fill
    return [_fill(imp, node, np.asarray(imp.const(node.input[0], "the shape"), dtype=object))]



@converts("Einsum")
def _einsum(imp, node):
    """One operand: a permutation and sums; two: a batched matrix product (indices in both and
    the output are the batch, in both but not the output are summed). No repeated index within
    one operand (a diagonal), no ellipsis."""
    equation = imp.attr(node, "equation")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if "..." in equation:
        imp.fail(f"the equation {equation!r}: an ellipsis has no counterpart here")
    if "->" not in equation:              # implicit: the indices seen once, in alphabetical order
        letters = equation.replace(",", "")
        equation += "->" + "".join(sorted(ch for ch in set(letters) if letters.count(ch) == 1))
    lhs, out = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != len(node.input) or len(terms) > 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        imp.fail(f"the equation {equation!r}: one or two operands without repeated indices only")
    values = [imp.value(n) for n in node.input]
    for t, v in zip(terms, values):
        if len(t) != v.rank:
            imp.fail(f"the equation {equation!r}: operand {t!r} names {len(t)} axes, the input has {v.rank}")
    if any(ch not in lhs for ch in out):
        imp.fail(f"the equation {equation!r}: an output index that no operand has")
    like = next((v for v in values if v.dtype in FLOAT_DTYPES), values[0])
    values = [v if v.dtype == like.dtype else imp.value(n, like) for v, n in zip(values, node.input)]
    b = imp.b
    if len(terms) == 1:
        (t,), (x,) = terms, values
        summed = [i for i, c in enumerate(t) if c not in out]
        y = b.reduce_sum(x, summed) if summed else x
        kept = [c for c in t if c in out]
        perm = tuple(kept.index(c) for c in out)
        return [y if perm == tuple(range(len(perm))) else b.op("transpose", y, perm=perm)]
    ta, tb = terms
    a, c = values
    size = {}
    for term, v in ((ta, a), (tb, c)):
        for ch, d in zip(term, v.shape):
            size.setdefault(ch, d)
    batch = [ch for ch in ta if ch in tb and ch in out]
    contract = [ch for ch in ta if ch in tb and ch not in out]
    free_a = [ch for ch in ta if ch not in tb]
    free_b = [ch for ch in tb if ch not in ta]
    if any(ch not in out for ch in free_a + free_b):
        imp.fail(f"the equation {equation!r}: an index of one operand summed alone has no counterpart here")

    def arranged(v, term, order, shape):
        perm = tuple(term.index(ch) for ch in order)
        if perm != tuple(range(len(perm))):
            v = b.op("transpose", v, perm=perm)
        return b.reshape(v, shape)

    def prod(chars):
        total = 1
        for ch in chars:
            total = total * size[ch]
        return total
    lead = tuple(size[ch] for ch in batch)
    a3 = arranged(a, ta, batch + free_a + contract, lead + (prod(free_a), prod(contract)))
    b3 = arranged(c, tb, batch + contract + free_b, lead + (prod(contract), prod(free_b)))
    if not lead:
        a3, b3 = b.reshape(a3, (1,) + tuple(a3.shape)), b.reshape(b3, (1,) + tuple(b3.shape))
    y = b.op("matmul", a3, b3, trans_a=False, trans_b=False)
    order = batch + free_a + free_b
    y = b.reshape(y, tuple(size[ch] for ch in order))
    perm = tuple(order.index(ch) for ch in out)
    return [y if perm == tuple(range(len(perm))) else b.op("transpose", y, perm=perm)]

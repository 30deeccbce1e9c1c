"""ONNX's pooling: MaxPool and AveragePool (onto the pooling primitives where their padding
allows, else the windows written out), GlobalAveragePool and GlobalMaxPool."""
from __future__ import annotations

from toolkit.ir.graph import FLOAT_DTYPES

from ..windows import pad_explicit, pool_size, spatial_pads
from .base import converts, float_input, image_input, reduce_max, two_axes


class _Unequal(Exception):
    """Padding the pooling primitives cannot express: the windows are written out instead."""


@converts("MaxPool", "AveragePool")
def _pool(imp, node):
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        imp.fail("the indices output of MaxPool has no counterpart here")
    # max pooling commutes with quantization: a quantized MaxPool (the QOperator format) pools the integers
    quantized = node.op_type == "MaxPool"
    x = float_input(imp, node.input[0], quantized)
    spatial = x.rank - 2
    if spatial < 1:
        imp.fail(f"{node.op_type} of a rank-{x.rank} input has no counterpart here")
    dilations = [int(d) for d in imp.attr(node, "dilations", [1] * spatial)]
    if x.rank in (3, 4) and all(d == 1 for d in dilations):
        try:
            return _pool_primitive(imp, node)
        except _Unequal:
            pass
    if x.dtype not in FLOAT_DTYPES:
        imp.fail(f"max pooling of {x.dtype} with this padding or dilation has no counterpart here")
    from ..windows import window_pool
    kernel = [int(k) for k in imp.attr(node, "kernel_shape")]
    strides = [int(s) for s in imp.attr(node, "strides", [1] * spatial)]
    begin, end = spatial_pads(imp, node, x, kernel, strides, dilations)
    include = bool(imp.attr(node, "count_include_pad", 0)) and node.op_type == "AveragePool"
    return [window_pool(imp, node, x, kernel, strides, dilations, begin, end, bool(imp.attr(node, "ceil_mode", 0)),
                        include)]


def _pool_primitive(imp, node):
    """Pooling of 1-d and 2-d images without dilation onto max_pool2d/avg_pool2d; padding they
    cannot express raises _Unequal."""
    x, one_d = image_input(imp, node, node.input[0], node.op_type == "MaxPool")
    kernel = two_axes(imp.attr(node, "kernel_shape"), one_d, 1)
    strides = two_axes(imp.attr(node, "strides", [1] * (2 - one_d)), one_d, 1)
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
    x = float_input(imp, node.input[0])
    axes = tuple(range(2, x.rank))
    if node.op_type == "GlobalAveragePool":
        return [imp.b.op("reduce_mean", x, axes=axes, keepdims=True)]
    return [reduce_max(imp, x, axes, True)]

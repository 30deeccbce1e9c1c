"""2-d max and average pooling (NCHW) with PyTorch's output-size, ceil_mode and divisor rules.

Attributes: kernel, stride, pad (pairs), ceil_mode; average pooling adds count_include_pad.
Max pooling's gradient goes to the first maximum of each window in row-major order, as PyTorch.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import QUANT_DTYPES, TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import need_float, need_rank


def pool_out_size(size, kernel, stride, pad, ceil_mode):
    if 2 * pad > kernel:
        raise ShapeError(f"pad {pad} must be at most half the kernel size {kernel}")
    if isinstance(size, int) and size + 2 * pad < kernel:
        raise ShapeError(f"input size {size} (+2*{pad} padding) is smaller than the kernel {kernel}")
    span = size + 2 * pad - kernel
    if ceil_mode:
        out = (span + stride - 1) // stride + 1
        if (out - 1) * stride >= size + pad:      # the last window must start inside input or left pad
            out -= 1
        return out
    return span // stride + 1


def _pool_infer(types, attrs, quantized: bool = False):
    """``quantized``: uint8 / int8 are taken too (max pooling: the max of quantized values is the
    quantized max, so an int8 region keeps its values quantized through it)."""
    x = types[0]
    if not (quantized and x.dtype in QUANT_DTYPES):
        need_float(x)
    need_rank(x, 4, "pooling input")
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
    oh = pool_out_size(h, kh, sh, ph, attrs["ceil_mode"])
    ow = pool_out_size(w, kw, sw, pw, attrs["ceil_mode"])
    return [TensorType((n, c, oh, ow), x.dtype)]


def padded_input(x, attrs, fill):
    """x padded by ``pad`` on the left/top and enough on the right/bottom for every window."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
    oh = pool_out_size(h, kh, sh, ph, attrs["ceil_mode"])
    ow = pool_out_size(w, kw, sw, pw, attrs["ceil_mode"])
    hp = max((oh - 1) * sh + kh, h + 2 * ph)
    wp = max((ow - 1) * sw + kw, w + 2 * pw)
    xp = np.full((n, c, hp, wp), fill, dtype=x.dtype)
    xp[:, :, ph: ph + h, pw: pw + w] = x
    return xp, oh, ow


def window(xp, i, j, oh, ow, attrs):
    (sh, sw) = attrs["stride"]
    return xp[:, :, i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw]


def lowest(dtype) -> float:
    """What a max pooling's padding holds: -inf, or an integer type's least value."""
    return int(np.iinfo(str(dtype)).min) if str(dtype) in QUANT_DTYPES else -np.inf


def max_pool2d_reference(x, kernel, stride, pad, ceil_mode):
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode)
    xp, oh, ow = padded_input(x, attrs, lowest(x.dtype))
    y = np.full(x.shape[:2] + (oh, ow), lowest(x.dtype), dtype=x.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            y = np.maximum(y, window(xp, i, j, oh, ow, attrs))
    return y


def max_pool2d_grad_reference(g, x, kernel, stride, pad, ceil_mode):
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode)
    xp, oh, ow = padded_input(x, attrs, -np.inf)
    y = max_pool2d_reference(x, kernel, stride, pad, ceil_mode)
    dxp = np.zeros_like(xp)
    taken = np.zeros(y.shape, dtype=bool)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            hit = (window(xp, i, j, oh, ow, attrs) == y) & ~taken
            taken |= hit
            window(dxp, i, j, oh, ow, attrs)[...] += g * hit
    h, w = x.shape[2:]
    return dxp[:, :, pad[0]: pad[0] + h, pad[1]: pad[1] + w]


def avg_divisor(h, w, oh, ow, attrs):
    """PyTorch's divisor per output position: window clipped to the padded input, or to the input."""
    def per_axis(size, out, k, s, p):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        if attrs["count_include_pad"]:
            return end - start
        return np.minimum(end, size) - np.maximum(start, 0)
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
    return np.outer(per_axis(h, oh, kh, sh, ph), per_axis(w, ow, kw, sw, pw))


def avg_pool2d_reference(x, kernel, stride, pad, ceil_mode, count_include_pad):
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode,
                 count_include_pad=count_include_pad)
    xp, oh, ow = padded_input(x, attrs, 0.0)
    total = np.zeros(x.shape[:2] + (oh, ow), dtype=x.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            total += window(xp, i, j, oh, ow, attrs)
    return (total / avg_divisor(x.shape[2], x.shape[3], oh, ow, attrs)).astype(x.dtype)


def avg_pool2d_grad_reference(g, kernel, stride, pad, ceil_mode, count_include_pad, input_hw):
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode,
                 count_include_pad=count_include_pad)
    h, w = input_hw
    n, c, oh, ow = g.shape
    xp, _, _ = padded_input(np.zeros((n, c, h, w), dtype=g.dtype), attrs, 0.0)
    share = (g / avg_divisor(h, w, oh, ow, attrs)).astype(g.dtype)
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            window(xp, i, j, oh, ow, attrs)[...] += share
    return xp[:, :, pad[0]: pad[0] + h, pad[1]: pad[1] + w]


_POOL_KEYS = ("kernel", "stride", "pad", "ceil_mode")


def _max_grad(b: Builder, node, gouts):
    attrs = {k: node.attrs[k] for k in _POOL_KEYS}
    return [b.op("max_pool2d_grad", gouts[0], node.inputs[0], **attrs)]


def _avg_grad(b: Builder, node, gouts):
    attrs = {k: node.attrs[k] for k in _POOL_KEYS + ("count_include_pad",)}
    return [b.op("avg_pool2d_grad", gouts[0], input_hw=tuple(node.inputs[0].shape[2:]), **attrs)]


def _pool_flops(ins, outs, attrs):
    kh, kw = attrs["kernel"]
    return outs[0].numel * kh * kw


def _avg_grad_infer(types, attrs):
    g = types[0]
    return [TensorType(tuple(g.shape[:2]) + tuple(attrs["input_hw"]), g.dtype)]


register(OpDef("max_pool2d", lambda types, attrs: _pool_infer(types, attrs, quantized=True),
               max_pool2d_reference, _max_grad, _pool_flops, batch_rows=True))
register(OpDef("max_pool2d_grad", lambda types, attrs: [types[1]], max_pool2d_grad_reference,
               flops=lambda i, o, a: i[0].numel * a["kernel"][0] * a["kernel"][1], batch_rows=True,
               doc="routes g to the first maximum of each window"))
register(OpDef("avg_pool2d", _pool_infer, avg_pool2d_reference, _avg_grad, _pool_flops, batch_rows=True))
register(OpDef("avg_pool2d_grad", _avg_grad_infer, avg_pool2d_grad_reference,
               flops=lambda i, o, a: i[0].numel * a["kernel"][0] * a["kernel"][1], batch_rows=True))

"""2-d convolution (NCHW, weights [O, C/group, kH, kW]) and its two gradient ops.

The references loop over kernel offsets with einsum: slow but plainly the definition.
Attributes: stride, pad, dilation (pairs), group.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import fmt_shape, need_float, need_rank, same_dtype


def conv_out_size(size, kernel, stride, pad, dilation):
    span = dilation * (kernel - 1) + 1
    if isinstance(size, int) and size + 2 * pad < span:
        raise ShapeError(f"input size {size} (+2*{pad} padding) is smaller than the kernel span {span}")
    return (size + 2 * pad - span) // stride + 1


def _conv_infer(types, attrs):
    if len(types) not in (2, 3):
        raise ShapeError(f"conv2d takes (input, weight[, bias]), got {len(types)} inputs")
    x, w = types[:2]
    same_dtype(types)
    if len(types) == 3 and tuple(types[2].shape) != (w.shape[0],):
        raise ShapeError(f"bias has shape {fmt_shape(types[2].shape)}, expected [{w.shape[0]}]")
    need_float(x)
    need_rank(x, 4, "convolution input")
    need_rank(w, 4, "convolution weight")
    return [TensorType(conv_output_shape(x.shape, w.shape, attrs), x.dtype)]


def conv_output_shape(x_shape, w_shape, attrs, op: str = "") -> tuple:
    """[N, O, OH, OW] of a convolution of an input [N, C, H, W] by a weight [O, C/group, kH, kW],
    the channels and groups checked (the float and the int8 convolution alike); ``op`` names the
    op in the messages ("qconv2d "), empty for conv2d."""
    group = attrs["group"]
    n, c, h, wd = x_shape
    o, cg, kh, kw = w_shape
    if c != cg * group:
        raise ShapeError(f"{op}input has {c} channels but the weight {fmt_shape(w_shape)} with group={group} "
                         f"expects {cg * group}")
    if o % group:
        raise ShapeError(f"{op}num_output {o} is not divisible by group {group}")
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["pad"], attrs["dilation"]
    return (n, o, conv_out_size(h, kh, sh, ph, dh), conv_out_size(wd, kw, sw, pw, dw))


def _windows(xp, i, j, oh, ow, attrs):
    """The input patch that kernel offset (i, j) meets at every output position: [N, C, OH, OW]."""
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    return xp[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]


def _pad(x, attrs):
    ph, pw = attrs["pad"]
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _groups(c, o, group):
    cg, og = c // group, o // group
    return [(slice(k * cg, (k + 1) * cg), slice(k * og, (k + 1) * og)) for k in range(group)]


def conv2d_reference(x, w, *bias, stride, pad, dilation, group):
    attrs = dict(stride=stride, pad=pad, dilation=dilation)
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    oh = conv_out_size(x.shape[2], kh, stride[0], pad[0], dilation[0])
    ow = conv_out_size(x.shape[3], kw, stride[1], pad[1], dilation[1])
    xp = _pad(x, attrs)
    y = np.zeros((n, o, oh, ow), dtype=x.dtype)
    for cs, os in _groups(c, o, group):
        for i in range(kh):
            for j in range(kw):
                patch = _windows(xp, i, j, oh, ow, attrs)[:, cs]
                y[:, os] += np.einsum("nchw,oc->nohw", patch, w[os, :, i, j])
    if bias:
        y += bias[0].reshape(1, -1, 1, 1)
    return y


def conv2d_grad_input_reference(g, w, stride, pad, dilation, group, input_hw):
    attrs = dict(stride=stride, pad=pad, dilation=dilation)
    n, o, oh, ow = g.shape
    _, cg, kh, kw = w.shape
    c = cg * group
    h, wd = input_hw
    xp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]), dtype=g.dtype)
    for cs, os in _groups(c, o, group):
        for i in range(kh):
            for j in range(kw):
                view = _windows(xp, i, j, oh, ow, attrs)
                view[:, cs] += np.einsum("nohw,oc->nchw", g[:, os], w[os, :, i, j])
    return xp[:, :, pad[0]: pad[0] + h, pad[1]: pad[1] + wd]


def conv2d_grad_weight_reference(g, x, stride, pad, dilation, group, kernel):
    attrs = dict(stride=stride, pad=pad, dilation=dilation)
    n, o, oh, ow = g.shape
    c = x.shape[1]
    kh, kw = kernel
    xp = _pad(x, attrs)
    dw = np.zeros((o, c // group, kh, kw), dtype=g.dtype)
    for cs, os in _groups(c, o, group):
        for i in range(kh):
            for j in range(kw):
                patch = _windows(xp, i, j, oh, ow, attrs)[:, cs]
                dw[os, :, i, j] = np.einsum("nohw,nchw->oc", g[:, os], patch)
    return dw


def _conv_attrs(node):
    return {k: node.attrs[k] for k in ("stride", "pad", "dilation", "group")}


def _conv_grad(b: Builder, node, gouts):
    g, = gouts
    x, w = node.inputs[:2]
    gx = b.op("conv2d_grad_input", g, w, input_hw=tuple(x.shape[2:]), **_conv_attrs(node))
    gw = b.op("conv2d_grad_weight", g, x, kernel=tuple(w.shape[2:]), **_conv_attrs(node))
    if len(node.inputs) == 3:
        return [gx, gw, b.reduce_sum(g, (0, 2, 3))]        # d bias = sum over N, H, W
    return [gx, gw]


def _grad_input_grad(b: Builder, node, gouts):
    """conv2d_grad_input is the transposed convolution (Deconvolution's forward): linear in g
    and in w, its adjoint in g is the convolution itself, and its gradient for w is the weight
    gradient of a convolution whose input is the incoming gradient."""
    dy, = gouts
    g, w = node.inputs
    return [b.op("conv2d", dy, w, **_conv_attrs(node)),
            b.op("conv2d_grad_weight", g, dy, kernel=tuple(w.shape[2:]), **_conv_attrs(node))]


def _conv_flops(ins, outs, attrs):
    _, cg, kh, kw = ins[1].shape
    return 2 * outs[0].numel * cg * kh * kw


def _grad_input_infer(types, attrs):
    g, w = types
    return [TensorType((g.shape[0], w.shape[1] * attrs["group"]) + tuple(attrs["input_hw"]), g.dtype)]


def _grad_weight_infer(types, attrs):
    g, x = types
    return [TensorType((g.shape[1], x.shape[1] // attrs["group"]) + tuple(attrs["kernel"]), g.dtype)]


def _grad_input_flops(ins, outs, attrs):
    _, cg, kh, kw = ins[1].shape
    return 2 * ins[0].numel * cg * kh * kw


def _grad_weight_flops(ins, outs, attrs):
    return 2 * ins[0].numel * outs[0].shape[1] * outs[0].shape[2] * outs[0].shape[3]


register(OpDef("conv2d", _conv_infer, conv2d_reference, _conv_grad, _conv_flops, batch_rows=True,
               doc="cross-correlation, NCHW, grouped and dilated, with an optional bias [O]"))
register(OpDef("conv2d_grad_input", _grad_input_infer, conv2d_grad_input_reference, _grad_input_grad,
               flops=_grad_input_flops, batch_rows=True, doc="gradient of conv2d with respect to its input"))
register(OpDef("conv2d_grad_weight", _grad_weight_infer, conv2d_grad_weight_reference,
               flops=_grad_weight_flops, batch_sum=True, doc="gradient of conv2d with respect to its weight"))

"""The channels-last layout (NHWC, as PyTorch's ``channels_last`` and cuDNN's Tensor Core kernels
take it): an image [N, C, H, W] held as [N, H, W, C], the channels of one position side by side.

The ops, all made by the layout pass on a GPU (passes/layout_nhwc.py) after autodiff:
- ``to_nhwc`` / ``from_nhwc``: the reorders between NCHW and NHWC; each is the other's gradient.
- ``nhwc_conv2d``: conv2d on NHWC input and output, the weight [O, kH, kW, C/group] (cuDNN's
  NHWC filter format, KRSC: the pass reorders a constant weight once, when it compiles), the
  optional bias [O]. Attributes: conv2d's.
- ``nhwc_max_pool2d`` / ``nhwc_avg_pool2d``: the pooling ops on NHWC input and output, with
  their attributes.
- the gradients of a train step: ``nhwc_conv2d_backward_data`` (g NHWC, weight [O, kH, kW, C/group]:
  the input's gradient NHWC), ``nhwc_conv2d_backward_filter`` (g and x NHWC: the weight's gradient
  [O, kH, kW, C/group]), ``nhwc_max_pool2d_backward`` and ``nhwc_avg_pool2d_backward``, each with the
  attributes of the NCHW op it stands for.

Elementwise ops, reductions over the map and concatenation along channels need no NHWC form:
the pass runs them on the 4-d arrays with their axes and per-channel constants rearranged.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import TensorType
from .base import Builder, OpDef, ShapeError, register
from .conv import (
    _conv_flops,
    _conv_infer,
    _grad_input_flops,
    _grad_input_infer,
    _grad_weight_flops,
    _grad_weight_infer,
    conv2d_grad_input_reference,
    conv2d_grad_weight_reference,
    conv2d_reference,
)
from .pool import (
    _avg_grad_infer,
    _pool_flops,
    _pool_infer,
    avg_pool2d_grad_reference,
    avg_pool2d_reference,
    max_pool2d_grad_reference,
    max_pool2d_reference,
)
from .rules import need_rank

TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def nhwc_shape(shape) -> tuple:
    n, c, h, w = shape
    return (n, h, w, c)


def nchw_shape(shape) -> tuple:
    n, h, w, c = shape
    return (n, c, h, w)


def to_nhwc_reference(x):
    return np.ascontiguousarray(x.transpose(TO_NHWC))


def from_nhwc_reference(y):
    return np.ascontiguousarray(y.transpose(TO_NCHW))


def _to_nhwc_infer(types, attrs):
    x, = types
    need_rank(x, 4, "to_nhwc input")
    return [TensorType(nhwc_shape(x.shape), x.dtype)]


def _from_nhwc_infer(types, attrs):
    y, = types
    need_rank(y, 4, "from_nhwc input")
    return [TensorType(nchw_shape(y.shape), y.dtype)]


def _to_nhwc_grad(b: Builder, node, gouts):
    return [b.op("from_nhwc", gouts[0])]


def _from_nhwc_grad(b: Builder, node, gouts):
    return [b.op("to_nhwc", gouts[0])]


def _conv_infer_nhwc(types, attrs):
    x, w = types[:2]
    need_rank(x, 4, "nhwc_conv2d input")
    need_rank(w, 4, "nhwc_conv2d weight")
    o, kh, kw, cg = w.shape
    plain = [TensorType(nchw_shape(x.shape), x.dtype), TensorType((o, cg, kh, kw), w.dtype)] + list(types[2:])
    out, = _conv_infer(plain, attrs)
    return [TensorType(nhwc_shape(out.shape), out.dtype)]


def nhwc_conv2d_reference(x, w, *bias, stride, pad, dilation, group):
    y = conv2d_reference(from_nhwc_reference(x), np.ascontiguousarray(w.transpose(0, 3, 1, 2)), *bias,
                         stride=stride, pad=pad, dilation=dilation, group=group)
    return to_nhwc_reference(y)


def _pool_infer_nhwc(types, attrs):
    x, = types
    need_rank(x, 4, "nhwc pooling input")
    if not all(isinstance(d, int) for d in x.shape[1:]):
        raise ShapeError("nhwc pooling: the map and channel sizes must be numbers")
    out, = _pool_infer([TensorType(nchw_shape(x.shape), x.dtype)], attrs)
    return [TensorType(nhwc_shape(out.shape), out.dtype)]


def nhwc_max_pool2d_reference(x, kernel, stride, pad, ceil_mode):
    return to_nhwc_reference(max_pool2d_reference(from_nhwc_reference(x), kernel, stride, pad, ceil_mode))


def nhwc_avg_pool2d_reference(x, kernel, stride, pad, ceil_mode, count_include_pad):
    return to_nhwc_reference(avg_pool2d_reference(from_nhwc_reference(x), kernel, stride, pad, ceil_mode,
                                                  count_include_pad))


def _as_nchw(types):
    """NHWC image and KRSC filter types (every 4-d one) as the NCHW op's: the same permutation."""
    return [TensorType(nchw_shape(t.shape), t.dtype) if t.rank == 4 else t for t in types]


def _nchw_form(infer):
    """The infer function of an op that is the NCHW op ``infer`` on channels-last 4-d operands."""
    def channels_last(types, attrs):
        for t in types:
            need_rank(t, 4, "a channels-last gradient's operand")
        return [TensorType(nhwc_shape(t.shape), t.dtype) for t in infer(_as_nchw(types), attrs)]
    return channels_last


def _nchw_reference(reference):
    """The reference of an op that is the NCHW op ``reference`` on channels-last 4-d operands."""
    def channels_last(*arrays, **attrs):
        return to_nhwc_reference(reference(*[from_nhwc_reference(a) for a in arrays], **attrs))
    return channels_last


def _flops_of(flops):
    def channels_last(ins, outs, attrs):
        return flops(_as_nchw(ins), _as_nchw(outs), attrs)
    return channels_last


def _no_flops(ins, outs, attrs):
    return 0          # data movement is not arithmetic


register(OpDef("to_nhwc", _to_nhwc_infer, to_nhwc_reference, _to_nhwc_grad, _no_flops,
               batch_rows=True, doc="NCHW -> NHWC: [N, C, H, W] as [N, H, W, C]"))
register(OpDef("from_nhwc", _from_nhwc_infer, from_nhwc_reference, _from_nhwc_grad, _no_flops,
               batch_rows=True, doc="NHWC -> NCHW: [N, H, W, C] as [N, C, H, W]"))
register(OpDef("nhwc_conv2d", _conv_infer_nhwc, nhwc_conv2d_reference, None, _conv_flops,
               batch_rows=True, doc="conv2d on NHWC input and output, weight [O, kH, kW, C/group]"))
register(OpDef("nhwc_max_pool2d", _pool_infer_nhwc, nhwc_max_pool2d_reference, None, _pool_flops,
               batch_rows=True, doc="max_pool2d on NHWC input and output"))
register(OpDef("nhwc_avg_pool2d", _pool_infer_nhwc, nhwc_avg_pool2d_reference, None, _pool_flops,
               batch_rows=True, doc="avg_pool2d on NHWC input and output"))
register(OpDef("nhwc_conv2d_backward_data", _nchw_form(_grad_input_infer),
               _nchw_reference(conv2d_grad_input_reference), None, _flops_of(_grad_input_flops), batch_rows=True,
               doc="conv2d_grad_input on NHWC g and result, weight [O, kH, kW, C/group]"))
register(OpDef("nhwc_conv2d_backward_filter", _nchw_form(_grad_weight_infer),
               _nchw_reference(conv2d_grad_weight_reference), None, _flops_of(_grad_weight_flops), batch_sum=True,
               doc="conv2d_grad_weight on NHWC g and x, the result [O, kH, kW, C/group]"))
register(OpDef("nhwc_max_pool2d_backward", _nchw_form(lambda types, attrs: [types[1]]),
               _nchw_reference(max_pool2d_grad_reference), None,
               lambda i, o, a: i[0].numel * a["kernel"][0] * a["kernel"][1], batch_rows=True,
               doc="max_pool2d_grad on NHWC g, x and result"))
register(OpDef("nhwc_avg_pool2d_backward", _nchw_form(_avg_grad_infer), _nchw_reference(avg_pool2d_grad_reference),
               None, lambda i, o, a: i[0].numel * a["kernel"][0] * a["kernel"][1], batch_rows=True,
               doc="avg_pool2d_grad on NHWC g and result"))

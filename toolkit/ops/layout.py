"""The blocked channel layout (NCHWc, as ONNX Runtime's and oneDNN's): an image [N, C, H, W] held
as [N, C/B, H, W, B], B channels of one position side by side, so that a kernel vectorises over
channels (any map size fills its lanes) instead of over positions (a 7x7 map fills 49 of 64).

Four ops, all made by the layout pass (passes/layout.py) after autodiff:
- ``to_blocked`` / ``from_blocked``: the reorders between NCHW and NCHWc (attribute ``block``);
  each is the other's gradient. A channel count that is not a multiple of the block is padded:
  ``to_blocked`` fills the last block's extra lanes with zeros, and ``from_blocked`` takes its
  attribute ``channels`` (default: every lane) to drop them again. So a 24-channel image is two
  blocks, as ONNX Runtime's and oneDNN's are; the layout pass keeps the extra lanes zero.
- ``conv2d_blocked``: conv2d on blocked input and output, the weight still [O, C/group, kH, kW]
  with O and C multiples of the block (the pass pads a weight with zero rows and columns), dense,
  depthwise, or grouped with whole blocks per group (AlexNet's); or,
  dense only, on an NCHW input (rank 4, any C: an RGB image) into blocked output
  (the kernel reorders and packs it once, when the plan is built), dense (group 1) or depthwise
  (group = C = O). Attributes: conv2d's, plus ``block``.
- ``max_pool2d_blocked``: max_pool2d on blocked input and output (its attributes, plus ``block``).

Elementwise ops, reductions and concatenation need no blocked form: the pass runs them on the
5-d arrays with their axes and constants rearranged.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import TensorType
from .base import Builder, OpDef, ShapeError, register
from .conv import _conv_flops, _conv_infer, conv2d_reference
from .pool import _pool_flops, _pool_infer, max_pool2d_reference
from .rules import fmt_shape, need_rank


def blocks(channels: int, block: int) -> int:
    """How many blocks hold ``channels`` (the last one padded)."""
    return -(-channels // block)


def blocked_shape(shape, block: int) -> tuple:
    n, c, h, w = shape
    return (n, blocks(c, block), h, w, block)


def to_blocked_reference(x, block):
    n, c, h, w = x.shape
    cb = blocks(c, block)
    padded = np.zeros((n, cb * block, h, w), x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked_reference(y, block, channels=None):
    n, cb, h, w, b = y.shape
    plain = y.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
    return np.ascontiguousarray(plain[:, :cb * b if channels is None else channels])


def _to_blocked_infer(types, attrs):
    x, = types
    need_rank(x, 4, "to_blocked input")
    if not isinstance(x.shape[1], int):
        raise ShapeError(f"to_blocked: the channel count {x.shape[1]} is not a number")
    return [TensorType(blocked_shape(x.shape, attrs["block"]), x.dtype)]


def _from_blocked_infer(types, attrs):
    y, = types
    need_rank(y, 5, "from_blocked input")
    if y.shape[4] != attrs["block"]:
        raise ShapeError(f"from_blocked: the last axis of {fmt_shape(y.shape)} is not the block {attrs['block']}")
    n, cb, h, w, b = y.shape
    channels = attrs.get("channels")
    if channels is None:
        channels = cb * b
    if not isinstance(channels, int) or blocks(channels, b) != cb:
        raise ShapeError(f"from_blocked: {channels} channels are not what {cb} blocks of {b} hold")
    return [TensorType((n, channels, h, w), y.dtype)]


def _to_blocked_grad(b: Builder, node, gouts):
    return [b.op("from_blocked", gouts[0], block=node.attrs["block"], channels=node.inputs[0].shape[1])]


def _from_blocked_grad(b: Builder, node, gouts):
    return [b.op("to_blocked", gouts[0], block=node.attrs["block"])]


def _conv_blocked_infer(types, attrs):
    block = attrs["block"]
    x = types[0]
    if x.rank == 4:                  # an NCHW input, into the blocked layout
        if attrs["group"] != 1:
            raise ShapeError("conv2d_blocked: an NCHW input takes a dense convolution (group 1)")
        plain = list(types)
    else:
        need_rank(x, 5, "conv2d_blocked input")
        if x.shape[4] != block:
            raise ShapeError(f"conv2d_blocked: the input's last axis is not the block {block}")
        n, cb, h, w, _ = x.shape
        plain = [TensorType((n, cb * block, h, w), x.dtype)] + list(types[1:])
    out, = _conv_infer(plain, attrs)
    o = out.shape[1]
    group = attrs["group"]
    if o % block:
        raise ShapeError(f"conv2d_blocked: {o} output channels are not a multiple of the block {block}")
    c = plain[0].shape[1]
    if group != 1 and not (group == c == o) and ((c // group) % block or (o // group) % block):
        raise ShapeError(f"conv2d_blocked: group {group} is neither depthwise nor of whole blocks per group")
    return [TensorType(blocked_shape(out.shape, block), out.dtype)]


def conv2d_blocked_reference(x, w, *bias, stride, pad, dilation, group, block):
    plain = x if x.ndim == 4 else from_blocked_reference(x, block)
    return to_blocked_reference(conv2d_reference(plain, w, *bias, stride=stride, pad=pad, dilation=dilation,
                                                 group=group), block)


def _pool_blocked_infer(types, attrs):
    x, = types
    need_rank(x, 5, "max_pool2d_blocked input")
    block = attrs["block"]
    if x.shape[4] != block:
        raise ShapeError(f"max_pool2d_blocked: the input's last axis is not the block {block}")
    n, cb, h, w, _ = x.shape
    pool_attrs = {k: v for k, v in attrs.items() if k != "block"}
    out, = _pool_infer([TensorType((n, cb * block, h, w), x.dtype)], pool_attrs)
    return [TensorType(blocked_shape(out.shape, block), out.dtype)]


def max_pool2d_blocked_reference(x, kernel, stride, pad, ceil_mode, block):
    return to_blocked_reference(max_pool2d_reference(from_blocked_reference(x, block), kernel, stride, pad,
                                                     ceil_mode), block)


def _no_flops(ins, outs, attrs):
    return 0          # data movement is not arithmetic


register(OpDef("to_blocked", _to_blocked_infer, to_blocked_reference, _to_blocked_grad, _no_flops,
               batch_rows=True, doc="NCHW -> NCHWc: [N, C, H, W] as [N, C/B, H, W, B]"))
register(OpDef("from_blocked", _from_blocked_infer, from_blocked_reference, _from_blocked_grad, _no_flops,
               batch_rows=True, doc="NCHWc -> NCHW: [N, C/B, H, W, B] as [N, C, H, W]"))
register(OpDef("conv2d_blocked", _conv_blocked_infer, conv2d_blocked_reference, None, _conv_flops,
               batch_rows=True, doc="conv2d (dense or depthwise) on NCHWc input and output, weight OIHW"))
register(OpDef("max_pool2d_blocked", _pool_blocked_infer, max_pool2d_blocked_reference, None, _pool_flops,
               batch_rows=True, doc="max_pool2d on NCHWc input and output"))

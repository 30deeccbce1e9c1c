"""Fused ops that graph passes create (users never write them): one kernel for a chain of ops.

conv2d_max_pool2d: conv2d (with optional bias) whose output feeds only an unpadded, floor-mode
max_pool2d; the kernel pools in the convolution's working layout before the move back to NCHW.
Inference only: a train graph also reads the convolution's output for the pooling gradient, so
the fusion never fires there and the op needs no gradient rule.
"""
from __future__ import annotations

from .base import OpDef, register
from .conv import _conv_flops, _conv_infer, conv2d_reference
from .pool import _pool_flops, _pool_infer, max_pool2d_reference

CONV_KEYS = ("stride", "pad", "dilation", "group")
POOL_PREFIX = "pool_"


def split_attrs(attrs: dict) -> tuple[dict, dict]:
    conv = {k: attrs[k] for k in CONV_KEYS}
    pool = {k[len(POOL_PREFIX):]: v for k, v in attrs.items() if k.startswith(POOL_PREFIX)}
    return conv, pool


def _infer(types, attrs):
    conv, pool = split_attrs(attrs)
    return _pool_infer(_conv_infer(types, conv), pool)


def _reference(*arrays, **attrs):
    conv, pool = split_attrs(attrs)
    return max_pool2d_reference(conv2d_reference(*arrays, **conv), **pool)


def _flops(ins, outs, attrs):
    conv, pool = split_attrs(attrs)
    mid = _conv_infer(ins, conv)
    return _conv_flops(ins, mid, conv) + _pool_flops(mid, outs, pool)


register(OpDef("conv2d_max_pool2d", _infer, _reference, None, _flops, batch_rows=True,
               doc="max_pool2d(conv2d(x, w[, b])) in one kernel; made by the fuse_conv_max_pool pass"))

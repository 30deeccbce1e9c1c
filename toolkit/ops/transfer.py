"""transfer: a value copied from one device's memory to another's (the placement pass's op).

In one process the send and the receive of a device boundary are one copy, so one node stands
for the pair; its kernel runs on the destination. It is impure so that no pass folds it into a
constant (which would lose where the value lives) or merges two of them."""
from __future__ import annotations

from ..ir.graph import TensorType
from .base import Builder, OpDef, register


def _transfer_infer(types, attrs):
    return [TensorType(types[0].shape, types[0].dtype)]


def _transfer_grad(b: Builder, node, gouts):
    return [b.op("transfer", gouts[0], src=node.attrs["dst"], dst=node.attrs["src"])]


register(OpDef("transfer", _transfer_infer, lambda x, src, dst, rng=None: x.copy(), _transfer_grad,
               lambda ins, outs, attrs: 0, pure=False,
               doc="copy a value from device src to device dst"))

"""Point-to-point ops of pipeline-parallel training: a value sent from one rank's stage of the
train graph to another's, on the current communicator (toolkit/distributed/comm.py).

    send(x, *after, peer=r, tag=t)                     sends x to rank r; outputs a token
    recv(*after, peer=r, tag=t, shape=S, dtype=D)      the value rank r sent under tag t

``after``: values the op must follow, each a rank's previous send or receive. The cut
(training/stages.py) chains every rank's sends and receives in one order, the order of the
whole graph before it was cut, so that no pass moves a receive ahead of a send the other rank
waits for (with sends that never block, that order cannot deadlock). A send copies its value
and does not wait for the receiver; a receive blocks until the value is there. In one process
(``Solo``) a send leaves the value in a mailbox under its tag and the receive takes it out, so
the whole cut graph runs in one process, in the reference interpreter too. Both are impure: no
pass folds, merges or drops them. Neither has a gradient: they are inserted after autodiff.
"""
from __future__ import annotations

import numpy as np

from ..distributed.comm import current as _comm
from ..ir.dims import Dim, product
from ..ir.graph import TensorType
from .base import OpDef, register

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "int8": 1,
            "uint8": 1, "bool": 1}


def _send_infer(types, attrs):
    if not types:
        raise ValueError("send takes the value it sends")
    return [TensorType((), "int64")]


def _recv_infer(types, attrs):
    return [TensorType(tuple(attrs["shape"]), attrs["dtype"])]


def _send(x, *after, peer, tag, rng=None):
    _comm().send(peer, tag, np.array(x, copy=True))
    return np.int64(tag)


def _recv(*after, peer, tag, shape, dtype, rng=None):
    # the reference learns the concrete shape from the array that arrives
    return _comm().recv(peer, tag)


def _no_flops(ins, outs, attrs):
    return 0


def sent_bytes(node) -> Dim:
    """The bytes a send or receive moves, symbolic in the batch (a Dim)."""
    v = node.inputs[0] if node.op == "send" else node.outputs[0]
    return product(v.shape) * ITEMSIZE.get(v.dtype, 4)


register(OpDef("send", _send_infer, _send, None, _no_flops, pure=False,
               doc="send a value to another rank (pipeline stages); outputs a token"))
register(OpDef("recv", _recv_infer, _recv, None, _no_flops, pure=False,
               doc="the value another rank sent under a tag (pipeline stages)"))

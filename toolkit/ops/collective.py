"""Collective ops of data-parallel training: sums over the ranks of a job, run on the current
communicator (toolkit/distributed/comm.py; in one process each is the identity).

    allreduce_sum(x)                     the sum of x over the ranks, blocking (BatchNorm's
                                         global statistics, the logged loss); its gradient is
                                         the all-reduced gradient
    allreduce_start(g1..gk, bucket=b)    starts the non-blocking sum of a bucket of gradients
                                         (packed into one buffer); outputs a token
    allreduce_wait(token, g1..gk, bucket=b)  waits for it and gives the summed gradients

Start and wait are two ops so that the graph can place them apart: the start right after the
bucket's last gradient is computed, the wait right before the first update that reads it
(passes/collectives.py), with the rest of the backward pass between them. All three are impure:
no pass folds, merges or drops a collective, which every rank must issue in the same order.
"""
from __future__ import annotations

import numpy as np

from ..distributed.comm import current as _comm
from ..ir.graph import Graph, TensorType, Value
from .base import Builder, OpDef, register

# the [N] input of a data-parallel train graph that says which rows of the batch are real
ROW_MASK = "@dist_row_mask"


def row_mask(graph: Graph, x: Value) -> Value:
    """The [N] input that says which rows of the batch are real (1) or a placeholder (0): a rank
    left without rows by a short last batch runs one placeholder row (BatchNorm's global
    statistics leave it out)."""
    if ROW_MASK not in graph.inputs:
        graph.inputs[ROW_MASK] = Value(TensorType((x.shape[0],), x.dtype), name=ROW_MASK)
    return graph.inputs[ROW_MASK]


def _same(types, attrs):
    return [TensorType(types[0].shape, types[0].dtype)]


def _allreduce_sum(x, rng=None):
    return _comm().allreduce(np.asarray(x))


def _allreduce_sum_grad(b: Builder, node, gouts):
    # y = sum over ranks of x_r, and the objective is the sum of the ranks' contributions: the
    # gradient reaching x_r is the sum over ranks of each one's gradient at y
    return [b.op("allreduce_sum", gouts[0])]


def _start_infer(types, attrs):
    if not types or len({t.dtype for t in types}) != 1:
        raise ValueError("allreduce_start takes one or more gradients of one dtype")
    return [TensorType((), "int64")]


def pack(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a).reshape(-1) for a in arrays])


def unpack(flat: np.ndarray, shapes) -> list[np.ndarray]:
    out, offset = [], 0
    for shape in shapes:
        n = int(np.prod(shape, dtype=np.int64))
        out.append(flat[offset: offset + n].reshape(shape))
        offset += n
    return out


def _allreduce_start(*grads, bucket, rng=None):
    _comm().start_allreduce(bucket, pack(grads))
    return np.int64(bucket)


def _wait_infer(types, attrs):
    token, *grads = types
    if token.shape != () or token.dtype != "int64":
        raise ValueError("allreduce_wait's first input is the token of its allreduce_start")
    return [TensorType(g.shape, g.dtype) for g in grads]


def _allreduce_wait(token, *grads, bucket, overlap=True, rng=None):   # overlap: where a pass puts it
    return tuple(unpack(_comm().wait_allreduce(bucket), [np.shape(g) for g in grads]))


def _bytes_moved(ins, outs, attrs):
    return 0


register(OpDef("allreduce_sum", _same, _allreduce_sum, _allreduce_sum_grad, _bytes_moved, pure=False,
               doc="the sum over the job's ranks (blocking)"))
register(OpDef("allreduce_start", _start_infer, _allreduce_start, None, _bytes_moved, pure=False,
               doc="start the sum over ranks of a bucket of gradients; outputs a token"))
register(OpDef("allreduce_wait", _wait_infer, _allreduce_wait, None, _bytes_moved, pure=False,
               doc="wait for a bucket's sum; outputs the summed gradients"))

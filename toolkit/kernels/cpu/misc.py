"""CPU kernels for data movement, softmax and the loss/metric ops.

Small ops whose cost is negligible (the scalar losses, constants) run their op's reference
implementation and copy the result out; they are registered here explicitly, one by one.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_kernel
from ...ops.base import get_op
from ...ops.indexing import check_indices
from ...ops.precision import all_finite, round_precision


def _reference_kernel(ctx):
    reference = get_op(ctx.node.op).reference
    attrs = ctx.attrs

    def run(ins, outs):
        np.copyto(outs[0], reference(*ins, **attrs))
    return run


for _op in ("scalar", "constant", "nll_loss", "nll_loss_grad", "accuracy"):
    register_kernel(_op, "cpu")(_reference_kernel)


@register_kernel("iota", "cpu")
def iota_cpu(ctx):
    value = get_op("iota").reference(ctx.out_shapes[0], ctx.attrs["axis"], ctx.dtype)

    def run(ins, outs):
        np.copyto(outs[0], value)
    return run


@register_kernel("all_finite", "cpu")
def all_finite_kernel(ctx):
    def run(ins, outs):
        all_finite(*ins, out=outs[0])
    return run


@register_kernel("round_precision", "cpu", inplace=True)
def round_precision_kernel(ctx):
    dtype = ctx.attrs["dtype"]

    def run(ins, outs):
        round_precision(ins[0], dtype, out=outs[0])
    return run


@register_kernel("reshape", "cpu")
def reshape_cpu(ctx):
    """Only used when the planner cannot make the output a view of the input."""
    def run(ins, outs):
        np.copyto(outs[0], ins[0].reshape(outs[0].shape))
    return run


@register_kernel("transpose", "cpu")
def transpose_cpu(ctx):
    perm = tuple(ctx.attrs["perm"])

    def run(ins, outs):
        np.copyto(outs[0], ins[0].transpose(perm))
    return run


@register_kernel("concat", "cpu")
def concat_cpu(ctx):
    axis = ctx.attrs["axis"] % len(ctx.out_shapes[0])

    def run(ins, outs):
        np.concatenate(ins, axis=axis, out=outs[0])
    return run


def _axis_index(rank, axis, start, stop):
    index = [slice(None)] * rank
    index[axis % rank] = slice(start, stop)
    return tuple(index)


@register_kernel("slice", "cpu")
def slice_cpu(ctx):
    index = _axis_index(len(ctx.in_shapes[0]), ctx.attrs["axis"], ctx.attrs["start"], ctx.attrs["stop"])

    def run(ins, outs):
        np.copyto(outs[0], ins[0][index])
    return run


@register_kernel("pad_axis", "cpu")
def pad_axis_cpu(ctx):
    rank = len(ctx.in_shapes[0])
    axis, before = ctx.attrs["axis"] % rank, ctx.attrs["before"]
    index = _axis_index(rank, axis, before, before + ctx.in_shapes[0][axis])

    def run(ins, outs):
        outs[0].fill(0)
        outs[0][index] = ins[0]
    return run


@register_kernel("softmax", "cpu", inplace=True)
def softmax_cpu(ctx):
    axis = ctx.attrs["axis"] % len(ctx.in_shapes[0])
    reduced = list(ctx.in_shapes[0])
    reduced[axis] = 1
    scratch = np.empty(reduced, ctx.dtype)

    def run(ins, outs):
        x, y = ins[0], outs[0]
        np.max(x, axis=axis, keepdims=True, out=scratch)
        np.subtract(x, scratch, out=y)
        np.exp(y, out=y)
        np.sum(y, axis=axis, keepdims=True, out=scratch)
        np.divide(y, scratch, out=y)
    return run


@register_kernel("log_softmax", "cpu", inplace=True)
def log_softmax_cpu(ctx):
    axis = ctx.attrs["axis"] % len(ctx.in_shapes[0])
    reduced = list(ctx.in_shapes[0])
    reduced[axis] = 1
    scratch = np.empty(reduced, ctx.dtype)
    exps = np.empty(ctx.in_shapes[0], ctx.dtype)

    def run(ins, outs):
        x, y = ins[0], outs[0]
        np.max(x, axis=axis, keepdims=True, out=scratch)
        np.subtract(x, scratch, out=y)
        np.exp(y, out=exps)
        np.sum(exps, axis=axis, keepdims=True, out=scratch)
        np.log(scratch, out=scratch)
        np.subtract(y, scratch, out=y)
    return run


@register_kernel("transfer", "cpu")
def transfer_cpu(ctx):
    """Into host memory: from another cpu:N (a copy) or from a GPU (a device-to-host copy)."""
    def run(ins, outs):
        if isinstance(ins[0], np.ndarray):
            np.copyto(outs[0], ins[0])
        else:
            ins[0].get(out=outs[0])
    return run


@register_kernel("embedding", "cpu")
def embedding_cpu(ctx):
    layer = ctx.attrs["layer"]

    def run(ins, outs):
        table, index = ins
        check_indices(index, table.shape[0], layer)
        np.take(table, index, axis=0, out=outs[0])
    return run


@register_kernel("embedding_grad", "cpu")
def embedding_grad_cpu(ctx):
    def run(ins, outs):
        g, index = ins
        outs[0].fill(0)
        np.add.at(outs[0], index.reshape(-1), g.reshape(-1, g.shape[-1]))
    return run


register_kernel("topk", "cpu")(_reference_kernel)


@register_kernel("matmul_bias_gradient", "cpu", fusion_pays=False)
def matmul_bias_gradient_cpu(ctx):
    """The fused op's plain form (a graph fused for a GPU run here): the two ops it stands for.
    The fusion pass never makes it for the CPU, where the generated kernels run those two."""
    keepdims = ctx.attrs["keepdims"]

    def run(ins, outs):
        g, x = ins
        np.matmul(g.T, x, out=outs[0])
        np.sum(g, axis=0, keepdims=keepdims, out=outs[1])
    return run

"""GPU kernels written as array programs over CuPy: convolution, pooling, the losses, accuracy
and dropout.

Convolution and pooling are the CPU kernels' own builders (kernels/cpu/conv.py, pool.py) given
CuPy as their array module: im2col by strided-window copies, one cuBLAS GEMM per group, col2im
by scatter-adds over each kernel offset's strided slice. They are the fallbacks of dnn.py's
cuDNN convolutions and of pooling.py's CUDA pooling kernels (which take float16, float32 and
float64; quantized max pooling stays here). The losses and accuracy never leave
the device: a label out of range makes the loss NaN (which the trainer reports) instead of
raising, since raising would read a flag back to the host every step.

Dropout draws its mask on the device from a counter-based hash (murmur3's 32-bit finaliser over
the element index plus a per-call key): the key is one integer drawn from the plan's host
generator per call, so runs are reproducible and resume exactly, as on the CPU, but the masks
are not the CPU's (different generators), and GPU and CPU dropout nets agree in distribution
only.
"""
from __future__ import annotations

import math

import numpy as np

from ...backend.devices import HostUpload, gpu_module, to_host
from ...backend.registry import register_kernel
from ...ops.indexing import check_indices
from ..cpu.conv import CONV_KERNELS
from ..cpu.layout import LAYOUT_KERNELS
from ..cpu.pool import POOL_KERNELS
from . import blas
from .dispatched import half_accumulator

cp = gpu_module()


class _CupyWithOwnGemm:
    """CuPy as the builders' array module, with their GEMMs on our cuBLAS handle (blas.py),
    which a CUDA graph can capture; every other name is CuPy's own."""

    def __getattr__(self, name):
        return getattr(cp, name)

    @staticmethod
    def matmul(a, b, out):
        blas.matmul(a, b, out)
        return out


GPU_ARRAYS = _CupyWithOwnGemm()


def _over_cupy(builder):
    def factory(ctx):
        return builder(ctx, GPU_ARRAYS)
    factory.__name__ = f"{builder.__name__}_gpu"
    return factory


for _op, _builder in {**CONV_KERNELS, **POOL_KERNELS}.items():
    register_kernel(_op, "gpu")(_over_cupy(_builder))
# the layout pass never blocks a GPU's convolutions (cuDNN picks its own layouts); these run a
# graph blocked for the host on a GPU all the same
for _op, _builder in LAYOUT_KERNELS.items():
    register_kernel(_op, "gpu", fusion_pays=False)(_over_cupy(_builder))


def _class_last(scores, label, axis):
    """Scores as [M, C] and labels as [M] (a copy of the scores only when ``axis`` is not last)."""
    moved = cp.moveaxis(scores, axis, -1)
    return moved.reshape(-1, moved.shape[-1]), label.reshape(-1)


class _Labels:
    """Which positions count (not ignored), which labels are out of range, and safe indices."""

    def __init__(self, label, classes, ignore_index):
        self.keep = (label != ignore_index) if ignore_index is not None else cp.ones(label.shape, bool)
        self.bad = self.keep & ((label < 0) | (label >= classes))
        self.safe = cp.where(self.keep & ~self.bad, label, 0)


@register_kernel("nll_loss", "gpu")
def nll_loss_gpu(ctx):
    axis, ignore = ctx.attrs["axis"] % len(ctx.in_shapes[0]), ctx.attrs["ignore_index"]
    acc = np.dtype(half_accumulator(ctx.dtype) or ctx.dtype)

    def run(ins, outs):
        flat, lab = _class_last(ins[0], ins[1], axis)
        labels = _Labels(lab, flat.shape[1], ignore)
        picked = cp.take_along_axis(flat, labels.safe[:, None], 1)[:, 0]
        total = cp.sum(cp.where(labels.keep, picked, 0), dtype=acc)
        with np.errstate(invalid="ignore", divide="ignore"):     # all ignored: NaN, as the CPU
            loss = -total / cp.sum(labels.keep, dtype=acc)
        outs[0][...] = cp.where(cp.any(labels.bad), acc.type(np.nan), loss)
    return run


@register_kernel("nll_loss_grad", "gpu")
def nll_loss_grad_gpu(ctx):
    _g, logp_shape, _label = ctx.in_shapes
    axis, ignore = ctx.attrs["axis"] % len(logp_shape), ctx.attrs["ignore_index"]
    moved_shape = tuple(np.moveaxis(np.empty(logp_shape, np.int8), axis, -1).shape)
    moved = cp.empty(moved_shape, ctx.dtype)
    flat = moved.reshape(-1, moved_shape[-1])
    rows = cp.arange(flat.shape[0])

    def run(ins, outs):
        g, _logp, label = ins
        labels = _Labels(label.reshape(-1), flat.shape[1], ignore)
        share = -g / cp.maximum(cp.sum(labels.keep, dtype=g.dtype), 1)
        moved.fill(0)
        flat[rows, labels.safe] = cp.where(labels.keep, share, 0).astype(ctx.dtype)
        cp.copyto(outs[0], cp.moveaxis(moved, -1, axis))
    return run


@register_kernel("accuracy", "gpu")
def accuracy_gpu(ctx):
    axis, top_k = ctx.attrs["axis"] % len(ctx.in_shapes[0]), ctx.attrs["top_k"]
    acc = np.dtype(half_accumulator(ctx.dtype) or ctx.dtype)

    def run(ins, outs):
        flat, lab = _class_last(ins[0], ins[1], axis)
        true_score = cp.take_along_axis(flat, cp.clip(lab, 0, flat.shape[1] - 1)[:, None], 1)
        # correct when fewer than top_k classes score strictly higher than the true class
        higher = cp.sum(flat > true_score, axis=1)
        outs[0][...] = cp.mean(higher < top_k, dtype=acc)
    return run


# murmur3's 32-bit finaliser constants, and the golden-ratio step that spreads the per-call key
_FMIX = (np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35))
_GOLDEN = 0x9E3779B9


def dropout_keep_bits(index, offset, hashed, scratch) -> None:
    """``hashed`` = fmix32(index + offset) elementwise, in uint32 arithmetic (wrapping), where
    ``offset`` (a device array of one element) is the call's key times the golden-ratio step."""
    cp.add(index, offset, out=hashed)
    for shift, multiplier in ((16, _FMIX[0]), (13, _FMIX[1]), (16, None)):
        cp.right_shift(hashed, np.uint32(shift), out=scratch)
        cp.bitwise_xor(hashed, scratch, out=hashed)
        if multiplier is not None:
            cp.multiply(hashed, multiplier, out=hashed)


@register_kernel("dropout_mask", "gpu")
def dropout_mask_gpu(ctx):
    shape = tuple(ctx.out_shapes[0])
    size = int(np.prod(shape, dtype=np.int64))
    if size >= 1 << 32:
        raise ValueError(f"dropout over {size} elements: the GPU mask's counter is 32-bit")
    ratio = float(ctx.attrs["ratio"])
    scale = np.dtype(ctx.dtype).type(1.0 / (1.0 - ratio))
    # keep when the top 24 bits, as a fraction of 2^24, are >= ratio (as uniform >= ratio on the CPU)
    threshold = np.uint32(math.ceil(ratio * (1 << 24)))
    index = cp.arange(size, dtype=cp.uint32).reshape(shape)
    hashed, scratch = cp.empty(shape, cp.uint32), cp.empty(shape, cp.uint32)
    keep = cp.empty(shape, bool)
    rng = ctx.runtime.rng
    # the call's key, spread by the golden-ratio step, lives in device memory: a captured run
    # reads this call's key there, written before the launch (uploads are queued, never waited on)
    offset = cp.zeros((1,), cp.uint32)
    upload = HostUpload(offset)

    def before_run():
        key = int(rng.integers(0, 1 << 32))          # host-side: no device synchronisation
        upload(np.array([(key * _GOLDEN) & 0xFFFFFFFF], np.uint32))

    def run(ins, outs):
        dropout_keep_bits(index, offset, hashed, scratch)
        cp.right_shift(hashed, np.uint32(8), out=scratch)
        cp.greater_equal(scratch, threshold, out=keep)
        cp.multiply(keep, scale, out=outs[0])
    run.before_run = before_run
    return run


@register_kernel("embedding", "gpu", host_sync="checks its indices against the table on the host")
def embedding_gpu(ctx):
    """The rows by cp.take. The range check reads one flag back to the host per call: an index
    outside the table is the user's data, and must stop the run naming the layer, as on the CPU."""
    layer = ctx.attrs["layer"]

    def run(ins, outs):
        table, index = ins
        if bool(cp.any((index < 0) | (index >= table.shape[0]))):
            check_indices(to_host(index), table.shape[0], layer)
        cp.take(table, index, axis=0, out=outs[0])
    return run


@register_kernel("embedding_grad", "gpu")
def embedding_grad_gpu(ctx):
    scatter_add = getattr(cp.add, "at", None)   # CuPy 13 on (and the numpy stand-in for CuPy)
    if scatter_add is None:
        from cupyx import scatter_add  # older CuPy

    def run(ins, outs):
        g, index = ins
        outs[0].fill(0)
        scatter_add(outs[0], index.reshape(-1), g.reshape(-1, g.shape[-1]))
    return run


@register_kernel("topk", "gpu")
def topk_gpu(ctx):
    """A stable descending sort along the axis (CuPy's argsort is stable), the first k kept."""
    axis, k, values = ctx.attrs["axis"], ctx.attrs["k"], ctx.attrs["values"]

    def run(ins, outs):
        x = ins[0]
        order = cp.argsort(-x, axis=axis, kind="stable")
        picked = cp.take(order, cp.arange(k), axis=axis)
        outs[0][...] = cp.take_along_axis(x, picked, axis) if values else picked.astype(x.dtype)
    return run

"""Loss layers (scalar tops, the train objective) and Accuracy."""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

from schemas.base import LayerBase, PositiveInt
from toolkit.ir.dims import product

from .registry import LayerError, layer


class SoftmaxWithLossParams(LayerBase):
    """``normalization`` (Caffe's): the summed loss divided by the labels not ignored (valid,
    the default), by every label (full), by the batch (batch_size: the dimensions before axis), or
    not at all (none)."""
    type: Literal["SoftmaxWithLoss"]
    axis: int = 1
    ignore_label: Optional[int] = None
    normalization: Literal["valid", "full", "batch_size", "none"] = "valid"
    BOTTOMS: ClassVar = (2, 2)


def _class_axis(p, scores, ctx) -> int:
    if not -scores.rank <= p.axis < scores.rank:
        raise LayerError(f"axis {p.axis} is out of range for the scores {ctx.fmt(scores)}", "axis")
    return p.axis % scores.rank


def _label_like(label, scores, axis: int, ctx):
    """The label in the scores' shape without the class axis when it differs from that only by
    dimensions of 1 (Caffe counts labels, not shapes: SqueezeNet's [N] labels against scores
    [N, 1000, 1, 1]); otherwise as it is, for the op's own check to name both shapes."""
    expected = tuple(scores.shape[:axis] + scores.shape[axis + 1:])
    if tuple(label.shape) == expected:
        return label
    squeezed = [d for d in label.shape if d != 1]
    if squeezed == [d for d in expected if d != 1]:
        return ctx.b.reshape(label, expected)
    return label


@layer(SoftmaxWithLossParams)
def lower_softmax_with_loss(p: SoftmaxWithLossParams, ctx, bottoms):
    logits, label = bottoms
    axis = _class_axis(p, logits, ctx)
    label = _label_like(label, logits, axis, ctx)
    b = ctx.b
    logp = b.op("log_softmax", logits, axis=axis)
    real = ctx.real_mask(label)
    if real is not None:
        real = b.op("broadcast_to", real, shape=tuple(label.shape))
    ignore = p.ignore_label
    if real is not None:
        # a padded T (buckets over T): the padding's labels are ignored, so the loss is over real
        # positions only (PyTorch's loss over a packed sequence's tokens)
        ignore = -1 if ignore is None else ignore
        label = b.op("select", real, label, b.scalar(float(ignore), label.dtype))
    loss = b.op("nll_loss", logp, label, axis=axis, ignore_index=ignore)
    if p.normalization == "valid" or (p.normalization == "full" and ignore is None):
        return [loss]
    # the mean over valid labels times their count is the sum; then Caffe's normaliser
    ones = _ones_like(label, logits.dtype, ctx) if real is None else real
    valid = ones if ignore is None else b.mul(ones, _not_equal(label, ignore, logits.dtype, ctx))
    total = b.mul(loss, b.op("reduce_sum", valid, axes=tuple(range(valid.rank)), keepdims=False))
    if p.normalization == "none":
        return [total]
    count = b.op("reduce_sum", ones, axes=tuple(range(ones.rank)), keepdims=False)
    if p.normalization == "batch_size":
        inner = product(label.shape[axis:])
        if not isinstance(inner, int):
            raise LayerError(f"normalization batch_size needs the label's axes from {axis} fixed, got "
                             f"{ctx.fmt(label)}", "normalization")
        count = b.mul(count, b.scalar(1.0 / inner, logits.dtype))
    return [b.div(total, count)]


def _ones_like(label, dtype, ctx):
    """Ones of the label's shape, in ``dtype`` (a count of its positions when summed)."""
    b = ctx.b
    return b.add(b.mul(b.op("cast", label, dtype=dtype), b.scalar(0.0, dtype)), b.scalar(1.0, dtype))


def _not_equal(label, value: int, dtype, ctx):
    """1 where the label is not ``value``, else 0 (no gradient: labels have none)."""
    b = ctx.b
    as_float = b.op("cast", label, dtype=dtype)
    v = b.scalar(float(value), dtype)
    equal = b.mul(b.op("ge_mask", as_float, v), b.op("ge_mask", v, as_float))
    return b.sub(b.scalar(1.0, dtype), equal)


class EuclideanLossParams(LayerBase):
    type: Literal["EuclideanLoss"]
    BOTTOMS: ClassVar = (2, 2)


@layer(EuclideanLossParams)
def lower_euclidean_loss(p: EuclideanLossParams, ctx, bottoms):
    a, t = bottoms
    if tuple(a.shape) != tuple(t.shape):
        raise LayerError(f"EuclideanLoss needs bottoms of one shape, got {ctx.fmt(a)} and {ctx.fmt(t)}", "bottom")
    b = ctx.b
    sq = b.op("square", b.sub(a, t))
    if a.rank > 1:
        sq = b.reduce_sum(sq, range(1, a.rank))
    # sum((a - t)^2) / (2 N): the mean over the batch of each row's sum, halved
    return [b.scale(b.op("reduce_mean", sq, axes=(0,), keepdims=False), 0.5)]


class SigmoidCrossEntropyLossParams(LayerBase):
    type: Literal["SigmoidCrossEntropyLoss"]
    BOTTOMS: ClassVar = (2, 2)


@layer(SigmoidCrossEntropyLossParams)
def lower_sigmoid_cross_entropy_loss(p: SigmoidCrossEntropyLossParams, ctx, bottoms):
    x, t = bottoms
    if tuple(x.shape) != tuple(t.shape):
        raise LayerError(f"SigmoidCrossEntropyLoss needs bottoms of one shape, got {ctx.fmt(x)} and "
                         f"{ctx.fmt(t)}", "bottom")
    if t.dtype != x.dtype:
        t = ctx.b.op("cast", t, dtype=x.dtype)
    per_element = ctx.b.op("sigmoid_cross_entropy", x, t)
    return [ctx.b.op("reduce_mean", per_element, axes=tuple(range(x.rank)), keepdims=False)]


class AccuracyParams(LayerBase):
    """``ignore_label``: positions with that label count neither as right nor as wrong (Caffe)."""
    type: Literal["Accuracy"]
    top_k: PositiveInt = 1
    axis: int = 1
    ignore_label: Optional[int] = None
    BOTTOMS: ClassVar = (2, 2)


@layer(AccuracyParams)
def lower_accuracy(p: AccuracyParams, ctx, bottoms):
    scores, label = bottoms
    axis = _class_axis(p, scores, ctx)
    label = _label_like(label, scores, axis, ctx)
    if p.ignore_label is None:
        return [ctx.b.op("accuracy", scores, label, axis=axis, top_k=p.top_k)]
    # hits among the top_k indices, counted over the positions whose label is not ignored
    b = ctx.b
    dtype = scores.dtype
    top = b.op("topk", scores, axis=axis, k=p.top_k, values=False)
    as_float = b.op("cast", label, dtype=dtype)
    at_axis = b.reshape(as_float, tuple(label.shape[:axis]) + (1,) + tuple(label.shape[axis:]))
    same = b.mul(b.op("ge_mask", top, at_axis), b.op("ge_mask", at_axis, top))
    hit = b.op("reduce_sum", same, axes=(axis,), keepdims=False)
    valid = b.mul(_ones_like(label, dtype, ctx), _not_equal(label, p.ignore_label, dtype, ctx))
    everything = tuple(range(valid.rank))
    right = b.op("reduce_sum", b.mul(hit, valid), axes=everything, keepdims=False)
    return [b.div(right, b.op("reduce_sum", valid, axes=everything, keepdims=False))]



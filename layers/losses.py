"""Loss layers (scalar tops, the train objective) and Accuracy."""
from __future__ import annotations

from typing import ClassVar, Literal, Optional


from schemas.base import LayerBase, PositiveInt

from .registry import LayerError, layer


class SoftmaxWithLossParams(LayerBase):
    type: Literal["SoftmaxWithLoss"]
    axis: int = 1
    ignore_label: Optional[int] = None
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
    logp = ctx.b.op("log_softmax", logits, axis=axis)
    return [ctx.b.op("nll_loss", logp, label, axis=axis, ignore_index=p.ignore_label)]


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
    type: Literal["Accuracy"]
    top_k: PositiveInt = 1
    axis: int = 1
    BOTTOMS: ClassVar = (2, 2)


@layer(AccuracyParams)
def lower_accuracy(p: AccuracyParams, ctx, bottoms):
    scores, label = bottoms
    axis = _class_axis(p, scores, ctx)
    return [ctx.b.op("accuracy", scores, _label_like(label, scores, axis, ctx), axis=axis, top_k=p.top_k)]



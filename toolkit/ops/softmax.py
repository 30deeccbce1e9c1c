"""softmax / log_softmax along an axis, the negative log-likelihood loss, and top-k accuracy.

Labels are integer class indices along ``axis`` of the scores; ``ignore_index`` (or None) marks
positions left out of the mean, as PyTorch's ``ignore_index`` and Caffe's ``ignore_label``.
"""
from __future__ import annotations

import numpy as np

from ..errors import UserError
from ..ir.graph import INT_DTYPES, TensorType
from .base import Builder, OpDef, ShapeError, register
from .rules import fmt_shape, need_float, norm_axis


def _softmax_infer(types, attrs):
    need_float(types[0])
    norm_axis(attrs["axis"], types[0].rank)
    return [types[0]]


def softmax_reference(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax_reference(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _softmax_grad(b: Builder, node, gouts):
    g, = gouts
    y = node.outputs[0]
    dot = b.reduce_sum(b.mul(g, y), [node.attrs["axis"]], keepdims=True)
    return [b.mul(y, b.sub(g, dot))]                         # y * (g - sum(g y))


def _log_softmax_grad(b: Builder, node, gouts):
    g, = gouts
    y = node.outputs[0]
    total = b.reduce_sum(g, [node.attrs["axis"]], keepdims=True)
    return [b.sub(g, b.mul(b.op("exp", y), total))]          # g - softmax * sum(g)


def _softmax_flops(ins, outs, attrs):
    return 5 * outs[0].numel


register(OpDef("softmax", _softmax_infer, softmax_reference, _softmax_grad, _softmax_flops, batch_rows=True))
register(OpDef("log_softmax", _softmax_infer, log_softmax_reference, _log_softmax_grad, _softmax_flops,
               batch_rows=True))


def check_label(scores, label, axis) -> int:
    """Validate a [N, C, d...] score / [N, d...] label pair; returns the normalised class axis."""
    need_float(scores, "scores")
    axis = norm_axis(axis, scores.rank)
    if label.dtype not in INT_DTYPES:
        raise ShapeError(f"label must be an integer tensor (int32 or int64), got {label.dtype}")
    expected = scores.shape[:axis] + scores.shape[axis + 1:]
    if tuple(label.shape) != tuple(expected):
        raise ShapeError(f"label shape {fmt_shape(label.shape)} does not match scores "
                         f"{fmt_shape(scores.shape)} without axis {axis}: expected {fmt_shape(expected)}")
    return axis


def _scalar_loss_infer(types, attrs):
    check_label(types[0], types[1], attrs["axis"])
    return [TensorType((), types[0].dtype)]


def _class_last(scores, label, axis):
    """Scores as [M, C] and labels as [M]."""
    moved = np.moveaxis(scores, axis, -1)
    return moved.reshape(-1, moved.shape[-1]), label.reshape(-1)


def _nll_mask(label, num_classes, ignore_index):
    keep = np.ones(label.shape, dtype=bool) if ignore_index is None else label != ignore_index
    bad = keep & ((label < 0) | (label >= num_classes))
    if bad.any():
        raise UserError(f"bad label in the data: label {int(label[bad][0])} is out of range for {num_classes} classes "
                        "(labels count from 0 to the number of classes - 1)")
    return keep


def nll_loss_reference(logp, label, axis, ignore_index):
    flat, lab = _class_last(logp, label, axis)
    keep = _nll_mask(lab, flat.shape[1], ignore_index)
    picked = flat[np.nonzero(keep)[0], lab[keep]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(-picked.sum() / keep.sum(), dtype=logp.dtype)


def nll_loss_grad_reference(g, logp, label, axis, ignore_index):
    moved = np.zeros(np.moveaxis(logp, axis, -1).shape, dtype=logp.dtype)
    flat = moved.reshape(-1, moved.shape[-1])
    lab = label.reshape(-1)
    keep = _nll_mask(lab, flat.shape[1], ignore_index)
    rows = np.nonzero(keep)[0]
    flat[rows, lab[keep]] = -g / max(len(rows), 1)
    return np.moveaxis(moved, -1, axis)


def _nll_grad(b: Builder, node, gouts):
    logp, label = node.inputs
    gx = b.op("nll_loss_grad", gouts[0], logp, label, **node.attrs)
    return [gx, None]


register(OpDef("nll_loss", _scalar_loss_infer, nll_loss_reference, _nll_grad,
               flops=lambda i, o, a: i[1].numel,
               doc="-mean over non-ignored positions of logp[label] (NaN when all are ignored)"))
register(OpDef("nll_loss_grad", lambda types, attrs: [types[1]], nll_loss_grad_reference,
               flops=lambda i, o, a: i[2].numel))


def accuracy_reference(scores, label, axis, top_k):
    flat, lab = _class_last(scores, label, axis)
    true_score = flat[np.arange(len(lab)), lab]
    # correct when fewer than top_k classes score strictly higher than the true class
    higher = (flat > true_score[:, None]).sum(axis=1)
    return np.asarray((higher < top_k).mean(), dtype=scores.dtype)


def _accuracy_infer(types, attrs):
    check_label(types[0], types[1], attrs["axis"])
    return [TensorType((), types[0].dtype)]


register(OpDef("accuracy", _accuracy_infer, accuracy_reference,
               flops=lambda i, o, a: i[0].numel,
               doc="fraction of positions whose label is within the top_k scores"))

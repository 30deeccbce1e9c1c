"""Caffe's losses and Accuracy: SoftmaxWithLoss, EuclideanLoss, SigmoidCrossEntropyLoss,
MultinomialLogisticLoss, InfogainLoss (its matrix read from the file it names), HingeLoss,
ContrastiveLoss and Accuracy."""
from __future__ import annotations

import math

from .base import converts, copy_set, enum_name, sub_message
from .blobs import read_blob_file


@converts("SoftmaxWithLoss")
def _softmax_loss(layer, out, ctx):
    axis = sub_message(layer, "softmax_param").value("axis", 1)
    if axis != 1:
        out["axis"] = axis
    loss = sub_message(layer, "loss_param")
    if loss.get("ignore_label") is not None:
        out["ignore_label"] = loss.value("ignore_label")
    normalization = enum_name(loss.value("normalization", "VALID"))
    if loss.get("normalization") is None and loss.get("normalize") is not None \
            and str(loss.value("normalize")) == "false":
        normalization = "BATCH_SIZE"             # Caffe's old normalize: false
    if normalization not in ("VALID", "FULL", "BATCH_SIZE", "NONE"):
        ctx.error(f"loss_param normalization {normalization} is not Caffe's", loss.get("normalization").loc)
    elif normalization != "VALID":
        out["normalization"] = normalization.lower()
    return [out]


@converts("EuclideanLoss", "SigmoidCrossEntropyLoss", "MultinomialLogisticLoss")
def _plain_loss(layer, out, ctx):
    return [out]


@converts("InfogainLoss")
def _infogain_loss(layer, out, ctx):
    p = sub_message(layer, "infogain_loss_param")
    source = p.get("source")
    if len(layer.values("bottom")) < 3 and source is not None:
        # H from a file: the layer's own fixed weight NAME.infogain, written with the weights
        matrix, here = read_blob_file(str(source.value), source.loc, ctx, "infogain_loss_param.source")
        key = f"{out['name']}.infogain"
        if matrix is not None:
            side = math.isqrt(matrix.size)
            if side * side != matrix.size:
                ctx.error(f"infogain_loss_param.source {source.value}: the infogain matrix must be square, "
                          f"got shape {list(matrix.shape)}", source.loc)
            else:
                ctx.fixed[key] = matrix.reshape(side, side)
        elif not here:
            ctx.notes.append(f"infogain_loss_param.source {source.value} is not here: '{key}' starts as the identity "
                             "(SoftmaxWithLoss); put the matrix in the weights file under that key")
    elif len(layer.values("bottom")) < 3:
        ctx.error("InfogainLoss: Caffe needs the infogain matrix as a file (infogain_loss_param.source) or a third "
                  "bottom", layer.get("type").loc)
    if p.value("axis", 1) != 1:
        out["axis"] = p.value("axis")
    return [out]


@converts("HingeLoss")
def _hinge_loss(layer, out, ctx):
    norm = enum_name(sub_message(layer, "hinge_loss_param").value("norm", "L1"))
    if norm == "L2":
        out["norm"] = "l2"
    return [out]


@converts("ContrastiveLoss")
def _contrastive_loss(layer, out, ctx):
    p = sub_message(layer, "contrastive_loss_param")
    copy_set(p, out, (("margin", 1.0),))
    if str(p.value("legacy_version", "false")) == "true":
        out["legacy_version"] = True
    return [out]


@converts("Accuracy")
def _accuracy(layer, out, ctx):
    p = sub_message(layer, "accuracy_param")
    copy_set(p, out, (("top_k", 1), ("axis", 1)))
    if p.get("ignore_label") is not None:
        out["ignore_label"] = p.value("ignore_label")
    return [out]

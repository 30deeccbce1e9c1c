"""Caffe's normalisations: BatchNorm (and its blobs: the running statistics), LRN, MVN and
Softmax."""
from __future__ import annotations

from .base import WEIGHTS, converts, enum_name, sub_message


@converts("BatchNorm")
def _batchnorm(layer, out, ctx):
    """Caffe's BatchNorm normalises only (its Scale layer is the affine part); its moving average
    keeps moving_average_fraction of the old value, so PyTorch's momentum is 1 minus that."""
    p = sub_message(layer, "batch_norm_param")
    out["affine"] = False
    fraction = p.value("moving_average_fraction", 0.999)
    out["momentum"] = round(1.0 - fraction, 12)
    if p.value("eps", 1e-5) != 1e-5:
        out["eps"] = p.value("eps")
    if p.get("use_global_stats") is not None:
        out["use_global_stats"] = str(p.value("use_global_stats")) == "true"
    return [out]


def _batchnorm_weights(name, arrays):
    """mean, variance, and the scale factor they were accumulated under (Caffe divides by it)."""
    factor = float(arrays[2].reshape(-1)[0]) if len(arrays) > 2 else 1.0
    scale = 0.0 if factor == 0 else 1.0 / factor
    return {f"{name}.running_mean": arrays[0].reshape(-1) * scale,
            f"{name}.running_var": arrays[1].reshape(-1) * scale}


WEIGHTS["BatchNorm"] = _batchnorm_weights


@converts("LRN")
def _lrn(layer, out, ctx):
    p = sub_message(layer, "lrn_param")
    out.update(local_size=p.value("local_size", 5), alpha=p.value("alpha", 1.0), beta=p.value("beta", 0.75),
               k=p.value("k", 1.0))
    if enum_name(p.value("norm_region", "ACROSS_CHANNELS")) == "WITHIN_CHANNEL":
        out["norm_region"] = "within_channel"
    return [out]


@converts("MVN")
def _mvn(layer, out, ctx):
    p = sub_message(layer, "mvn_param")
    if str(p.value("normalize_variance", "true")) == "false":
        out["normalize_variance"] = False
    if str(p.value("across_channels", "false")) == "true":
        out["across_channels"] = True
    if p.get("eps") is not None:
        out["eps"] = p.value("eps")
    return [out]


@converts("Softmax")
def _softmax(layer, out, ctx):
    axis = sub_message(layer, "softmax_param").value("axis", 1)
    if axis != 1:
        out["axis"] = axis
    return [out]

"""Caffe's activations, one input to one output: ReLU, Sigmoid, TanH, AbsVal, BNLL, Exp, Log,
Dropout, Threshold, Clip, ELU, Power and Swish."""
from __future__ import annotations

from .base import converts, converts_by_copying, copy_set, sub_message


@converts("ReLU")
def _relu(layer, out, ctx):
    slope = sub_message(layer, "relu_param").value("negative_slope", 0.0)
    if slope:
        out["negative_slope"] = slope
    return [out]


@converts("Sigmoid", "TanH", "AbsVal")
def _plain(layer, out, ctx):
    return [out]


@converts("BNLL")
def _bnll(layer, out, ctx):
    out["type"] = "Softplus"                   # Caffe's BNLL is log(1 + exp(x))
    return [out]


@converts("Exp", "Log")
def _exp_log(layer, out, ctx):
    copy_set(sub_message(layer, "exp_param" if out["type"] == "Exp" else "log_param"), out,
              (("base", -1.0), ("scale", 1.0), ("shift", 0.0)))
    return [out]


@converts("Dropout")
def _dropout(layer, out, ctx):
    out["dropout_ratio"] = sub_message(layer, "dropout_param").value("dropout_ratio", 0.5)
    return [out]


@converts("Threshold")
def _threshold(layer, out, ctx):
    out["threshold"] = sub_message(layer, "threshold_param").value("threshold", 0.0)
    return [out]


@converts("Clip")
def _clip(layer, out, ctx):
    p = sub_message(layer, "clip_param")
    out["min"], out["max"] = p.value("min"), p.value("max")
    return [out]


converts_by_copying("ELU", "elu_param", (("alpha", 1.0),))
converts_by_copying("Power", "power_param", (("power", 1.0), ("scale", 1.0), ("shift", 0.0)))
converts_by_copying("Swish", "swish_param", (("beta", 1.0),))

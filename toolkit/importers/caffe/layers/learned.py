"""Caffe's layers with learned blobs, and how each one's blobs become the toolkit's arrays:
Convolution, Deconvolution, InnerProduct, Embed, PReLU, Bias, Scale, and the recurrent LSTM, RNN
(with LSTMUnit, which has none)."""
from __future__ import annotations

from .base import WEIGHTS, common_params, converts, copy_set, filler_of, size_pair, sub_message, weights_and_bias


@converts("Convolution", "Deconvolution")
def _convolution(layer, out, ctx):
    p = sub_message(layer, "convolution_param")
    out["num_output"] = p.value("num_output")
    kernel = size_pair(p, "kernel_size", "kernel_h", "kernel_w", None)
    stride = size_pair(p, "stride", "stride_h", "stride_w", 1)
    pad = size_pair(p, "pad", "pad_h", "pad_w", 0)
    dilation = size_pair(p, "dilation", "dilation", "dilation", 1)
    for key, value, default in (("kernel_size", kernel, None), ("stride", stride, 1), ("pad", pad, 0),
                                ("dilation", dilation, 1)):
        if value is None:
            ctx.error(f"{key}: only 2-D convolutions are expressed here", (p.get(key) or layer.get("type")).loc)
        elif value != default:
            out[key] = value
    if p.value("group", 1) != 1:
        out["group"] = p.value("group")
    _bias_axis(p, out)
    return _with_fillers(p, layer, out, ctx)


def _conv_weights(name, arrays):
    return weights_and_bias(name, arrays)


WEIGHTS["Convolution"] = WEIGHTS["Deconvolution"] = _conv_weights


@converts("InnerProduct")
def _inner_product(layer, out, ctx):
    p = sub_message(layer, "inner_product_param")
    out["num_output"] = p.value("num_output")
    _bias_axis(p, out)
    if str(p.value("transpose", "false")) == "true":
        out["transpose"] = True
    return _with_fillers(p, layer, out, ctx)


def _inner_product_weights(name, arrays):
    w = arrays[0]
    return weights_and_bias(name, arrays, (w.shape[-2], w.shape[-1]) if w.ndim > 2 else None)


WEIGHTS["InnerProduct"] = _inner_product_weights


@converts("Embed")
def _embed(layer, out, ctx):
    p = sub_message(layer, "embed_param")
    out["input_dim"] = p.value("input_dim")
    out["num_output"] = p.value("num_output")
    biased = str(p.value("bias_term", "true")) == "true"            # Caffe's default
    if biased:
        out["bias_term"] = True
    for key in ("weight_filler", "bias_filler"):
        filler = filler_of(p, ctx, key)
        if filler is not None:
            out[key] = filler
    common_params(layer, out, ctx, ["weight", "bias"] if biased else ["weight"])
    return [out]


WEIGHTS["Embed"] = weights_and_bias


@converts("PReLU")
def _prelu(layer, out, ctx):
    p = sub_message(layer, "prelu_param")
    if str(p.value("channel_shared", "false")) == "true":
        out["channel_shared"] = True
    return _one_blob(layer, out, ctx, p, "weight")


def _one_blob(layer, out, ctx, p, pname: str) -> list:
    """A layer of one learned blob: its ``filler`` as the parameter's filler, its param entries."""
    filler = filler_of(p, ctx, "filler")
    if filler is not None:
        out[f"{pname}filler_of"] = filler
    common_params(layer, out, ctx, [pname])
    return [out]


WEIGHTS["PReLU"] = lambda name, arrays: {f"{name}.weight": arrays[0].reshape(-1)}


@converts("Bias")
def _bias(layer, out, ctx):
    p = sub_message(layer, "bias_param")
    copy_set(p, out, (("axis", 1), ("num_axes", 1)))
    return _one_blob(layer, out, ctx, p, "bias")


WEIGHTS["Bias"] = lambda name, arrays: {f"{name}.bias": arrays[0].reshape(-1)}


@converts("Scale")
def _scale(layer, out, ctx):
    p = sub_message(layer, "scale_param")
    copy_set(p, out, (("axis", 1), ("num_axes", 1)))
    if str(p.value("bias_term", "false")) == "true":
        out["bias_term"] = True
    for key in ("filler", "bias_filler"):
        filler = filler_of(p, ctx, key)
        if filler is not None:
            out["weight_filler" if key == "filler" else key] = filler
    common_params(layer, out, ctx, ["weight", "bias"] if out.get("bias_term") else ["weight"])
    return [out]


WEIGHTS["Scale"] = lambda name, arrays: weights_and_bias(name, [a.reshape(-1) for a in arrays])


@converts("LSTMUnit")
def _lstm_unit(layer, out, ctx):
    return [out]


@converts("LSTM", "RNN")
def _recurrent(layer, out, ctx):
    """Caffe's own recurrent layers, as CaffeLSTM and CaffeRNN (time-major, with cont)."""
    p = sub_message(layer, "recurrent_param")
    out["type"] = "Caffe" + out["type"]
    out["num_output"] = p.value("num_output")
    if str(p.value("expose_hidden", "false")) == "true":
        out["expose_hidden"] = True
    for key in ("weight_filler", "bias_filler"):
        filler = filler_of(p, ctx, key)
        if filler is not None:
            out[key] = filler
    static = ["weight_static"] if len(layer.values("bottom")) - (2 if out.get("expose_hidden") else 0) > 2 \
        and out["type"] == "CaffeLSTM" or len(layer.values("bottom")) - (1 if out.get("expose_hidden") else 0) > 2 \
        and out["type"] == "CaffeRNN" else []
    slots = ["weight_x", "bias", *static, "weight_h"] + \
        (["weight_out", "bias_out"] if out["type"] == "CaffeRNN" else [])
    common_params(layer, out, ctx, slots)
    return [out]


def _recurrent_weights(name, arrays, names):
    """Caffe's blob order: W_x, b, (W_static), W_h (, W_o, b_o for RNN)."""
    if len(arrays) == len(names):
        chosen = names
    else:
        chosen = [n for n in names if n != "weight_static"]
    return {f"{name}.{n}": a for n, a in zip(chosen, arrays)}


WEIGHTS["LSTM"] = lambda name, arrays: _recurrent_weights(name, arrays, ["weight_x", "bias", "weight_static",
                                                                         "weight_h"])
WEIGHTS["RNN"] = lambda name, arrays: _recurrent_weights(name, arrays, ["weight_x", "bias", "weight_static",
                                                                        "weight_h", "weight_out", "bias_out"])


def _bias_axis(p, out) -> None:
    """A learned layer's bias_term and axis, where they differ from the defaults."""
    if str(p.value("bias_term", "true")) == "false":
        out["bias_term"] = False
    if p.value("axis", 1) != 1:
        out["axis"] = p.value("axis")


def _with_fillers(p, layer, out, ctx) -> list[dict]:
    """The layer's weight and bias fillers and the keys every layer has (its blobs: the weight,
    and the bias unless bias_term is off)."""
    for key in ("weight_filler", "bias_filler"):
        filler = filler_of(p, ctx, key)
        if filler is not None:
            out[key] = filler
    common_params(layer, out, ctx, ["weight"] if out.get("bias_term") is False else ["weight", "bias"])
    return [out]

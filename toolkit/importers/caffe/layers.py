"""Each Caffe layer as the toolkit's layer (a dict of the net file's keys), and its weight blobs
as the toolkit's arrays (PyTorch's layouts, which for these layers are Caffe's own).

A parameter the toolkit cannot express is a Problem at its line and column in the prototxt, and
the import goes on, so that one pass reports every one; values equal to the toolkit's defaults
are left out of the net file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...errors import Location, Problem
from ...fileio import read_regular
from .prototxt import Message

# V1 ``layers`` type enum (caffe.proto's V1LayerParameter.LayerType) -> the type's name
V1_TYPES = {
    0: "None", 35: "AbsVal", 1: "Accuracy", 30: "ArgMax", 2: "BNLL", 3: "Concat", 37: "ContrastiveLoss",
    4: "Convolution", 5: "Data", 39: "Deconvolution", 6: "Dropout", 32: "DummyData", 7: "EuclideanLoss",
    25: "Eltwise", 38: "Exp", 8: "Flatten", 9: "HDF5Data", 10: "HDF5Output", 28: "HingeLoss", 11: "Im2col",
    12: "ImageData", 13: "InfogainLoss", 14: "InnerProduct", 15: "LRN", 29: "MemoryData",
    16: "MultinomialLogisticLoss", 34: "MVN", 17: "Pooling", 26: "Power", 18: "ReLU", 19: "Sigmoid",
    27: "SigmoidCrossEntropyLoss", 36: "Silence", 20: "Softmax", 21: "SoftmaxWithLoss", 22: "Split",
    33: "Slice", 23: "TanH", 24: "WindowData", 31: "Threshold"}
V1_NAMES = {name.upper(): name for name in V1_TYPES.values()}
V1_NAMES.update({"SOFTMAX_LOSS": "SoftmaxWithLoss", "INNER_PRODUCT": "InnerProduct", "EUCLIDEAN_LOSS": "EuclideanLoss",
                 "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "IMAGE_DATA": "ImageData",
                 "HDF5_DATA": "HDF5Data", "MEMORY_DATA": "MemoryData", "DUMMY_DATA": "DummyData",
                 "WINDOW_DATA": "WindowData", "ARGMAX": "ArgMax", "ABSVAL": "AbsVal"})

DATA_TYPES = {"Data", "ImageData", "HDF5Data", "MemoryData", "DummyData", "WindowData", "Input", "Python"}


@dataclass
class Context:
    """What converting one net gathers: problems, the blobs' owners, tops that alias another."""
    file: str
    problems: list[Problem] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)        # a Split's tops -> its bottom
    param_names: dict[str, tuple[str, tuple]] = field(default_factory=dict)   # shared name -> (layer, slot)
    extra: dict = field(default_factory=dict)      # arrays to write beside the net (a mean image)
    fixed: dict = field(default_factory=dict)      # weights no caffemodel holds (an infogain matrix) by key
    notes: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)   # the files the prototxt names that were read

    def error(self, message: str, loc: Location) -> None:
        self.problems.append(Problem(message, loc))


def _sub(layer: Message, name: str) -> Message:
    found = layer.get(name)
    return found.value if found is not None and isinstance(found.value, Message) else Message(loc=layer.loc)


def _enum(value) -> str:
    return str(value).upper()


def _pair(msg: Message, base: str, h: str, w: str, default):
    """Caffe's (repeated) SIZE, or SIZE_h/SIZE_w, as an int or an [h, w] pair."""
    if msg.get(h) is not None or msg.get(w) is not None:
        values = [msg.value(h, default), msg.value(w, default)]
    else:
        values = msg.values(base)
        if not values:
            return default
        if len(values) == 1:
            values = values * 2
    if len(values) != 2:
        return None
    return values[0] if values[0] == values[1] else list(values)


def _filler(msg: Message, ctx: Context, where: str) -> dict | None:
    f = msg.get(where)
    if f is None:
        return None
    spec: Message = f.value
    kind = str(spec.value("type", "constant"))
    if kind == "constant":
        return {"type": "constant", "value": spec.value("value", 0.0)}
    if kind == "uniform":
        return {"type": "uniform", "min": spec.value("min", 0.0), "max": spec.value("max", 1.0)}
    if kind == "gaussian":
        out = {"type": "gaussian", "mean": spec.value("mean", 0.0), "std": spec.value("std", 1.0)}
        if spec.value("sparse", -1) != -1:
            out["sparse"] = spec.value("sparse")
        return out
    if kind in ("bilinear", "positive_unitball"):
        return {"type": kind}
    if kind in ("xavier", "msra"):
        norm = _enum(spec.value("variance_norm", "FAN_IN")).lower()
        return {"type": kind, **({"variance_norm": norm} if norm != "fan_in" else {})}
    ctx.error(f"{where}: the {kind} filler has no counterpart here (constant, uniform, gaussian, xavier, msra, "
              "bilinear, positive_unitball)", f.loc)
    return None


def _copy_set(p: Message, out: dict, defaults: tuple) -> None:
    """Copy each (key, Caffe's default) the message sets to another value into the layer."""
    for key, default in defaults:
        if p.value(key, default) != default:
            out[key] = p.value(key)


def _common_params(layer: Message, out: dict, ctx: Context, slots: list[str]) -> None:
    """``param { lr_mult decay_mult name }`` of a layer whose parameters are ``slots`` (in
    Caffe's blob order). A param name met before shares that blob: ``share`` names the owner
    for all the layer's parameters, or, parameter by parameter, for some."""
    params = [p.value for p in layer.all("param")]
    if not params:
        return
    lr = [p.value("lr_mult", 1.0) for p in params]
    decay = [p.value("decay_mult", 1.0) for p in params]
    if any(v != 1.0 for v in lr):
        out["lr_mult"] = lr[0] if len(set(lr)) == 1 and len(lr) == len(slots) else lr
    if any(v != 1.0 for v in decay):
        out["decay_mult"] = decay[0] if len(set(decay)) == 1 and len(decay) == len(slots) else decay
    shared: dict[str, str] = {}
    for slot, param in zip(slots, params):
        blob = param.value("name")
        if not blob:
            continue
        if blob not in ctx.param_names:
            ctx.param_names[blob] = (out["name"], slot)
            continue
        owner, owner_slot = ctx.param_names[blob]
        if owner_slot != slot:
            ctx.error(f"param name '{blob}' shares layer '{owner}''s {owner_slot} as this layer's {slot}: only a "
                      "parameter of the same role can be shared here", layer.get("param").loc)
            continue
        shared[slot] = owner
    if shared:
        owners = set(shared.values())
        out["share"] = owners.pop() if len(owners) == 1 and len(shared) == len(slots) else shared


def _blob_array(blob, loc: Location, ctx: Context, name: str, said: str | None = None) -> np.ndarray | None:
    """The blob's values in its shape; a shape that is not the values' is a Problem, saying
    ``said`` (by default, the caffemodel's blob of layer ``name``)."""
    said = said or f"caffemodel: a weight blob of layer '{name}'"
    dims = [int(d) for d in blob.shape.dim] if blob.HasField("shape") else \
        [d for d in (blob.num, blob.channels, blob.height, blob.width)]
    values = blob.double_data if len(blob.double_data) else blob.data
    if any(d < 0 for d in dims):
        ctx.error(f"{said} says shape {dims}: a dimension is negative", loc)
        return None
    count = math.prod(dims)             # Python ints; an empty shape is a scalar: one value (Caffe's)
    if count != len(values):
        ctx.error(f"{said} says shape {dims} ({count:,} value{'s' * (count != 1)}) but holds {len(values):,}", loc)
        return None
    return np.asarray(values, dtype=np.float32).reshape(dims)


def read_blob_file(given: str, loc: Location, ctx: Context, what: str) -> tuple[np.ndarray | None, bool]:
    """(the array, True) of a binaryproto BlobProto named in the prototxt, looked for as given
    and beside the prototxt (Caffe's paths are relative to where caffe ran); (None, False) where
    it is not here, (None, True) after an error."""
    from .proto import classes
    found = next((c for c in (Path(given), Path(ctx.file).parent / given) if c.is_file()), None)
    if found is None:
        return None, False
    blob = classes()["BlobProto"]()
    ctx.read.append(str(found))
    try:
        blob.ParseFromString(read_regular(str(found), MAX_BLOB_FILE_BYTES, "binaryproto"))
    except Exception as e:            # protobuf's DecodeError and its kin
        ctx.error(f"{what} {given}: not a readable binaryproto ({e})", loc)
        return None, True
    return _blob_array(blob, loc, ctx, what, f"{what} {given}: its blob"), True


MAX_BLOB_FILE_BYTES = (2 << 30) - 1            # protobuf's own limit on one message


# ---------------------------------------------------------------------------------------------
# the conversions: (layer message, the toolkit layer dict so far, context) -> layer dicts
# ---------------------------------------------------------------------------------------------

Converter = Callable[[Message, dict, Context], list]
CONVERTERS: dict[str, Converter] = {}
# type -> f(name, [arrays]) -> {key: array}
WEIGHTS: dict[str, Callable] = {}


def converts(*types: str):
    def register(fn):
        for t in types:
            CONVERTERS[t] = fn
        return fn
    return register


def _weights_and_bias(name: str, arrays: list, weight_shape=None) -> dict:
    out = {f"{name}.weight": arrays[0] if weight_shape is None else arrays[0].reshape(weight_shape)}
    if len(arrays) > 1:
        out[f"{name}.bias"] = arrays[1].reshape(-1)
    return out


@converts("Convolution", "Deconvolution")
def _convolution(layer, out, ctx):
    p = _sub(layer, "convolution_param")
    out["num_output"] = p.value("num_output")
    kernel = _pair(p, "kernel_size", "kernel_h", "kernel_w", None)
    stride = _pair(p, "stride", "stride_h", "stride_w", 1)
    pad = _pair(p, "pad", "pad_h", "pad_w", 0)
    dilation = _pair(p, "dilation", "dilation", "dilation", 1)
    for key, value, default in (("kernel_size", kernel, None), ("stride", stride, 1), ("pad", pad, 0),
                                ("dilation", dilation, 1)):
        if value is None:
            ctx.error(f"{key}: only 2-D convolutions are expressed here", (p.get(key) or layer.get("type")).loc)
        elif value != default:
            out[key] = value
    if p.value("group", 1) != 1:
        out["group"] = p.value("group")
    if str(p.value("bias_term", "true")) == "false":
        out["bias_term"] = False
    if p.value("axis", 1) != 1:
        out["axis"] = p.value("axis")
    for key in ("weight_filler", "bias_filler"):
        filler = _filler(p, ctx, key)
        if filler is not None:
            out[key] = filler
    _common_params(layer, out, ctx, ["weight"] if out.get("bias_term") is False else ["weight", "bias"])
    return [out]


def _conv_weights(name, arrays):
    return _weights_and_bias(name, arrays)


WEIGHTS["Convolution"] = WEIGHTS["Deconvolution"] = _conv_weights


@converts("InnerProduct")
def _inner_product(layer, out, ctx):
    p = _sub(layer, "inner_product_param")
    out["num_output"] = p.value("num_output")
    if str(p.value("bias_term", "true")) == "false":
        out["bias_term"] = False
    if p.value("axis", 1) != 1:
        out["axis"] = p.value("axis")
    if str(p.value("transpose", "false")) == "true":
        out["transpose"] = True
    for key in ("weight_filler", "bias_filler"):
        filler = _filler(p, ctx, key)
        if filler is not None:
            out[key] = filler
    _common_params(layer, out, ctx, ["weight"] if out.get("bias_term") is False else ["weight", "bias"])
    return [out]


def _inner_product_weights(name, arrays):
    w = arrays[0]
    return _weights_and_bias(name, arrays, (w.shape[-2], w.shape[-1]) if w.ndim > 2 else None)


WEIGHTS["InnerProduct"] = _inner_product_weights


@converts("Pooling")
def _pooling(layer, out, ctx):
    p = _sub(layer, "pooling_param")
    pool = _enum(p.value("pool", "MAX"))
    if pool not in ("MAX", "AVE"):
        ctx.error(f"pooling_param.pool {pool} has no counterpart here (MAX, AVE)", p.get("pool").loc)
    out["pool"] = "ave" if pool == "AVE" else "max"
    if str(p.value("global_pooling", "false")) == "true":
        out["global_pooling"] = True
    else:
        out["kernel_size"] = _pair(p, "kernel_size", "kernel_h", "kernel_w", None)
        stride = _pair(p, "stride", "stride_h", "stride_w", 1)
        pad = _pair(p, "pad", "pad_h", "pad_w", 0)
        if stride != 1:
            out["stride"] = stride
        if pad != 0:
            out["pad"] = pad
        # Caffe rounds the output size up unless round_mode is FLOOR; its average divides by
        # the window within the padded input, as count_include_pad does
        out["ceil_mode"] = _enum(p.value("round_mode", "CEIL")) == "CEIL"
    return [out]


@converts("ReLU")
def _relu(layer, out, ctx):
    slope = _sub(layer, "relu_param").value("negative_slope", 0.0)
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
    _copy_set(_sub(layer, "exp_param" if out["type"] == "Exp" else "log_param"), out,
              (("base", -1.0), ("scale", 1.0), ("shift", 0.0)))
    return [out]


@converts("Dropout")
def _dropout(layer, out, ctx):
    out["dropout_ratio"] = _sub(layer, "dropout_param").value("dropout_ratio", 0.5)
    return [out]


@converts("LRN")
def _lrn(layer, out, ctx):
    p = _sub(layer, "lrn_param")
    out.update(local_size=p.value("local_size", 5), alpha=p.value("alpha", 1.0), beta=p.value("beta", 0.75),
               k=p.value("k", 1.0))
    if _enum(p.value("norm_region", "ACROSS_CHANNELS")) == "WITHIN_CHANNEL":
        out["norm_region"] = "within_channel"
    return [out]


@converts("PReLU")
def _prelu(layer, out, ctx):
    p = _sub(layer, "prelu_param")
    if str(p.value("channel_shared", "false")) == "true":
        out["channel_shared"] = True
    return _one_blob(layer, out, ctx, p, "weight")


def _one_blob(layer, out, ctx, p, pname: str) -> list:
    """A layer of one learned blob: its ``filler`` as the parameter's filler, its param entries."""
    filler = _filler(p, ctx, "filler")
    if filler is not None:
        out[f"{pname}_filler"] = filler
    _common_params(layer, out, ctx, [pname])
    return [out]


WEIGHTS["PReLU"] = lambda name, arrays: {f"{name}.weight": arrays[0].reshape(-1)}


@converts("Bias")
def _bias(layer, out, ctx):
    p = _sub(layer, "bias_param")
    _copy_set(p, out, (("axis", 1), ("num_axes", 1)))
    return _one_blob(layer, out, ctx, p, "bias")


WEIGHTS["Bias"] = lambda name, arrays: {f"{name}.bias": arrays[0].reshape(-1)}


@converts("Threshold")
def _threshold(layer, out, ctx):
    out["threshold"] = _sub(layer, "threshold_param").value("threshold", 0.0)
    return [out]


@converts("Clip")
def _clip(layer, out, ctx):
    p = _sub(layer, "clip_param")
    out["min"], out["max"] = p.value("min"), p.value("max")
    return [out]


@converts("MVN")
def _mvn(layer, out, ctx):
    p = _sub(layer, "mvn_param")
    if str(p.value("normalize_variance", "true")) == "false":
        out["normalize_variance"] = False
    if str(p.value("across_channels", "false")) == "true":
        out["across_channels"] = True
    if p.get("eps") is not None:
        out["eps"] = p.value("eps")
    return [out]


@converts("Softmax")
def _softmax(layer, out, ctx):
    axis = _sub(layer, "softmax_param").value("axis", 1)
    if axis != 1:
        out["axis"] = axis
    return [out]


@converts("SoftmaxWithLoss")
def _softmax_loss(layer, out, ctx):
    axis = _sub(layer, "softmax_param").value("axis", 1)
    if axis != 1:
        out["axis"] = axis
    loss = _sub(layer, "loss_param")
    if loss.get("ignore_label") is not None:
        out["ignore_label"] = loss.value("ignore_label")
    normalization = _enum(loss.value("normalization", "VALID"))
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
    p = _sub(layer, "infogain_loss_param")
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
    norm = _enum(_sub(layer, "hinge_loss_param").value("norm", "L1"))
    if norm == "L2":
        out["norm"] = "l2"
    return [out]


@converts("ContrastiveLoss")
def _contrastive_loss(layer, out, ctx):
    p = _sub(layer, "contrastive_loss_param")
    _copy_set(p, out, (("margin", 1.0),))
    if str(p.value("legacy_version", "false")) == "true":
        out["legacy_version"] = True
    return [out]


@converts("Accuracy")
def _accuracy(layer, out, ctx):
    p = _sub(layer, "accuracy_param")
    _copy_set(p, out, (("top_k", 1), ("axis", 1)))
    if p.get("ignore_label") is not None:
        out["ignore_label"] = p.value("ignore_label")
    return [out]


@converts("Concat")
def _concat(layer, out, ctx):
    p = _sub(layer, "concat_param")
    axis = p.value("axis", p.value("concat_dim", 1))
    if axis != 1:
        out["axis"] = axis
    return [out]


@converts("Eltwise")
def _eltwise(layer, out, ctx):
    p = _sub(layer, "eltwise_param")
    out["operation"] = _enum(p.value("operation", "SUM")).lower()
    coeff = p.values("coeff")
    if coeff:
        out["coeff"] = coeff
    return [out]


@converts("Reshape")
def _reshape(layer, out, ctx):
    p = _sub(layer, "reshape_param")
    shape = p.get("shape")
    out["shape"] = shape.value.values("dim") if shape is not None else []
    _copy_set(p, out, (("axis", 0), ("num_axes", -1)))
    return [out]


@converts("Slice")
def _slice(layer, out, ctx):
    p = _sub(layer, "slice_param")
    axis = p.value("axis", p.value("slice_dim", 1))
    if axis != 1:
        out["axis"] = axis
    points = p.values("slice_point")
    if points:
        out["slice_point"] = points
    return [out]


@converts("BatchNorm")
def _batchnorm(layer, out, ctx):
    """Caffe's BatchNorm normalises only (its Scale layer is the affine part); its moving average
    keeps moving_average_fraction of the old value, so PyTorch's momentum is 1 minus that."""
    p = _sub(layer, "batch_norm_param")
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


@converts("Scale")
def _scale(layer, out, ctx):
    p = _sub(layer, "scale_param")
    _copy_set(p, out, (("axis", 1), ("num_axes", 1)))
    if str(p.value("bias_term", "false")) == "true":
        out["bias_term"] = True
    for key in ("filler", "bias_filler"):
        filler = _filler(p, ctx, key)
        if filler is not None:
            out["weight_filler" if key == "filler" else key] = filler
    _common_params(layer, out, ctx, ["weight", "bias"] if out.get("bias_term") else ["weight"])
    return [out]


WEIGHTS["Scale"] = lambda name, arrays: _weights_and_bias(name, [a.reshape(-1) for a in arrays])


@converts("SPP")
def _spp(layer, out, ctx):
    p = _sub(layer, "spp_param")
    out["pyramid_height"] = p.value("pyramid_height")
    pool = _enum(p.value("pool", "MAX"))
    if pool not in ("MAX", "AVE"):
        ctx.error(f"spp_param.pool {pool} has no counterpart here (MAX, AVE)", p.get("pool").loc)
    elif pool == "AVE":
        out["pool"] = "ave"
    return [out]


@converts("LSTMUnit")
def _lstm_unit(layer, out, ctx):
    return [out]


@converts("LSTM", "RNN")
def _recurrent(layer, out, ctx):
    """Caffe's own recurrent layers, as CaffeLSTM and CaffeRNN (time-major, with cont)."""
    p = _sub(layer, "recurrent_param")
    out["type"] = "Caffe" + out["type"]
    out["num_output"] = p.value("num_output")
    if str(p.value("expose_hidden", "false")) == "true":
        out["expose_hidden"] = True
    for key in ("weight_filler", "bias_filler"):
        filler = _filler(p, ctx, key)
        if filler is not None:
            out[key] = filler
    static = ["weight_static"] if len(layer.values("bottom")) - (2 if out.get("expose_hidden") else 0) > 2 \
        and out["type"] == "CaffeLSTM" or len(layer.values("bottom")) - (1 if out.get("expose_hidden") else 0) > 2 \
        and out["type"] == "CaffeRNN" else []
    slots = ["weight_x", "bias", *static, "weight_h"] + (["weight_out", "bias_out"] if out["type"] == "CaffeRNN" else [])
    _common_params(layer, out, ctx, slots)
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


@converts("Crop")
def _crop(layer, out, ctx):
    p = _sub(layer, "crop_param")
    out["axis"] = p.value("axis", 2)
    offsets = p.values("offset")
    if offsets:
        out["offset"] = offsets if len(offsets) > 1 else offsets[0]
    return [out]


@converts("ArgMax")
def _argmax(layer, out, ctx):
    p = _sub(layer, "argmax_param")
    for key, default in (("top_k", 1), ("out_max_val", "false")):
        if str(p.value(key, default)) != str(default):
            out[key] = p.value(key) if key == "top_k" else True
    if p.get("axis") is not None:
        out["axis"] = p.value("axis")
    return [out]


@converts("Reduction")
def _reduction(layer, out, ctx):
    p = _sub(layer, "reduction_param")
    out["operation"] = _enum(p.value("operation", "SUM")).lower()
    if p.value("axis", 0) != 0:
        out["axis"] = p.value("axis")
    if p.value("coeff", 1.0) != 1.0:
        out["coeff"] = p.value("coeff")
    return [out]


@converts("Tile")
def _tile(layer, out, ctx):
    p = _sub(layer, "tile_param")
    out["axis"] = p.value("axis", 1)
    out["tiles"] = p.value("tiles", 1)
    return [out]


@converts("Embed")
def _embed(layer, out, ctx):
    p = _sub(layer, "embed_param")
    out["input_dim"] = p.value("input_dim")
    out["num_output"] = p.value("num_output")
    biased = str(p.value("bias_term", "true")) == "true"            # Caffe's default
    if biased:
        out["bias_term"] = True
    for key in ("weight_filler", "bias_filler"):
        filler = _filler(p, ctx, key)
        if filler is not None:
            out[key] = filler
    _common_params(layer, out, ctx, ["weight", "bias"] if biased else ["weight"])
    return [out]


WEIGHTS["Embed"] = _weights_and_bias


def _copying(type_name: str, sub: str, defaults: tuple) -> None:
    """A converter that copies the parameters ``sub`` sets to other values than Caffe's defaults."""
    def convert_copying(layer, out, ctx):
        _copy_set(_sub(layer, sub), out, defaults)
        return [out]
    CONVERTERS[type_name] = convert_copying


for _type, _sub_name, _defaults in (("ELU", "elu_param", (("alpha", 1.0),)),
                                    ("Power", "power_param", (("power", 1.0), ("scale", 1.0), ("shift", 0.0))),
                                    ("Swish", "swish_param", (("beta", 1.0),)),
                                    ("Flatten", "flatten_param", (("axis", 1), ("end_axis", -1)))):
    _copying(_type, _sub_name, _defaults)


def convert(layer: Message, type_name: str, name: str, bottoms: list[str], tops: list[str], ctx: Context) -> list:
    """The toolkit layers of one Caffe layer (Split: none, its tops become aliases of its
    bottom; Silence: none, it only consumes)."""
    if type_name == "Split":
        for top in tops:
            ctx.aliases[top] = bottoms[0]
        return []
    if type_name == "Silence":
        return []
    converter = CONVERTERS.get(type_name)
    if converter is None:
        ctx.error(f"layer '{name}': the Caffe layer type {type_name} has no counterpart here yet",
                  layer.get("type").loc if layer.get("type") else layer.loc)
        return []
    out = {"name": name, "type": type_name, "bottom": bottoms[0] if len(bottoms) == 1 else bottoms,
           "top": tops[0] if len(tops) == 1 else tops}
    weights = layer.values("loss_weight")
    if weights:
        if len(set(weights)) > 1:
            ctx.error("a loss_weight per top has no counterpart here (one per layer)", layer.get("loss_weight").loc)
        if weights[0] != (1.0 if type_name.endswith("Loss") else 0.0):
            out["loss_weight"] = weights[0]
    if any(str(v) == "false" for v in layer.values("propagate_down")):
        ctx.error("propagate_down: false has no counterpart here", layer.get("propagate_down").loc)
    return converter(layer, out, ctx)

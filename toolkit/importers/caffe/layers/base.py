"""What the Caffe layer converters share: the V1 type tables, the ``Context`` one net's
conversion gathers, the registries (``CONVERTERS``: a layer message to the toolkit's layer dicts;
``WEIGHTS``: a layer's blobs to the toolkit's arrays), ``convert`` (one layer, by its type) and the
readers of a layer's parameters (sizes, fillers, ``param`` entries)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ....errors import Location, Problem
from ..prototxt import Message

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


def sub_message(layer: Message, name: str) -> Message:
    """The layer's ``name`` message (``convolution_param``...), an empty one where it has none."""
    found = layer.get(name)
    return found.value if found is not None and isinstance(found.value, Message) else Message(loc=layer.loc)


def enum_name(value) -> str:
    """An enum value as its upper-case name (prototxts write them in either case)."""
    return str(value).upper()


def size_pair(msg: Message, base: str, h: str, w: str, default):
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


def filler_of(msg: Message, ctx: Context, where: str) -> dict | None:
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
        norm = enum_name(spec.value("variance_norm", "FAN_IN")).lower()
        return {"type": kind, **({"variance_norm": norm} if norm != "fan_in" else {})}
    ctx.error(f"{where}: the {kind} filler has no counterpart here (constant, uniform, gaussian, xavier, msra, "
              "bilinear, positive_unitball)", f.loc)
    return None


def copy_set(p: Message, out: dict, defaults: tuple) -> None:
    """Copy each (key, Caffe's default) the message sets to another value into the layer."""
    for key, default in defaults:
        if p.value(key, default) != default:
            out[key] = p.value(key)


def common_params(layer: Message, out: dict, ctx: Context, slots: list[str]) -> None:
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


Converter = Callable[[Message, dict, Context], list]
CONVERTERS: dict[str, Converter] = {}
# type -> f(name, [arrays]) -> {key: array}
WEIGHTS: dict[str, Callable] = {}


def converts(*types: str):
    """Registers the decorated function as the converter of each of the Caffe layer ``types``."""
    def register(fn):
        for t in types:
            CONVERTERS[t] = fn
        return fn
    return register


def weights_and_bias(name: str, arrays: list, weight_shape=None) -> dict:
    """The blobs [weight, (bias)] as NAME.weight (reshaped to ``weight_shape`` where given) and NAME.bias."""
    out = {f"{name}.weight": arrays[0] if weight_shape is None else arrays[0].reshape(weight_shape)}
    if len(arrays) > 1:
        out[f"{name}.bias"] = arrays[1].reshape(-1)
    return out


def converts_by_copying(type_name: str, sub: str, defaults: tuple) -> None:
    """A converter that copies the parameters ``sub`` sets to other values than Caffe's defaults."""
    def convert_copying(layer, out, ctx):
        copy_set(sub_message(layer, sub), out, defaults)
        return [out]
    CONVERTERS[type_name] = convert_copying


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

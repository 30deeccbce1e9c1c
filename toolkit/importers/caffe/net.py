"""A Caffe net (prototxt), with its weights (caffemodel) and solver, as the toolkit's net file data
and weights arrays.

- Phases follow Caffe's rules (``include``/``exclude`` by phase, stage, not_stage, min_level,
  max_level; the stages given, level 0): a layer in TRAIN is in the train phase, one in TEST in
  the test phase and, unless it is a loss or accuracy layer, in the infer phase (the deploy
  net). A file without a data layer and without rules (a deploy.prototxt) puts every layer in
  every phase.
- Inputs come from ``input``/``input_shape``/``input_dim``, ``Input`` layers, and the data layers
  (``Data``, ``ImageData``, ...), whose shape is in their database: ``input_shapes`` gives it
  (``--input-shape data=3,227,227``). The batch dimension becomes ``N``. A data layer's
  ``transform_param`` and ``batch_size`` become train.data.
- A ``Split`` is no layer here: its tops name its bottom. ``Silence`` only consumes: dropped.
- Every problem is reported at its place in the prototxt, all of them at once.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ...errors import Location, Problem, SpecError, UserError
from ...fileio import read_regular
from ..prototext import undecodable_field
from . import layers as caffe_layers
from .fields import field_problems
from .layers import DATA_TYPES, V1_NAMES, V1_TYPES, WEIGHTS, Context, blob_array, read_blob_file, sub_message
from .prototxt import Message, parse

MAX_PROTOTXT_BYTES = 16 << 20
MAX_CAFFEMODEL_BYTES = (2 << 30) - 1          # protobuf's own limit on one message
# far beyond the published nets (a few hundred layers, a few thousand fields: GoogLeNet, ResNet-50,
# MobileNet v2), and within what a net file may hold (toolkit/frontend/yaml_loader.py's MAX_NODES
# values); the fields' bound stops the parse of a file too large early, the layers' bound says so
# at the first layer past it
MAX_PROTOTXT_FIELDS = 200_000
MAX_LAYERS = 10_000
# what the net file written may hold: below a net file's 200,000 values (toolkit/frontend/
# yaml_loader.py's MAX_NODES), with room for the inputs and the train section
MAX_NET_VALUES = 150_000
PHASES = ("TRAIN", "TEST")
LABEL_TOPS = 1                                 # a data layer's tops after the first are labels
LABEL_READERS = {"SoftmaxWithLoss", "Accuracy", "MultinomialLogisticLoss", "InfogainLoss", "HingeLoss"}


def read_prototxt(path: str) -> Message:
    data = read_regular(path, MAX_PROTOTXT_BYTES, "prototxt")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    msg = parse(text, path, MAX_PROTOTXT_FIELDS)
    wrong = field_problems(msg)
    if wrong:
        raise SpecError(*[Problem(why, f.loc) for why, f in wrong])
    return msg


def _net_name(msg: Message, path: str) -> str:
    """The prototxt's name, else its file's (``lenet.prototxt`` is the model ``lenet``)."""
    name = str(msg.value("name", "") or Path(path).stem)
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", name).strip("._") or "imported"
    return name


def _layer_name(name: str) -> str:
    """A Caffe layer or blob name as a toolkit name (letters, digits, _ . - /)."""
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", name)


class _BlobNames:
    """Caffe blob names as toolkit names, one to one: Caffe's names may hold any character and a
    toolkit name only letters, digits and _ . - /, so 'x y' and 'x_y' would both be x_y and a layer
    would read the other's blob. The first name in the file keeps its form; a later one whose form
    is taken gets NAME_2, NAME_3, ... and a note."""

    def __init__(self, notes: list[str]):
        self.names: dict[str, str] = {}
        self.owner: dict[str, str] = {}
        self.notes = notes

    def __call__(self, raw: str) -> str:
        name = self.names.get(raw)
        if name is None:
            base = _layer_name(raw)
            name = _free_name(base, self.owner.keys())
            if name != base:
                self.notes.append(f"blob '{raw}' is '{name}' here ('{base}' is the blob '{self.owner[base]}')")
            self.names[raw], self.owner[name] = name, raw
        return name


def _rule_meets(rule: Message, phase: str, stages: set[str]) -> bool:
    """Caffe's NetStateRule against the state (phase, level 0, the stages given)."""
    if rule.get("phase") is not None and str(rule.value("phase")).upper() != phase:
        return False
    if rule.get("min_level") is not None and 0 < rule.value("min_level"):
        return False
    if rule.get("max_level") is not None and 0 > rule.value("max_level"):
        return False
    if any(str(s) not in stages for s in rule.values("stage")):
        return False
    return not any(str(s) in stages for s in rule.values("not_stage"))


def _in_phase(layer: Message, phase: str, stages: set[str]) -> bool:
    includes = [f.value for f in layer.all("include")]
    excludes = [f.value for f in layer.all("exclude")]
    if includes:
        return any(_rule_meets(r, phase, stages) for r in includes)
    return not any(_rule_meets(r, phase, stages) for r in excludes)


def _type_of(layer: Message, v1: bool, ctx: Context) -> str:
    kind = layer.value("type")
    if not v1:
        return str(kind)
    if isinstance(kind, int):
        return V1_TYPES.get(kind, f"V1 type {kind}")
    return V1_NAMES.get(str(kind).upper(), str(kind))


def _shape(dims: list, loc: Location, ctx: Context, name: str) -> list:
    """An input's shape with its batch (first) axis symbolic; the dims as given are kept by name."""
    if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
        ctx.error(f"an input shape must be positive whole numbers, got {dims}", loc)
        return ["N"]
    ctx.extra.setdefault("given_shapes", {})[name] = list(dims)
    return ["N"] + list(dims[1:])


def _v1_params(layer: Message) -> Message:
    """A V1 layer's blobs_lr and weight_decay as param { lr_mult decay_mult }."""
    lr, decay = layer.values("blobs_lr"), layer.values("weight_decay")
    if not lr and not decay:
        return layer
    from .prototxt import Field
    extra = []
    for i in range(max(len(lr), len(decay))):
        p = Message(loc=layer.loc)
        if i < len(lr):
            p.fields.append(Field("lr_mult", lr[i], layer.loc))
        if i < len(decay):
            p.fields.append(Field("decay_mult", decay[i], layer.loc))
        extra.append(Field("param", p, layer.loc))
    return Message(layer.fields + extra, layer.loc)


def import_net(prototxt: str, stages: tuple[str, ...] = (), input_shapes: dict[str, list[int]] | None = None
               ) -> tuple[dict, Context, list[tuple[str, str]], list[str]]:
    """(the net file's data, the context, [(layer name, Caffe type)] of layers with weights,
    notes)."""
    msg = read_prototxt(prototxt)
    ctx = Context(prototxt)
    input_shapes = dict(input_shapes or {})
    stage_set = set(stages)
    v1 = not msg.all("layer") and bool(msg.all("layers"))
    entries = [f.value for f in (msg.all("layers") if v1 else msg.all("layer"))]
    if not entries:
        raise SpecError(Problem("the prototxt has no layer", msg.loc))
    if len(entries) > MAX_LAYERS:
        raise SpecError(Problem(f"more than {MAX_LAYERS:,} layers: larger than any net this imports",
                                (msg.all("layers") if v1 else msg.all("layer"))[MAX_LAYERS].loc))
    inputs: dict[str, dict] = {}
    notes: list[str] = []
    blob = _BlobNames(notes)
    data: dict = {}
    # net-level inputs: input + input_shape, or input + 4 input_dim each
    net_inputs = msg.values("input")
    shapes = [f.value.values("dim") for f in msg.all("input_shape")]
    dims = msg.values("input_dim")
    for i, name in enumerate(net_inputs):
        given = shapes[i] if i < len(shapes) else dims[4 * i: 4 * i + 4]
        inputs[blob(name)] = {"shape": _shape(given, msg.get("input").loc, ctx, blob(name)),
                                     "dtype": "float32"}

    rules = any(e.all("include") or e.all("exclude") for e in entries)
    has_data = any(_type_of(e, v1, ctx) in DATA_TYPES - {"Input"} for e in entries)
    deploy = not rules and not has_data
    out_layers: list[dict] = []
    net_values = 0
    weighted: list[tuple[str, str]] = []
    seen: dict[str, Location] = {}
    # every name of the file and every name given: a new name must clash with none of them
    used = {_layer_name(str(e.value("name", _type_of(e, v1, ctx)))) for e in entries}
    named: dict[str, list] = {}            # a Caffe name -> the phases of each layer renamed from it
    for layer in entries:
        kind = _type_of(layer, v1, ctx)
        raw_name = str(layer.value("name", kind))
        name = _layer_name(raw_name)
        phases = [p for p in PHASES if _in_phase(layer, p, stage_set)]
        if not phases:
            continue
        tops = [blob(str(t)) for t in layer.values("top")]
        if not tops and kind.endswith("Loss"):
            tops = [name]                  # Caffe gives a loss layer without a top one of its own
        bottoms = [ctx.aliases.get(blob(str(b)), blob(str(b))) for b in layer.values("bottom")]
        if kind == "Input":
            p = sub_message(layer, "input_param")
            in_shapes = [f.value.values("dim") for f in p.all("shape")]
            for i, top in enumerate(tops):
                given = in_shapes[i] if i < len(in_shapes) else (in_shapes[0] if in_shapes else [])
                inputs[top] = {"shape": _shape(given, layer.loc, ctx, top), "dtype": "float32"}
            continue
        if kind == "Python" and not _python_data_layer(layer, raw_name, bottoms, tops, input_shapes, ctx):
            continue
        if kind in DATA_TYPES:
            _data_layer(layer, kind, tops, phases, inputs, input_shapes, data, ctx, notes)
            continue
        share = None
        if name in seen:
            first_loc, first_phases = seen[name]
            if set(first_phases) & set(phases):
                # Caffe wires layers by their blobs and lets two share a name (BVLC's
                # mnist_autoencoder has two 'loss' layers): the second gets a name of its own
                renamed = _free_name(name, used)
                notes.append(f"layer '{raw_name}' at line {layer.loc.line} has the name of the layer at line "
                             f"{first_loc.line} in the same phase: renamed '{renamed}' (its blobs wire it as before)")
                # its weights: the caffemodel's layer of that name in the same turn (Caffe saves them
                # in the net's order)
                turn = sum(1 for earlier in named.get(name, []) if set(earlier) & set(phases))
                ctx.extra.setdefault("renamed", {})[renamed] = (name, turn)
                named.setdefault(name, []).append(phases)
                name = renamed
            else:
                # Caffe builds one net per phase and gives the test net the trained layers of the same
                # name: here the second layer gets a name of its own and shares the first's weights
                share = name if kind in WEIGHTS else None
                name = _free_name(f"{name}_{phases[0].lower()}", used)
        else:
            seen[name] = (layer.loc, phases)
            named[name] = [phases]
        used.add(name)
        converted = caffe_layers.convert(_v1_params(layer) if v1 else layer, kind, name, bottoms, tops, ctx)
        if share is not None:
            for entry in converted:
                entry["share"] = share
        toolkit_phases = []
        if "TRAIN" in phases:
            toolkit_phases.append("train")
        if "TEST" in phases:
            toolkit_phases.append("test")
            if not (kind.endswith("Loss") or kind == "Accuracy"):
                toolkit_phases.append("infer")
        for entry in converted:
            if not deploy and toolkit_phases != ["train", "test", "infer"]:
                entry["phase"] = toolkit_phases if len(toolkit_phases) > 1 else toolkit_phases[0]
            out_layers.append(entry)
            net_values += _count_values(entry)
        if net_values > MAX_NET_VALUES:
            raise SpecError(Problem(f"the layers up to this one make a net file of more than {MAX_NET_VALUES:,} "
                                    "values: larger than any net this imports", layer.loc))
        if kind in WEIGHTS and converted and share is None:
            weighted.append((name, kind))
    # a recurrent layer's x and cont are time-major [T, N, ...]: their batch is the second axis
    given = ctx.extra.get("given_shapes", {})
    for entry in out_layers:
        bottoms = entry.get("bottom")
        if entry["type"] in ("CaffeLSTM", "CaffeRNN") and isinstance(bottoms, list):
            for name in bottoms[:2]:
                dims = given.get(name)
                if name in inputs and dims and len(dims) >= 2:
                    inputs[name] = {**inputs[name], "shape": [dims[0], "N"] + list(dims[2:])}
    # a net-level input that a loss or Accuracy reads as its labels holds integers, as one that
    # Embed reads as its indices
    for entry in out_layers:
        bottoms = entry.get("bottom")
        if entry["type"] in LABEL_READERS and isinstance(bottoms, list) and len(bottoms) > 1 \
                and bottoms[1] in inputs and inputs[bottoms[1]]["dtype"] == "float32":
            inputs[bottoms[1]] = {"shape": inputs[bottoms[1]]["shape"], "dtype": "int64"}
        # Embed's indices: Caffe's blobs hold them as floats
        if entry["type"] == "Embed" and isinstance(bottoms, str) and bottoms in inputs:
            inputs[bottoms] = {"shape": inputs[bottoms]["shape"], "dtype": "int64"}
    if not inputs and not ctx.problems:
        ctx.error("the net has no input: an Input layer, input/input_shape, or a data layer", msg.loc)
    net = {"name": _net_name(msg, prototxt), "inputs": inputs, "layers": out_layers}
    if data:
        net["train"] = {"data": data}
    return net, ctx, weighted, notes + ctx.notes


def _count_values(data) -> int:
    """The values of a net file's data, as its reader counts them: each mapping, list and scalar."""
    if isinstance(data, dict):
        return 1 + sum(_count_values(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return 1 + sum(_count_values(v) for v in data)
    return 1


def _free_name(name: str, used: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... where it is taken."""
    k, candidate = 2, name
    while candidate in used:
        candidate, k = f"{name}_{k}", k + 1
    return candidate


def _python_data_layer(layer: Message, raw_name: str, bottoms: list[str], tops: list[str], input_shapes: dict,
                       ctx: Context) -> bool:
    """Whether a Python layer is read as a data layer: one that takes no bottom and whose first top's
    shape is given (--input-shape). Any other is refused as what it is: code outside the file."""
    p = sub_message(layer, "python_param")
    what = f"{p.value('module', '?')}.{p.value('layer', '?')}"
    if not bottoms and tops and tops[0] in input_shapes:
        return True
    if not bottoms:
        ctx.error(f"layer '{raw_name}' is a Python layer ({what}): its code is not part of the model file; as it "
                  f"reads no bottom it feeds data: give the shape of what it yields with --input-shape "
                  f"{tops[0] if tops else 'data'}=C,H,W and the data itself as train.data", layer.loc)
    else:
        ctx.error(f"layer '{raw_name}' is a Python layer ({what}): its code is not part of the model file; write "
                  "what it computes with the catalog's layers, or import the deploy prototxt without it", layer.loc)
    return False


def _data_layer(layer: Message, kind: str, tops: list[str], phases: list[str], inputs: dict,
                input_shapes: dict, data: dict, ctx: Context, notes: list[str]) -> None:
    """A data layer's tops as inputs (features, then labels), its transform and batch as train.data."""
    if not tops:
        return
    features, labels = tops[0], tops[LABEL_TOPS:]
    shape = None
    if kind == "DummyData":
        shapes = [f.value.values("dim") for f in sub_message(layer, "dummy_data_param").all("shape")]
        shape = shapes[0] if shapes else None
    elif kind == "MemoryData":
        p = sub_message(layer, "memory_data_param")
        shape = [p.value("batch_size", 1), p.value("channels"), p.value("height"), p.value("width")]
    if features in input_shapes:
        shape = [1] + list(input_shapes[features])
    if shape is None or any(d is None for d in shape):
        if features not in inputs:
            ctx.error(f"layer '{layer.value('name', kind)}': the shape of what a {kind} layer reads is in its data; "
                      f"give it with --input-shape {features}=C,H,W", layer.loc)
        return
    inputs[features] = {"shape": _shape(shape, layer.loc, ctx, features), "dtype": "float32"}
    for label in labels:
        inputs[label] = {"shape": ["N"], "dtype": "int64"}
    transform = sub_message(layer, "transform_param")
    for key in ("scale", "crop_size"):
        if transform.get(key) is not None:
            data[key] = transform.value(key)
    if transform.values("mean_value"):
        data["mean_value"] = transform.values("mean_value")
    if str(transform.value("mirror", "false")) == "true":
        data["mirror"] = True
    if transform.get("mean_file") is not None:
        _mean_file(str(transform.value("mean_file")), transform.get("mean_file").loc, data, ctx, notes)
    param = next((sub_message(layer, k) for k in ("data_param", "image_data_param", "hdf5_data_param",
                                            "memory_data_param") if layer.get(k) is not None), None)
    if param is not None:
        if "TRAIN" in phases and param.get("batch_size") is not None:
            data["batch_size"] = param.value("batch_size")
        if param.get("source") is not None:
            key = "source" if "TRAIN" in phases else "test_source"
            data[key] = str(param.value("source"))
            if kind == "Data" and str(param.value("backend", "LEVELDB")).upper() == "LEVELDB":
                notes.append(f"train.data.{key} {param.value('source')}: a LevelDB, which one process at a time can "
                             "read (data-parallel training needs an LMDB: convert_imageset --backend lmdb)")
            elif kind in ("MemoryData", "WindowData"):
                notes.append(f"train.data.{key}: a {kind} layer's data is not a file the toolkit reads: give an "
                             ".npz, a CSV, an image folder or list, an LMDB or HDF5")
        if kind == "ImageData":
            for caffe_key, ours in (("root_folder", "root_folder"), ("new_height", "new_height"),
                                    ("new_width", "new_width")):
                if param.get(caffe_key) is not None and param.value(caffe_key):
                    data[ours] = param.value(caffe_key)
    if "test_source" in data and "source" in data:
        data.setdefault("test_fraction", 0)


MEAN_FILE = "mean.npy"


def _mean_file(given: str, loc: Location, data: dict, ctx: Context, notes: list[str]) -> None:
    """A binaryproto mean image (a BlobProto) as mean.npy beside the net file; where the file is
    not at hand (Caffe's paths are relative to where caffe ran), the net names mean.npy and a note
    says what to make it from."""
    data["mean_file"] = MEAN_FILE
    if "mean_image" in ctx.extra:
        return
    image, here = read_blob_file(given, loc, ctx, "transform_param.mean_file")
    if not here:
        notes.append(f"transform_param.mean_file {given} is not here: train.data.mean_file names {MEAN_FILE}, "
                     "to be made from it (toolkit import caffe converts it when it can be found)")
    if image is not None:
        ctx.extra["mean_image"] = image.reshape(image.shape[-3:]) if image.ndim >= 3 else image


def read_caffemodel(path: str):
    """The NetParameter of a binary caffemodel, read whole (bounded by protobuf's own limit)."""
    from .proto import classes
    raw = read_regular(path, MAX_CAFFEMODEL_BYTES, "caffemodel")
    net = classes()["NetParameter"]()
    try:
        net.ParseFromString(raw)
    except Exception as e:            # protobuf's DecodeError and its kin
        raise UserError(f"{path}: not a readable caffemodel ({e})") from None
    undecodable = undecodable_field(net)
    if undecodable is not None:
        raise UserError(f"{path}: not a readable caffemodel ({undecodable} is not UTF-8 text)")
    return net


def import_weights(path: str, weighted: list[tuple[str, str]], ctx: Context, notes: list[str]) -> dict[str, np.ndarray]:
    """The caffemodel's blobs of the imported layers, as the toolkit's arrays by key."""
    model = read_caffemodel(path)
    by_name = {_layer_name(layer.name): layer for layer in list(model.layer) + list(model.layers)}
    where = Location(path, 0, 0)
    out: dict[str, np.ndarray] = {}
    wanted = {name for name, _ in weighted}
    # layers of a name the prototxt uses twice in a phase (the second renamed) take the
    # caffemodel's layers of that name in turn
    renamed = ctx.extra.get("renamed", {})
    twice = {original for original, _turn in renamed.values()}
    nth: dict[str, list] = {}
    for layer in list(model.layer) + list(model.layers):
        nth.setdefault(_layer_name(layer.name), []).append(layer)
    for name, kind in weighted:
        original, turn = renamed.get(name, (name, 0))
        if original in twice:
            layer = nth[original][turn] if turn < len(nth.get(original, [])) else None
        else:
            layer = by_name.get(name)
        if layer is None or not layer.blobs:
            notes.append(f"layer '{name}' has no weights in {path}: it starts from its fillers")
            continue
        arrays = [blob_array(b, where, ctx, name) for b in layer.blobs]
        if any(a is None for a in arrays):
            continue
        out.update(WEIGHTS[kind](name, arrays))
    unused = [n for n, layer in by_name.items() if layer.blobs and n not in wanted]
    if unused:
        notes.append(f"{len(unused)} layer(s) of {path} with weights are not in this net and were left out: "
                     + ", ".join(unused[:8]) + (" ..." if len(unused) > 8 else ""))
    return out


def to_yaml(net: dict, source: str) -> str:
    """The net file's text: one line per layer, as the toolkit writes nets."""
    import yaml
    head = f"# imported from {Path(source).name} by `toolkit import caffe`\n"
    parts = [yaml.safe_dump({"name": net["name"]}, sort_keys=False),
             yaml.safe_dump({"inputs": net["inputs"]}, sort_keys=False, default_flow_style=None, width=10**6),
             "layers:\n" + "".join("  - " + yaml.safe_dump(layer, sort_keys=False, default_flow_style=True,
                                                            width=10**6).strip() + "\n" for layer in net["layers"])]
    for key in ("outputs", "transform", "train"):
        if key in net:
            parts.append(yaml.safe_dump({key: net[key]}, sort_keys=False, default_flow_style=None, width=10**6))
    return head + "".join(parts)

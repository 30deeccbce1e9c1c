"""A net's head, found from its graph and changed as Caffe users change it by hand:

- ``with_new_head``: the classifier (the last layer with learned weights on the way to the
  output) replaced by a new one of another width, with the label input, a SoftmaxWithLoss and
  an Accuracy added where the net has none (``toolkit train --new-head``);
- ``with_objective``: a net without a loss (a deploy net) given one for timing or drawing its
  train step (``toolkit bench --train``, ``toolkit graph --phase train``), as ``caffe time``
  runs backward through any net.

Both work on the net as plain data (``Net.raw``: bases merged, ``--set`` applied) and load the
result as a new Net, so that everything a net file is checked for is checked again.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..ir.graph import FLOAT_DTYPES
from .net import Net

# between the classifier and the output: layers that carry the class axis through unchanged
# in meaning (an activation, a global pooling, a reshape); a Softmax among them is what the loss
# replaces in training
PASS_THROUGH = {"ReLU", "PReLU", "ELU", "Sigmoid", "TanH", "Dropout", "Pooling", "Flatten", "Reshape", "Softmax",
                "Scale", "Bias", "BatchNorm", "Power", "AbsVal", "Clip", "GELU", "Swish", "Squeeze"}
WIDTH_TYPES = ("InnerProduct", "Convolution")     # the layers whose num_output is the number of classes


@dataclass
class Head:
    """Where a classifying net's classes come from."""
    classifier: str            # the layer with learned weights that makes the class scores
    kind: str                  # its type
    width: int                 # its num_output
    output: str                # the net's output it feeds
    scores: str                # the blob a loss reads: what enters the Softmax, else the output
    softmax: str | None        # the Softmax layer between scores and output, if any


def find_head(net: Net) -> Head:
    """The classifier of ``net``'s one float output, walking back from it through the layers
    that pass the class axis on; a UserError saying why where there is none."""
    outputs = {name: v for name, v in net.graph("infer").outputs.items() if v.dtype in FLOAT_DTYPES}
    if len(outputs) != 1:
        raise UserError(f"the net has {len(outputs)} float outputs ({', '.join(outputs) or 'none'}); a new head "
                        "replaces the classifier of one (name it with --set outputs=[NAME])")
    output = next(iter(outputs))
    weighted = {layer for _shape, layer in net.declared.values()}
    layers = [layer for layer in net.spec.layers if "infer" in layer.phases]
    blob, index, softmax, scores = output, len(layers), None, output
    while True:
        at = next((i for i in range(index - 1, -1, -1) if blob in layers[i].tops), None)
        if at is None:
            raise UserError(f"output '{output}' comes from the input '{blob}' without a layer with learned "
                            "weights: there is no classifier to replace")
        layer = layers[at]
        if layer.name in weighted:
            if layer.type not in WIDTH_TYPES or len(layer.bottoms) != 1:
                raise UserError(f"the last layer with weights before output '{output}' is '{layer.name}' "
                                f"({layer.type}); a new head replaces an InnerProduct or Convolution")
            return Head(layer.name, layer.type, int(layer.num_output), output, scores, softmax)
        if layer.type not in PASS_THROUGH or len(layer.bottoms) != 1:
            raise UserError(f"output '{output}' comes from layer '{layer.name}' ({layer.type}), which is not a "
                            "classifier's last step; a new head replaces the InnerProduct or Convolution "
                            "before a chain of activations, pooling, reshapes and a Softmax")
        if layer.type == "Softmax" and softmax is None:
            softmax, scores = layer.name, layer.bottoms[0]
        blob, index = layer.bottoms[0], at


def with_new_head(net: Net, num_classes: int) -> tuple[Net, list[str]]:
    """``net`` with its classifier replaced by a new one of ``num_classes`` outputs (its weights
    from its fillers: ``Net.fresh_layers``), the label input, a SoftmaxWithLoss in training and
    an Accuracy in testing added where the net has none; and the lines that say what changed."""
    head = find_head(net)
    data = _copy(net.raw)
    layers = data["layers"]
    notes = [f"new head: layer '{head.classifier}' ({head.kind}, {head.width} outputs before '{head.output}') "
             f"replaced by one of {num_classes} outputs, its weights from its fillers"]
    for layer in layers:
        if layer.get("name") == head.classifier:
            layer["num_output"] = num_classes
            layer.pop("share", None)
    losses = _layers_reading(net, head.scores, ("SoftmaxWithLoss",))
    accuracies = _layers_reading(net, head.scores, ("Accuracy",))
    label = _label_input(net, losses + accuracies)
    if label is None:
        label = _free_name("label", set(data["inputs"]) | {t for layer in net.spec.layers for t in layer.tops})
        data["inputs"][label] = {"shape": ["N"], "dtype": "int64"}
        notes.append(f"new head: added the input '{label}' ([N] int64 class indices)")
    names = {layer.get("name") for layer in layers}
    if not losses:
        name = _free_name("loss", names)
        layers.append({"name": name, "type": "SoftmaxWithLoss", "bottom": [head.scores, label], "top": name,
                       "phase": "train"})
        notes.append(f"new head: added '{name}' (SoftmaxWithLoss of '{head.scores}' and '{label}', phase train)")
    if not accuracies:
        name = _free_name("accuracy", names)
        layers.append({"name": name, "type": "Accuracy", "bottom": [head.scores, label], "top": name,
                       "phase": "test"})
        notes.append(f"new head: added '{name}' (Accuracy of '{head.scores}' against '{label}', phase test)")
    if head.softmax is not None:
        for layer in layers:
            if layer.get("name") == head.softmax and layer.get("phase") is None:
                layer["phase"] = "infer"     # in training the loss takes its place
    new = _reloaded(net, data)
    new.fresh_layers = net.fresh_layers | {head.classifier}
    return new, notes


def has_training_data(net: Net) -> bool:
    """Whether the net says where its training data is (else the schema's default would train a
    new head on the built-in digits, which is never what a fine-tuning meant)."""
    train = net.raw.get("train")
    return isinstance(train, dict) and isinstance(train.get("data"), dict) and "source" in train["data"]


def has_loss(net: Net) -> bool:
    """Whether the net has a loss in any phase (a type ending in Loss, or ``train.losses``): a
    deploy net has none. (One whose losses all sit outside the train phase is a mistake that the
    train graph reports, not a deploy net.)"""
    if net.spec.train and net.spec.train.losses:
        return True
    return any(layer.type.endswith("Loss") for layer in net.spec.layers)


def with_objective(net: Net) -> tuple[Net, str | None]:
    """``net`` itself when it has a loss; else (a deploy net) the net with the sum of its float
    outputs as its training objective (each output's gradient 1 everywhere: the backward pass
    from the top that ``caffe time`` runs through any net), and the line that says so."""
    if has_loss(net):
        return net, None
    outputs = [name for name, v in net.graph("infer").outputs.items() if v.dtype in FLOAT_DTYPES]
    if not outputs:
        raise UserError("the net has no loss and no float output to differentiate")
    data = _copy(net.raw)
    names = {layer.get("name") for layer in data["layers"]}
    added = []
    for output in outputs:
        name = _free_name(f"{output}_sum", names)
        names.add(name)
        data["layers"].append({"name": name, "type": "Reduction", "operation": "sum", "axis": 0, "bottom": output,
                               "top": name, "phase": "train"})
        added.append(name)
    train = data.setdefault("train", {})
    train["losses"] = added
    note = (f"note: {net.name} has no loss layer (a deploy net): its train step here is forward, then backward "
            f"from a gradient of 1 on every element of {', '.join(repr(o) for o in outputs)} (the objective "
            f"{' + '.join(f'sum({o})' for o in outputs)}), as `caffe time` runs backward through any net")
    return _reloaded(net, data), note


# -- helpers -----------------------------------------------------------------------------------
def _layers_reading(net: Net, blob: str, types: tuple[str, ...]) -> list:
    return [layer for layer in net.spec.layers if layer.type in types and layer.bottoms[:1] == [blob]]


def _label_input(net: Net, readers: list) -> str | None:
    """The label a net's own loss or accuracy reads, if it has one."""
    for layer in readers:
        if len(layer.bottoms) > 1:
            return layer.bottoms[1]
    return None


def _free_name(stem: str, taken: set) -> str:
    if stem not in taken:
        return stem
    k = 2
    while f"{stem}_{k}" in taken:
        k += 1
    return f"{stem}_{k}"


def _copy(raw: dict) -> dict:
    import copy
    return copy.deepcopy(raw)


def _reloaded(net: Net, data: dict) -> Net:
    """``data`` loaded as a net that stands where ``net`` stands (its file's folder, its zoo model)."""
    import yaml
    new = Net.load(net.file, resolve=net.resolve, text=yaml.safe_dump(data, sort_keys=False))
    new.files, new.bases, new.zoo, new.zoo_files = net.files, net.bases, net.zoo, net.zoo_files
    new.fresh_layers = net.fresh_layers
    return new

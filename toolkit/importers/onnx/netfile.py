"""The net file of an ONNX model: its inputs (symbolic dimensions by name) and one ``ONNX`` layer
whose bottoms are the inputs and whose tops are the outputs. ``toolkit infer|bench|compile|serve
model.onnx`` read a model through it, and ``toolkit import onnx`` writes it."""
from __future__ import annotations

import re

import yaml

from ...onnxtypes import ONNX_ELEMENT_TYPES
from .files import model_inputs, symbol_name, type_name

BLOB = re.compile(r"[^A-Za-z0-9_.\-/]")


def blob_name(raw: str) -> str:
    """An ONNX value name as a blob name (letters, digits and _ . - /); two names may give one
    (``y:0`` and ``y_0``): a net's blobs are named by ``blob_names``, which keeps them apart."""
    return BLOB.sub("_", raw) or "x"


def blob_names(model) -> tuple[dict[str, str], list[str], list[str]]:
    """(ONNX value name -> blob name, one to one; the blob name of each model output in order; a
    note for each name changed to keep them so). Names are given in one fixed order (the model's
    inputs, its outputs, then the nodes' outputs) so that every writer of a net from the model (the
    ONNX layer's net file, the net of layers) names each value alike; a name whose blob name
    another value already took gets the first of NAME_2, NAME_3, ... that is free. An output that
    is one of the model's inputs too is a blob of its own, as a top cannot be the net's input."""
    inputs = [i.name for i in model_inputs(model)]
    names: dict[str, str] = {}
    owner: dict[str, str] = {}
    notes = []

    def fresh(raw: str, said: str) -> str:
        base = blob_name(raw)
        name, i = base, 1
        while name in owner:
            i += 1
            name = f"{base}_{i}"
        if name != base:
            notes.append(f"note: {said} is the blob '{name}' ('{base}' is '{owner[base]}')")
        owner[name] = raw
        return name
    for raw in inputs + [o.name for o in model.graph.output] + [o for n in model.graph.node for o in n.output if o]:
        if raw not in names:
            names[raw] = fresh(raw, f"the ONNX value '{raw}'")
    outputs = [fresh(o.name, f"the model's output '{o.name}', also its input,") if o.name in inputs
               else names[o.name] for o in model.graph.output]
    return names, outputs, notes


def model_name(model, path: str) -> str:
    """The model's graph name, or its file's where an exporter left its default."""
    from pathlib import Path
    graph = model.graph.name
    return blob_name(Path(path).stem if graph in ("", "main_graph", "torch_jit", "torch-jit-export") else graph)


def net_dict(model, file: str, name: str) -> dict:
    from ...errors import UserError
    inputs = {}
    symbols: dict[str, str] = {}
    blobs, outputs, _notes = blob_names(model)
    for info in model_inputs(model):
        t = info.type.tensor_type
        if t.elem_type not in ONNX_ELEMENT_TYPES:
            raise UserError(f"{file}: input '{info.name}' is {type_name(t.elem_type)}, which has no counterpart here")
        if ONNX_ELEMENT_TYPES[t.elem_type] in ("uint8", "int8"):
            # quantized values live inside a graph; a quantized model takes floats and quantizes them
            raise UserError(f"{file}: input '{info.name}' is {ONNX_ELEMENT_TYPES[t.elem_type]}: a net's inputs are "
                            "float or integer indices, not quantized values (quantize a float input inside the "
                            "model, with QuantizeLinear)")
        dims = []
        for axis, d in enumerate(t.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                raw = d.dim_param if d.HasField("dim_param") and d.dim_param else ("N" if axis == 0 else f"D{axis}")
                dims.append(symbols.setdefault(raw, symbol_name(raw)))
        inputs[blobs[info.name]] = {"shape": dims, "dtype": ONNX_ELEMENT_TYPES[t.elem_type]}
    bottoms = list(inputs)
    tops = outputs
    layer = {"name": blob_name(name), "type": "ONNX", "file": file,
             "bottom": bottoms[0] if len(bottoms) == 1 else bottoms, "top": tops[0] if len(tops) == 1 else tops}
    net = {"name": blob_name(name), "inputs": inputs, "layers": [layer]}
    from .transform import declared_transform
    transform = declared_transform(model)       # the transform toolkit export described
    if transform is not None and all(n in inputs for n in transform["inputs"]):
        net["transform"] = transform
    return net


def net_text(model, file: str, name: str) -> str:
    return yaml.safe_dump(net_dict(model, file, name), sort_keys=False)

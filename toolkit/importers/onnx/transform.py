"""An input transform that ``toolkit export onnx`` wrote into a model, read back as the net's.

The exporter writes the transform's tensor steps as nodes named ``toolkit.input_transform/INPUT/...``
at the front of the graph and describes them in the metadata ``toolkit.input_transform``. Read
here, those nodes are taken out (the input then has the shape the transform leaves, and the graph
reads it directly), and the metadata is rewritten to say the transform is no longer in the graph;
``netfile.net_dict`` then declares it as the net's ``transform``, which ``toolkit infer`` applies.
So the model runs the transform once, as ONNX Runtime does on raw inputs.

Nodes are taken out only where they are exactly the exporter's: a chain from the input over the
ops it writes, reading nothing but the input, each other and constants of its own, and a transform
a net file can declare (not a mean image). Otherwise the model is left as it is (its nodes then
run as any other; nothing is applied twice).
"""
from __future__ import annotations

import json

PREFIX = "toolkit.input_transform/"
METADATA_KEY = "toolkit.input_transform"
MAX_RECORD_CHARS = 1 << 16
STEP_OPS = {"Gather", "Shape", "Slice", "Sub", "Cast", "Div", "Round", "Add", "Mul"}
# the step keys of an exported record and their names in a net file's transform
KEYS = {"channel_order": "channel_order", "resize": "resize", "interpolation": "interpolation", "crop": "crop_size",
        "crop_offset": "crop_offset", "raw_scale": "raw_scale", "mean": "mean", "std": "std", "scale": "scale"}


def record_of(model) -> dict | None:
    """The model's transform record (an object with per-input ``steps``), or None."""
    text = next((p.value for p in model.metadata_props if p.key == METADATA_KEY), None)
    if text is None or len(text) > MAX_RECORD_CHARS:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    steps = record.get("steps") if isinstance(record, dict) else None
    if not isinstance(steps, dict) or not steps or not all(isinstance(s, dict) for s in steps.values()):
        return None
    return record


def declared_transform(model) -> dict | None:
    """The net file's ``transform`` mapping for a model whose record says its steps are not (or no
    longer) in the graph; None where there is none or a net file cannot say it."""
    record = record_of(model)
    if record is None or record.get("in_graph"):
        return None
    return _as_net_keys(record)


def _as_net_keys(record: dict) -> dict | None:
    steps = list(record["steps"].values())
    if any(s != steps[0] for s in steps[1:]):
        return None                    # one mapping serves every input: only for the same steps
    out: dict = {"inputs": list(record["steps"])}
    for key, name in KEYS.items():
        value = steps[0].get(key)
        if value is None:
            continue
        if key == "mean" and isinstance(value, list) and value and isinstance(value[0], list):
            return None                # a mean image: a net file names it by a file
        out[name] = value
    return out


def strip_input_transform(model, arrays: dict) -> None:
    """Take the exporter's transform nodes out of ``model`` (and their constants out of ``arrays``),
    in place, where they are exactly its; see the module's docstring."""
    record = record_of(model)
    if record is None or not record.get("in_graph") or _as_net_keys(record) is None:
        return
    graph = model.graph
    inputs = {i.name: i for i in graph.input}
    own_consts = {t.name for t in graph.initializer if t.name.startswith(PREFIX)}
    plan = {}
    for name, steps in record["steps"].items():
        if name not in inputs:
            return
        chain = [n for n in graph.node if n.name.startswith(f"{PREFIX}{name}/")]
        produced = {o for n in chain for o in n.output}
        if not chain or any(n.op_type not in STEP_OPS or n.domain not in ("", "ai.onnx") or n.attribute and
                            n.op_type not in ("Gather", "Cast") or
                            any(i not in produced and i not in own_consts and i != name for i in n.input)
                            for n in chain):
            return
        last = chain[-1].output[0]
        if any(o.name == last for o in graph.output) or \
                any(o != last and _read_outside(graph, o, chain) for n in chain for o in n.output):
            return
        plan[name] = (chain, last, steps)
    for name, (chain, last, steps) in plan.items():
        removed = {id(n) for n in chain}
        kept = [n for n in graph.node if id(n) not in removed]
        del graph.node[:]
        graph.node.extend(kept)
        _rename(graph, last, name)
        crop = steps.get("crop")
        dims = inputs[name].type.tensor_type.shape.dim
        if crop and len(dims) == 4:
            for d, size in zip(dims[2:], crop):
                d.Clear()
                d.dim_value = int(size)
    used = {i for n in graph.node for i in _all_inputs(n)}
    kept_inits = [t for t in graph.initializer if not (t.name in own_consts and t.name not in used)]
    for t in graph.initializer:
        if t.name in own_consts and t.name not in used:
            arrays.pop(t.name, None)
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            p.value = json.dumps({**record, "in_graph": False})


def _read_outside(graph, value: str, chain) -> bool:
    members = {id(n) for n in chain}
    return any(value in _all_inputs(n) for n in graph.node if id(n) not in members) or \
        any(o.name == value for o in graph.output)


def _all_inputs(node) -> set[str]:
    """The values a node reads, its subgraphs' reads of outer names included."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in list(attr.g.node if attr.HasField("g") else []) + [n for g in attr.graphs for n in g.node]:
            names |= _all_inputs(sub)
    return names


def _rename(graph, old: str, new: str) -> None:
    """Every read of ``old`` (in subgraphs too) reads ``new``."""
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new
        for attr in node.attribute:
            subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
            for sub in subs:
                _rename(sub, old, new)

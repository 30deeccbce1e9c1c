"""The Caffe-style layer catalog: one parameter model and one lowering per YAML layer type.

``NetSpec`` is the pydantic model of a whole net file over this catalog.
"""
from functools import lru_cache

from pydantic import BaseModel

from schemas.net import build_net_model

from . import (  # noqa: F401  (registration)
    activations,
    attention,
    caffe_extra,
    control,
    conv,
    dense,
    embed,
    losses,
    normalization,
    onnx,
    recurrent,
    scale,
    structure,
    tensors,
)
from .registry import LAYERS, LayerDef, LayerError

NetSpec = build_net_model([d.params for d in LAYERS.values()])


def _type_names(data) -> set[str]:
    """Every string under a ``type`` key anywhere in a net's plain data (its layers', its blocks'
    layers', and others' such as a solver's: only the catalog's names count)."""
    names, stack = set(), [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            kind = item.get("type")
            if isinstance(kind, str):
                names.add(kind)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return names


@lru_cache(maxsize=64)
def _net_model_over(types: frozenset[str]) -> type[BaseModel]:
    models = [LAYERS[t].params for t in sorted(types)]
    if len(models) == 1:                  # a discriminated union needs two members
        models.append(next(d.params for t, d in LAYERS.items() if t not in types))
    return build_net_model(models)


def net_model_for(data) -> type[BaseModel]:
    """``NetSpec`` over only the layer types the net's data names: validates a net as the whole
    catalog does (a type the catalog lacks fails the same way, and the errors name the catalog's
    types), at the cost of building those types' validators only."""
    types = frozenset(t for t in _type_names(data) if t in LAYERS)
    return _net_model_over(types) if types else NetSpec


__all__ = ["LAYERS", "LayerDef", "LayerError", "NetSpec", "net_model_for"]

"""Pydantic models of the net file format (docs/spec.md sections 1 and 3); depends on pydantic only.

The names below are imported when first asked for, so that a reader of one format (the zoo's
model cards, schemas/card.py) does not build every layer's model."""
from importlib import import_module

_WHERE = {"PHASES": "base", "Filler": "base", "InputSpec": "base", "LayerBase": "base", "ParamLayerBase": "base",
          "build_net_model": "net", "json_schema": "net", "TrainSpec": "train"}

__all__ = ["PHASES", "Filler", "InputSpec", "LayerBase", "ParamLayerBase", "build_net_model",
           "json_schema", "TrainSpec"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

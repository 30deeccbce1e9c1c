"""Pydantic models of the net file format (docs/spec.md sections 1 and 3); depends on pydantic only."""
from .base import PHASES, Filler, InputSpec, LayerBase, ParamLayerBase
from .net import build_net_model, json_schema
from .train import TrainSpec

__all__ = ["PHASES", "Filler", "InputSpec", "LayerBase", "ParamLayerBase", "build_net_model",
           "json_schema", "TrainSpec"]

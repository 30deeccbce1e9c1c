"""The Caffe-style layer catalog: one parameter model and one lowering per YAML layer type.

``NetSpec`` is the pydantic model of a whole net file over this catalog.
"""
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

__all__ = ["LAYERS", "LayerDef", "LayerError", "NetSpec"]

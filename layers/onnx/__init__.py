"""ONNX graphs as the toolkit's primitives: ``convert`` (the importer of one graph: values,
constants folded with symbolic shapes), ``fold`` (constant folding), ``ops`` (one converter per
ONNX op type), ``logic`` and ``windows`` (ops written in several primitives) and ``layer`` (the
ONNX layer type, which lowers a model file inside a net)."""
from . import control, fold, layer, logic, ops, recurrent  # noqa: F401  (registration: converters, folder, layer)
from .convert import Imported, import_model, import_proto

__all__ = ["Imported", "import_model", "import_proto"]

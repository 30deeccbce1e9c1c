"""ONNX models in: ``import_model(path)`` reads a model (opset 13 and up) into the toolkit's graph
of primitive ops and its weights, so the optimiser, the kernels and the buckets run it."""
from .model import Imported, import_model

__all__ = ["Imported", "import_model"]

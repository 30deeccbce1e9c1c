"""Primitive ops: importing this package registers every OpDef in ``OPS``."""
from . import collective, control, conv, elementwise, fused, indexing, layout, linalg, pool, precision, reduce, shape, softmax, transfer  # noqa: F401  (registration)
from .base import OPS, Builder, OpDef, ShapeError, get_op

__all__ = ["OPS", "Builder", "OpDef", "ShapeError", "get_op"]

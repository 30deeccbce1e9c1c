"""Primitive ops: importing this package registers every OpDef in ``OPS``."""
from . import (  # noqa: F401  (registration)
    collective,
    control,
    conv,
    elementwise,
    fused,
    fused_reduce,
    indexing,
    layout,
    linalg,
    nhwc,
    p2p,
    pool,
    precision,
    quant,
    reduce,
    shape,
    softmax,
    transfer,
)
from .base import OPS, Builder, OpDef, ShapeError, get_op

__all__ = ["OPS", "Builder", "OpDef", "ShapeError", "get_op"]

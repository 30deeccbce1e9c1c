"""Shared shape and dtype rules for op definitions."""
from __future__ import annotations

from typing import Sequence

from ..ir.dims import Dim, format_dim
from ..ir.graph import FLOAT_DTYPES, TensorType
from .base import ShapeError


def fmt_shape(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(format_dim(d) for d in shape) + "]"


def broadcast_shapes(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """Numpy broadcasting over symbolic dimensions (1 stretches; other dims must be equal)."""
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dim: Dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if dim == 1:
                dim = d
            elif dim != d:
                raise ShapeError("shapes " + " and ".join(fmt_shape(s) for s in shapes) + " cannot broadcast")
        out.append(dim)
    return tuple(out)


def same_dtype(types: Sequence[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"inputs have different dtypes: {', '.join(sorted(dtypes))}")
    return types[0].dtype


def need_float(t: TensorType, what: str = "input") -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{what} must be a float type ({', '.join(FLOAT_DTYPES)}), got {t.dtype}")


def need_rank(t: TensorType, rank: int, what: str = "input") -> None:
    if t.rank != rank:
        raise ShapeError(f"{what} must have {rank} dimensions, got {fmt_shape(t.shape)}")


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def unary_same(types: list[TensorType], attrs: dict) -> list[TensorType]:
    need_float(types[0])
    return [types[0]]


def binary_broadcast(types: list[TensorType], attrs: dict) -> list[TensorType]:
    dtype = same_dtype(types)
    return [TensorType(broadcast_shapes(types[0].shape, types[1].shape), dtype)]


def like_input(index: int):
    """Output has the type of input ``index`` (used by gradient helpers)."""
    def infer(types: list[TensorType], attrs: dict) -> list[TensorType]:
        return [types[index]]
    return infer


def elementwise_flops(per_element: int):
    def flops(ins, outs, attrs) -> Dim:
        return per_element * outs[0].numel
    return flops

"""The layer catalog's registry: each YAML layer type maps to its parameter model and lowering."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from schemas.base import LayerBase
from toolkit.ir.graph import FLOAT_DTYPES


class LayerError(ValueError):
    """A lowering found the layer's parameters or inputs unusable; ``key`` names the YAML key."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class LayerDef:
    type: str
    params: type[LayerBase]
    lower: Callable      # (params, LowerContext, bottoms: list[Value]) -> list[Value]


LAYERS: dict[str, LayerDef] = {}


def layer(params: type[LayerBase]):
    """Register a lowering for the layer model ``params`` (whose ``type`` is a one-value Literal)."""
    type_name = params.model_fields["type"].annotation.__args__[0]

    def wrap(lower):
        if type_name in LAYERS:
            raise RuntimeError(f"layer type {type_name} registered twice")
        LAYERS[type_name] = LayerDef(type_name, params, lower)
        return lower
    return wrap


def pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (value[0], value[1])


def layer_axis(axis: int, x, ctx, key: str = "axis") -> int:
    """``axis`` of the input ``x`` as a non-negative index (negative counts from the end)."""
    if not -x.rank <= axis < x.rank:
        raise LayerError(f"{key} {axis} is out of range for the input {ctx.fmt(x)}", key)
    return axis % x.rank


def need_float_input(x, type_name: str) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise LayerError(f"{type_name} needs a float input, got {x.dtype}", "bottom")


def static_dim(d, what: str, key: str | None = None) -> int:
    if not isinstance(d, int):
        raise LayerError(f"{what} must be a fixed number, got the symbolic dimension {d}", key)
    return d

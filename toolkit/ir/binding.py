"""Binding symbolic dimensions to numbers from the shapes of the arrays a caller passes in."""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import UserError
from .dims import Sym, format_dim
from .graph import Graph

LENGTHS = "@lengths:{}"    # the input of each example's real length along a bucketed dimension (T)


def lengths_input(symbol: str) -> str:
    """The graph input holding each example's real length along the bucketed dimension ``symbol``:
    [N] int64, filled by whoever pads the inputs up to their bucket (runtime/session.py, the trainer);
    '@' keeps it apart from the net's own inputs, whose names cannot hold one."""
    return LENGTHS.format(symbol)


def bind_symbols(graph: Graph, shapes: Mapping[str, tuple[int, ...]], optional=()) -> dict[str, int]:
    """Solve every input's symbolic dims from concrete shapes; a mismatch is a UserError.
    ``optional``: inputs that may be left out (the lengths a session fills in itself)."""
    bindings: dict[str, int] = {}
    for name, value in graph.inputs.items():
        if name not in shapes and name in optional:
            continue
        if name not in shapes:
            raise UserError(f"input '{name}' is missing (the net's inputs: {', '.join(graph.inputs)})")
        shape = tuple(shapes[name])
        declared = "[" + ", ".join(format_dim(d) for d in value.shape) + "]"
        if len(shape) != value.rank:
            raise UserError(f"input '{name}' has shape {list(shape)} but the net declares {declared}")
        for dim, actual in zip(value.shape, shape):
            if isinstance(dim, int):
                if dim != actual:
                    raise UserError(f"input '{name}' has shape {list(shape)} but the net declares {declared}")
                continue
            (symbol,) = dim.symbols
            if symbol in bindings and bindings[symbol] != actual:
                raise UserError(f"input '{name}' gives {symbol}={actual} but another input gave "
                                f"{symbol}={bindings[symbol]}")
            if actual < 1:
                raise UserError(f"input '{name}' has an empty dimension {symbol}=0")
            bindings[symbol] = actual
    return bindings


def bind_attrs(value: Any, bindings: Mapping[str, int]) -> Any:
    """Replace symbolic dimensions inside attributes (tuples, dicts) by their numbers."""
    if isinstance(value, Sym):
        return value.evaluate(bindings)
    if isinstance(value, tuple):
        return tuple(bind_attrs(v, bindings) for v in value)
    if isinstance(value, dict):
        return {k: bind_attrs(v, bindings) for k, v in value.items()}
    return value

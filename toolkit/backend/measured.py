"""Choices a device's kernels make by measuring, once per process (which route a GPU convolution
takes), recorded so that a training run can keep them with its checkpoints and a resumed run take
them again without measuring: two processes that measured apart could choose differently, and
the routes sum in different orders.

A kernels module registers each store of choices under a name with ``register_measured``: an
``export()`` giving them as JSON data, and an ``adopt(data)`` that checks data read back (it is
not trusted: a ValueError saying what is wrong) and installs it, returning the lines to say (a
recorded route that cannot be taken now). Nothing on this floor imports the kernels: they
register here when the registry loads them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..errors import UserError
from .registry import load_kind

# device kind -> name -> (export, adopt)
_STORES: dict[str, dict[str, tuple[Callable[[], Any], Callable[[Any], list[str]]]]] = {}


def register_measured(kind: str, name: str, export: Callable[[], Any], adopt: Callable[[Any], list[str]]) -> None:
    _STORES.setdefault(kind, {})[name] = (export, adopt)


def recorded(kind: str) -> dict[str, Any]:
    """What this process's kernels of ``kind`` chose by measuring, as JSON data by store name."""
    return {name: export() for name, (export, _adopt) in sorted(_STORES.get(kind, {}).items())}


def adopt(kind: str, data: Any, where: Path | str) -> list[str]:
    """Installs the choices ``data`` records (``recorded``'s output, read from ``where``) before
    any plan is built; returns the lines to say. Data that is not such a record is a UserError
    naming ``where``."""
    load_kind(kind)
    stores = _STORES.get(kind, {})
    if not isinstance(data, dict):
        raise UserError(f"{where}: not a readable checkpoint (its measured routes are not a mapping)")
    unknown = sorted(str(name)[:40] for name in data if name not in stores)
    if unknown:
        raise UserError(f"{where}: not a readable checkpoint (it records measured routes of "
                        f"'{unknown[0]}', which no {kind} kernel takes)")
    lines = []
    for name, value in data.items():
        try:
            lines += stores[name][1](value)
        except ValueError as e:
            raise UserError(f"{where}: not a readable checkpoint (its measured routes of '{name}': {e})") from None
    return lines

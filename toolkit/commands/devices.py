"""The ``--device`` and ``--dtype`` flags of every command: checked before any work starts, so a
GPU that is not there or a dtype a device cannot run is one clear error line (status 2)."""
from __future__ import annotations

import sys

from ..errors import UserError
from ..runtime.devices import LOW_PRECISION, check_device_exists, parse_device

_told: set[str] = set()


def check_device(device: str) -> str:
    """The device's name, after checking it can run here (CuPy and a GPU for ``gpu``)."""
    parsed = parse_device(device)
    if parsed.kind == "gpu":
        check_device_exists(parsed)
    from ..kernels.registry import load_device
    load_device(parsed.name)
    return parsed.name


def resolve_dtype(dtype: str | None, device: str) -> str | None:
    """The dtype the kernels compute in for ``--dtype`` on ``device``. A CPU runs float16 and
    bfloat16 through its float32 kernels (numpy has no fast half-precision arithmetic and no
    bfloat16 at all) and says so once. The GPU has no half-precision kernels yet (CuPy has no
    bfloat16 arrays at all): asking is an error naming what it has."""
    if dtype not in LOW_PRECISION:
        return dtype
    kind = parse_device(device).kind
    if kind == "cpu":
        if dtype not in _told:
            _told.add(dtype)
            print(f"note: {dtype} on cpu runs through the float32 kernels (results and outputs in float32)",
                  file=sys.stderr)
        return "float32"
    if dtype == "bfloat16":
        raise UserError("no gpu kernels for dtype bfloat16 (CuPy has no bfloat16 arrays); the gpu has "
                        "float32 and float64; bfloat16 runs on cpu through float32")
    raise UserError("no gpu kernels for dtype float16 yet (the gpu has float32 and float64); "
                    "float16 runs on cpu through float32")

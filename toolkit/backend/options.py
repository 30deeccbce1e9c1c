"""The ``--device`` and ``--dtype`` options, for the commands and ``toolkit.load`` alike: checked
before any work starts, so a GPU that is not there or a dtype a device cannot run is one clear
error line (status 2) or one ``UserError``."""
from __future__ import annotations

from ..errors import notice
from ..ir.graph import LOW_PRECISION
from .devices import Device, parse_device
from .registry import load_device


def check_device(device: str | Device) -> Device:
    """The device, after checking it can run here (CuPy and a GPU for ``gpu``) and loading its
    kernels."""
    parsed = parse_device(device)
    parsed.check_exists()
    load_device(parsed)
    return parsed


def resolve_dtype(dtype: str | None, device: str | Device) -> str | None:
    """The dtype an infer graph is built in for ``--dtype`` on ``device``. A half type the device
    holds natively (float16 on a GPU) runs as such (GEMMs, reductions and softmax accumulate in
    float32); the others run through the float32 kernels (numpy has no fast half-precision
    arithmetic and no bfloat16 at all, CuPy no bfloat16), which is said once."""
    if dtype not in LOW_PRECISION:
        return dtype
    device = parse_device(device)
    if dtype in device.native_half_types:
        return dtype
    _note(f"{dtype} on {device.kind} runs through the float32 kernels ({device.why_emulated(dtype)}); "
          "results and outputs in float32")
    return "float32"


def resolve_train_dtype(dtype: str | None, device: str | Device) -> str | None:
    """The mixed-precision dtype a train step uses for ``--dtype`` (None: plain float32 or
    float64 training). Where the device has no arrays of that type, its values are stored as
    float32 and rounded to it at every cast (passes/precision.py): the numerics of the half type,
    not its speed."""
    if dtype not in LOW_PRECISION:
        return None
    device = parse_device(device)
    if dtype not in device.native_half_types:
        _note(f"mixed precision in {dtype} on {device.kind}: {dtype} values are stored as float32 and rounded "
              f"to {dtype} at each cast (its numerics, not its speed)")
    return dtype


def _note(line: str) -> None:
    notice(line, once=line)

"""The ``--device`` and ``--dtype`` flags of every command: checked before any work starts, so a
GPU that is not there or a dtype a device cannot run is one clear error line (status 2)."""
from __future__ import annotations


from ..errors import notice
from ..runtime.devices import LOW_PRECISION, check_device_exists, parse_device



def check_device(device: str) -> str:
    """The device's name, after checking it can run here (CuPy and a GPU for ``gpu``)."""
    parsed = parse_device(device)
    if parsed.kind == "gpu":
        check_device_exists(parsed)
    from ..kernels.registry import load_device
    load_device(parsed.name)
    return parsed.name


def resolve_dtype(dtype: str | None, device: str) -> str | None:
    """The dtype an infer graph is built in for ``--dtype`` on ``device``. The GPU runs float16
    in float16 (GEMMs, reductions and softmax accumulate in float32). A CPU runs float16 and
    bfloat16 through its float32 kernels (numpy has no fast half-precision arithmetic and no
    bfloat16 at all), and so does the GPU for bfloat16 (CuPy has no bfloat16 arrays); each says
    so once."""
    if dtype not in LOW_PRECISION:
        return dtype
    kind = parse_device(device).kind
    if kind == "gpu" and dtype == "float16":
        return dtype
    why = "CuPy has no bfloat16 arrays" if kind == "gpu" else "numpy has no fast half-precision arithmetic"
    _note(f"{dtype} on {kind} runs through the float32 kernels ({why}); results and outputs in float32")
    return "float32"


def resolve_train_dtype(dtype: str | None, device: str) -> str | None:
    """The mixed-precision dtype a train step uses for ``--dtype`` (None: plain float32 or
    float64 training). Where the device has no arrays of that type, its values are stored as
    float32 and rounded to it at every cast (passes/precision.py): the numerics of the half type,
    not its speed."""
    if dtype not in LOW_PRECISION:
        return None
    kind = parse_device(device).kind
    if kind == "cpu" or dtype == "bfloat16":
        _note(f"mixed precision in {dtype} on {kind}: {dtype} values are stored as float32 and rounded "
              f"to {dtype} at each cast (its numerics, not its speed)")
    return dtype


def _note(line: str) -> None:
    notice(line, once=line)

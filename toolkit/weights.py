"""Weights files (docs/spec.md section 2): LAYER.PARAM keys in .safetensors or .npz (pickle refused),
fillers that start weights a file does not give, and atomic writes."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from .arrayfiles import check_file, load_npz, unsupported_format
from .errors import UserError, did_you_mean
from .fileio import atomic_write

FORMATS = (".safetensors", ".npz")


def fill(init: dict, shape: tuple[int, ...], dtype: str, fan_in: int, fan_out: int,
         rng: np.random.Generator) -> np.ndarray:
    """An array started by a filler spec (Caffe's definitions of xavier and msra)."""
    kind = init["type"]
    if kind == "constant":
        return np.full(shape, init.get("value", 0.0), dtype=dtype)
    if kind == "uniform":
        return rng.uniform(init.get("min", 0.0), init.get("max", 1.0), size=shape).astype(dtype)
    if kind == "gaussian":
        return rng.normal(init.get("mean", 0.0), init.get("std", 1.0), size=shape).astype(dtype)
    norm = init.get("variance_norm", "fan_in")
    n = {"fan_in": fan_in, "fan_out": fan_out, "average": (fan_in + fan_out) / 2}[norm]
    if kind == "xavier":
        bound = np.sqrt(3.0 / n)
        return rng.uniform(-bound, bound, size=shape).astype(dtype)
    if kind == "msra":
        return rng.normal(0.0, np.sqrt(2.0 / n), size=shape).astype(dtype)
    raise ValueError(f"unknown filler {kind}")


def load_weights(path: str) -> dict[str, np.ndarray]:
    if Path(path).suffix not in FORMATS:
        raise unsupported_format(path, "weights", ".safetensors or .npz")
    check_file(path)
    if Path(path).suffix == ".npz":
        return load_npz(path)
    return _load_safetensors(path)


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    try:
        return dict(load_file(path))
    except Exception as e:  # the library raises its own error types for every malformation
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: not a readable .safetensors file ({reason})") from None


def check_weights(path: str, loaded: Mapping[str, np.ndarray], declared: Mapping[str, tuple],
                  allow_missing: bool = False) -> None:
    """Every declared key present with its shape and a float dtype; no key left over."""
    problems = []
    for key, (shape, _layer) in declared.items():
        if key not in loaded:
            if not allow_missing:
                problems.append(f"{path}: missing weight '{key}' of shape {list(shape)} "
                                "(pass --allow-missing to start it from its filler)")
            continue
        arr = loaded[key]
        if tuple(arr.shape) != tuple(shape):
            problems.append(f"{path}: weight '{key}' has shape {list(arr.shape)}, the net needs {list(shape)}")
        elif arr.dtype.kind not in "fiu":
            problems.append(f"{path}: weight '{key}' has dtype {arr.dtype}, expected a float array")
    for key in loaded:
        if key not in declared:
            problems.append(f"{path}: unexpected weight '{key}' (the net has no such parameter)"
                            f"{did_you_mean(key, declared)}")
    if problems:
        raise UserError(*problems)


def save_weights(path: str, arrays: Mapping[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write atomically (see fileio.atomic_write): .npz, or .safetensors with optional metadata."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    contiguous = {k: np.asarray(v, order="C") for k, v in arrays.items()}   # keeps 0-d arrays 0-d

    def write(tmp: str) -> None:
        if target.suffix == ".npz":
            with open(tmp, "wb") as f:
                np.savez(f, **contiguous)
        else:
            from safetensors.numpy import save_file
            save_file(contiguous, tmp, metadata=metadata)
    atomic_write(target, write)

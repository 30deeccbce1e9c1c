"""Weights files (docs/spec.md section 2): LAYER.PARAM keys in .safetensors or .npz (pickle refused),
fillers that start weights a file does not give, and atomic writes. A file is checked against
the net by what it claims (each array's key, shape and dtype, read from its header) before any
array is read, so a file that claims what the net does not need costs nothing to refuse."""
from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from .arrayfiles import check_file, open_npz, unsupported_format
from .errors import UserError, did_you_mean
from .fileio import atomic_write

FORMATS = (".safetensors", ".npz")


# Random fillers draw this many values at a time (in float64, numpy's only precision for them)
# into the array of the net's dtype: the same values as one draw, without a float64 copy of the
# whole array (VGG-16's fc6 alone would be 822 MB of them).
FILL_CHUNK = 1 << 20


def _drawn(draw, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    out = np.empty(shape, dtype=dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, FILL_CHUNK):
        flat[start:start + FILL_CHUNK] = draw(min(FILL_CHUNK, flat.size - start))
    return out


def fill(init: dict, shape: tuple[int, ...], dtype: str, fan_in: int, fan_out: int,
         rng: np.random.Generator) -> np.ndarray:
    """An array started by a filler spec (Caffe's definitions of xavier and msra)."""
    kind = init["type"]
    if kind == "constant":
        return np.full(shape, init.get("value", 0.0), dtype=dtype)
    if kind == "uniform":
        low, high = init.get("min", 0.0), init.get("max", 1.0)
        return _drawn(lambda k: rng.uniform(low, high, size=k), shape, dtype)
    if kind == "gaussian":
        mean, std = init.get("mean", 0.0), init.get("std", 1.0)
        drawn = _drawn(lambda k: rng.normal(mean, std, size=k), shape, dtype)
        if init.get("sparse") and shape:
            keep = min(1.0, init["sparse"] / shape[0])
            drawn *= (rng.random(shape) < keep).astype(dtype)
        return drawn
    if kind == "bilinear":
        return _bilinear(shape, dtype)
    if kind == "onnx_initializer":                   # an ONNX layer's parameter: the model file's value
        from .importers.onnx.files import loaded_model
        arr = loaded_model(init["file"]).arrays.get(init["name"])
        if arr is None or tuple(arr.shape) != tuple(shape):
            raise UserError(f"{init['file']}: no initializer '{init['name']}' of shape {list(shape)}")
        return np.asarray(arr, dtype=dtype)
    if kind == "identity":                           # a square matrix's identity (InfogainLoss's default H)
        if len(shape) != 2 or shape[0] != shape[1]:
            raise UserError(f"the identity filler needs a square matrix, not {list(shape)}")
        return np.eye(shape[0], dtype=dtype)
    if kind == "positive_unitball":
        drawn = _drawn(lambda k: rng.uniform(0.0, 1.0, size=k), shape, dtype)
        rows = drawn.reshape(shape[0], -1) if shape else drawn.reshape(1, -1)
        rows /= rows.sum(axis=1, keepdims=True)
        return drawn
    norm = init.get("variance_norm", "fan_in")
    n = {"fan_in": fan_in, "fan_out": fan_out, "average": (fan_in + fan_out) / 2}[norm]
    if kind == "xavier":
        bound = np.sqrt(3.0 / n)
        return _drawn(lambda k: rng.uniform(-bound, bound, size=k), shape, dtype)
    if kind == "msra":
        std = np.sqrt(2.0 / n)
        return _drawn(lambda k: rng.normal(0.0, std, size=k), shape, dtype)
    raise ValueError(f"unknown filler {kind}")


def _bilinear(shape: tuple, dtype) -> np.ndarray:
    """Caffe's BilinearFiller: with f = ceil(k / 2) and c = (2f - 1 - f % 2) / (2f), the value at
    (y, x) is (1 - |x / f - c|)(1 - |y / f - c|), the same for every [O, I] pair."""
    if len(shape) != 4 or shape[2] != shape[3]:
        raise UserError(f"the bilinear filler needs a square 4-D kernel [O, I, k, k], not {list(shape)}")
    k = shape[3]
    f = math.ceil(k / 2)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    line = 1 - np.abs(np.arange(k) / f - c)
    return np.broadcast_to(np.outer(line, line), shape).astype(dtype)


@dataclass(frozen=True)
class Claim:
    """What a weights file says of one array before it is read."""
    shape: tuple[int, ...]
    dtype: np.dtype


# safetensors' dtype names as numpy dtypes (bfloat16, which numpy lacks, as another float:
# check_weights asks only the kind)
_SAFETENSORS_DTYPES = {"F16": "f2", "BF16": "f2", "F32": "f4", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4",
                       "I64": "i8", "U8": "u1", "U16": "u2", "U32": "u4", "U64": "u8", "BOOL": "?"}


def load_weights(path: str, declared: Mapping[str, tuple] | None = None,
                 allow_missing: bool = False, report: list | None = None,
                 fresh: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """The arrays of a weights file; with ``declared`` (the net's key -> (shape, layer)) every
    key, shape and dtype is checked first, from the file's headers, and nothing is read unless
    all of them pass (with ``allow_missing``, only the arrays that will be copied are read).
    ``report``: a list the CopyReport is appended to. ``fresh``: declared keys that start from
    their fillers, whatever the file holds under them (check_weights)."""
    if Path(path).suffix not in FORMATS:
        raise unsupported_format(path, "weights", ".safetensors or .npz")
    check_file(path)
    if Path(path).suffix == ".npz":
        members = open_npz(path)
        try:
            claims = {k: Claim((rows.rows,) + tuple(rows.row_shape) if rows.rows is not None else (), rows.dtype)
                      for k, rows in members.items()}
            keys = list(members)
            if declared is not None:
                keys = _keep(check_weights(path, claims, declared, allow_missing, fresh), keys, report)
            return {k: members[k].read_all() for k in keys}
        finally:
            for rows in members.values():
                rows.close()
    return _load_safetensors(path, declared, allow_missing, report, fresh)


def _keep(checked: "CopyReport", keys: list[str], report: list | None) -> list[str]:
    """The keys to read: all of them when the file matched the net, else those copied."""
    if report is not None:
        report.append(checked)
    return keys if checked.complete else list(checked.copied)


def _load_safetensors(path: str, declared: Mapping[str, tuple] | None, allow_missing: bool,
                      report: list | None = None, fresh: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    from safetensors import safe_open
    with _reading_safetensors(path), safe_open(path, framework="numpy") as f:
        keys = list(f.keys())
        if declared is not None:
            claims = {}
            for key in keys:
                part = f.get_slice(key)
                claims[key] = Claim(tuple(part.get_shape()), np.dtype(_SAFETENSORS_DTYPES.get(part.get_dtype(), "V1")))
            keys = _keep(check_weights(path, claims, declared, allow_missing, fresh), keys, report)
        return {key: f.get_tensor(key) for key in keys}


@contextlib.contextmanager
def _reading_safetensors(path: str):
    try:
        yield
    except UserError:
        raise
    except Exception as e:  # the library raises its own error types for every malformation
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: not a readable .safetensors file ({reason})") from None


@dataclass
class CopyReport:
    """What loading a weights file into a net copied and what it could not (Caffe's
    ``copy_from`` and PyTorch's ``strict=False``): by weight key, with the layer it belongs to."""
    copied: list[str]
    new: list[tuple[str, str, tuple]]                 # (key, layer, the net's shape): not in the file
    reshaped: list[tuple[str, str, tuple, tuple]]     # (key, layer, file's shape, net's shape)
    unexpected: list[tuple[str, tuple]]               # (key, file's shape): the net has no such weight
    # (key, layer, the file's shape or None, the net's shape): a new layer's, left to its filler
    fresh: list[tuple[str, str, tuple | None, tuple]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not (self.new or self.reshaped or self.unexpected or self.fresh)

    def lines(self, path: str) -> list[str]:
        """A table of what was not copied, after one line of counts."""
        total = len(self.copied) + len(self.new) + len(self.reshaped) + len(self.fresh)
        out = [f"weights from {path}: copied {len(self.copied)} of the net's {total} arrays"
               + (f"; {len(self.unexpected)} in the file ignored" if self.unexpected else "")]
        rows = ([(layer, key, "-", _shape(net), "new: starts from its filler") for key, layer, net in self.new]
                + [(layer, key, _shape(old), _shape(net), "reshaped: starts from its filler")
                   for key, layer, old, net in self.reshaped]
                + [("-", key, _shape(old), "-", "not in the net: ignored") for key, old in self.unexpected]
                + [(layer, key, "-" if old is None else _shape(old), _shape(net),
                    "new layer: starts from its filler" + ("" if old is None else ", the file's array left out"))
                   for key, layer, old, net in self.fresh])
        if rows:
            rows.insert(0, ("layer", "weight", "file", "net", ""))
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
        return out


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


PARTIAL_HINT = "pass --allow-missing to copy what matches and start the rest from their fillers"


def check_weights(path: str, loaded: Mapping[str, "np.ndarray | Claim"], declared: Mapping[str, tuple],
                  allow_missing: bool = False, fresh: frozenset[str] = frozenset()) -> CopyReport:
    """Every declared key present with its shape and a float dtype, and no key left over (arrays,
    or what a file claims of them). ``allow_missing``: a weight that is absent or has another
    shape is left to its filler and a key the net lacks is ignored, all of it in the report; a
    non-float array is an error either way. ``fresh``: keys of new layers, left to their fillers
    whatever the file holds (in the report, never an error). Raises with every problem, each
    naming the layer."""
    problems = []
    report = CopyReport([], [], [], [])
    for key, (shape, layer) in declared.items():
        if key in fresh:
            report.fresh.append((key, layer, tuple(loaded[key].shape) if key in loaded else None, tuple(shape)))
            continue
        if key not in loaded:
            report.new.append((key, layer, tuple(shape)))
            if not allow_missing:
                problems.append(f"{path}: missing weight '{key}' of layer '{layer}', shape {list(shape)} "
                                f"({PARTIAL_HINT})")
            continue
        arr = loaded[key]
        if tuple(arr.shape) != tuple(shape):
            report.reshaped.append((key, layer, tuple(arr.shape), tuple(shape)))
            if not allow_missing:
                problems.append(f"{path}: weight '{key}' of layer '{layer}' has shape {list(arr.shape)} in the "
                                f"file, the net needs {list(shape)} (rename the layer to train it afresh, or "
                                f"{PARTIAL_HINT})")
        elif arr.dtype.kind not in "fiu":
            problems.append(f"{path}: weight '{key}' has dtype {arr.dtype}, expected a float array")
        else:
            report.copied.append(key)
    for key in loaded:
        if key not in declared:
            report.unexpected.append((key, tuple(loaded[key].shape)))
            if not allow_missing:
                problems.append(f"{path}: unexpected weight '{key}' (the net has no such parameter"
                                f"{did_you_mean(key, declared)}); {PARTIAL_HINT}")
    if problems:
        raise UserError(*problems)
    return report


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
            try:
                save_file(contiguous, tmp, metadata=metadata)
            except Exception as e:         # safetensors reports an OS error in its own words
                code = re.search(r"\(os error (\d+)\)", str(e))
                if code is None:
                    raise
                raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), tmp) from None
    atomic_write(target, write)

"""``toolkit data --out FILE.csv``: a split of a net's data as the CSV that a net's
``train.data.source`` and ``toolkit infer --input`` read back (see ``arrayfiles.table``)."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..fileio import atomic_write

# rows formatted at a time: the text of one block is held, never the whole file's
_BLOCK_ROWS = 4096
# the CSV reader parses every cell as a float64: integers beyond this do not come back exactly
_EXACT_INT = 2 ** 53


def csv_columns(arrays: dict[str, np.ndarray], label: str) -> list[str]:
    """The header: the feature array's values flattened row-major, ``NAME_0``, ``NAME_1``, ...
    (``NAME`` alone for one value per example), then the label column, named after the label
    input (the name the CSV reader looks for)."""
    (features,) = [name for name in arrays if name != label]
    width = int(np.prod(arrays[features].shape[1:], dtype=np.int64))
    names = [features] if arrays[features].ndim == 1 else [f"{features}_{i}" for i in range(width)]
    if label in names:
        raise UserError(f"--out: feature column '{label}' would have the label input's name; use .npz")
    return names + [label]


def check_csv_spec(path: str, lengths: str | None) -> None:
    """Before any data is read: sequences with lengths have no one row per example."""
    if lengths is not None:
        raise UserError(f"--out {path}: the net's sequences have lengths (train.data.lengths: {lengths}), which a "
                        "CSV of one row per example cannot hold; use .npz")


def csv_label(path: str, arrays: dict[str, np.ndarray]) -> str:
    """The name of the label array, after a one-line UserError for what a CSV of training data
    cannot hold: values that are not numbers, anything but one feature array and one integer
    label per example."""
    for name, arr in arrays.items():
        if arr.dtype.kind not in "fiu" or arr.dtype.itemsize > 8:
            raise UserError(f"--out {path}: array '{name}' holds {arr.dtype} values, not numbers a CSV holds; "
                            "use .npz")
    labels = [name for name, arr in arrays.items() if arr.dtype.kind in "iu" and arr.ndim == 1]
    label = labels[0] if len(labels) == 1 else None
    if label is None or len(arrays) != 2:
        raise UserError(f"--out {path}: a CSV holds one feature array and one integer label per example, as "
                        f"train.data.source reads it; this split has {', '.join(arrays)}; use .npz")
    if arrays[label].size and int(np.abs(arrays[label]).max()) > _EXACT_INT:
        raise UserError(f"--out {path}: a label of '{label}' is beyond 2^53, which a CSV does not read back exactly; "
                        "use .npz")
    return label


def _number_format(dtype: np.dtype) -> str:
    """Enough digits that a value reads back exactly: 9 significant digits for float32 (and
    narrower), 17 for float64; integers as they are."""
    if dtype.kind in "iu":
        return "%d"
    return "%.9g" if dtype.itemsize <= 4 else "%.17g"


def write_csv_split(path: str, arrays: dict[str, np.ndarray], label: str) -> None:
    """Atomic write of ``arrays`` (the features, any shape per example, and the 1-d ``label``)
    as a header and one row per example."""
    columns = csv_columns(arrays, label)
    (features,) = [name for name in arrays if name != label]
    x = arrays[features].reshape(len(arrays[features]), -1)
    y = arrays[label]
    row_format = ",".join([_number_format(x.dtype)] * x.shape[1] + [_number_format(y.dtype)]) + "\n"

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerow(columns)
            for start in range(0, len(y), _BLOCK_ROWS):
                block_x, block_y = x[start:start + _BLOCK_ROWS], y[start:start + _BLOCK_ROWS]
                # tolist(): Python numbers, each float32 widened exactly, for %-formatting
                f.write("".join(row_format % (*xs, label_value)
                                for xs, label_value in zip(block_x.tolist(), block_y.tolist())))
    atomic_write(Path(path), write)

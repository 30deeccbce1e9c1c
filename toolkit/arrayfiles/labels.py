"""Class names: a labels file of one name per line, in class-index order (Caffe's
synset_words.txt, Triton's label files), read within a size bound and checked, and the top-k
classes of rows of scores.

A name is the whole line, as Triton and Caffe's examples show it (``n01440764 tench, Tinca
tinca``); trailing spaces and the line break are dropped. A name may not be empty or hold control
characters (it is printed to terminals, written to CSV and sent over HTTP), nor be longer than
MAX_NAME_CHARS.
"""
from __future__ import annotations

import unicodedata

import numpy as np

from ..errors import UserError
from ..fileio import read_regular

MAX_LABELS_BYTES = 2 * 1024 * 1024        # ImageNet-21k's 21,841 names take about 0.6 MiB
MAX_LABELS = 100_000
MAX_NAME_CHARS = 1000


def read_labels(path: str) -> list[str]:
    """The names of the labels file at ``path``, one per line (a last empty line ignored)."""
    data = read_regular(path, MAX_LABELS_BYTES, "labels file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: a labels file is UTF-8 text; byte {e.start} is not") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    names = [line.rstrip("\r").rstrip() for line in lines]
    return check_names(names, path)


def check_names(names: list, where: str) -> list[str]:
    """``names`` as class names: strings, not empty, without control characters, of bounded
    length and number. Raises UserError naming the first bad one (its line, 1-based)."""
    if not isinstance(names, list):
        raise UserError(f"{where}: class names are a list of strings")
    if not names:
        raise UserError(f"{where}: no class names (one per line)")
    if len(names) > MAX_LABELS:
        raise UserError(f"{where}: {len(names):,} class names, at most {MAX_LABELS:,} are taken")
    for line, name in enumerate(names, 1):
        if not isinstance(name, str):
            raise UserError(f"{where}: class name {line} is not a string")
        if not name.strip():
            raise UserError(f"{where}: line {line} is empty; each line names the class of its index")
        if len(name) > MAX_NAME_CHARS:
            raise UserError(f"{where}: line {line} is {len(name):,} characters long, at most "
                            f"{MAX_NAME_CHARS} are taken")
        bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
        if bad is not None:
            raise UserError(f"{where}: line {line} holds the control character U+{ord(bad):04X}")
    return names


def score_width(shape: tuple) -> int | None:
    """The classes per example of an output shaped [N, C] or [N, C, 1, ..., 1] (a net that ends in
    global pooling), else None."""
    if len(shape) < 2 or any(d != 1 for d in shape[2:]):
        return None
    width = shape[1]
    return width if isinstance(width, int) and width > 1 else None


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of the k highest scores of each row of [N, C, 1, ...] scores, highest
    first; equal scores in index order; NaN ranks last. k is cut to C."""
    rows = np.asarray(scores).reshape(len(scores), -1)
    k = min(k, rows.shape[1])
    keys = np.where(np.isnan(rows), -np.inf, rows)
    order = np.argsort(-keys, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(rows, order, axis=1)


def fit_labels(names: list[str] | None, widths: dict[str, int], where: str) -> None:
    """Refuse class names that fit none of the score outputs (output name -> classes per example)."""
    if names is None:
        return
    if not widths:
        raise UserError(f"{where}: {len(names)} class names, but the net has no output of class scores "
                        "([N, C] or [N, C, 1, 1])")
    if len(names) not in widths.values():
        said = ", ".join(f"'{k}' {v}" for k, v in widths.items())
        raise UserError(f"{where}: {len(names)} class names, but the net's class scores have {said} per example; "
                        "one name per class, in index order")

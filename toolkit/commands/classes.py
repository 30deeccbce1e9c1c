"""Class names for the commands that run a net (``infer``, ``serve``): from ``--labels FILE``,
else the names the model recorded in its input.json (a labels file given at import, or an image
folder's subfolders in training); and ``infer --top K``'s lines."""
from __future__ import annotations

import numpy as np

from ..arrayfiles.labels import fit_labels, read_labels, score_width, top_k
from ..errors import UserError


def score_widths(shapes: dict[str, tuple]) -> dict[str, int]:
    """Output name -> classes per example, for the outputs shaped as class scores."""
    return {name: width for name, shape in shapes.items() if (width := score_width(tuple(shape))) is not None}


def class_names(labels: str | None, recorded: dict, widths: dict[str, int]) -> list[str] | None:
    """The names of ``--labels`` (which must fit a score output: one name per class), else the
    model's recorded ones, else None."""
    if labels is not None:
        names = read_labels(labels)
        fit_labels(names, widths, f"--labels {labels}")
        return names
    return recorded.get("classes") or None


def check_top(top: int | None, widths: dict[str, int]) -> None:
    if top is not None and not widths:
        raise UserError(f"--top {top}: the net has no output of class scores ([N, C] or [N, C, 1, 1]) to rank")


def top_lines(outputs: dict[str, np.ndarray], row_names: list[str] | None, names: list[str] | None,
              k: int) -> list[str]:
    """For each example and each output of class scores: its name, then the k best classes, one a
    line: rank, score, class index and its name where known."""
    lines = []
    scored = {name: value for name, value in outputs.items()
              if np.asarray(value).dtype.kind == "f" and score_width(np.shape(value)) is not None}
    for name, value in scored.items():
        value = np.asarray(value)
        best, scores = top_k(value, k)
        known = names if names and len(names) == value.shape[1] else None
        for row in range(len(value)):
            example = row_names[row] if row_names else f"row {row}"
            lines.append(f"{example}: {name} top {best.shape[1]}")
            for rank, (index, score) in enumerate(zip(best[row], scores[row]), 1):
                label = f"  {known[index]}" if known else ""
                lines.append(f"  {rank}. {score:.6f}  class {index}{label}")
    return lines

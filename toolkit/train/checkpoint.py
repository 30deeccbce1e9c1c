"""Checkpoints: one .safetensors file per snapshot holding the weights, the solver slots and, in
its metadata, the iteration, the solver and the random generator's state.

Written atomically (temporary file, fsync, rename), so a crash mid-write leaves the previous
checkpoint as it was; older checkpoints beyond keep-last-K are removed only after a new one is
complete.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..weights import save_weights

PATTERN = re.compile(r"^iter_(\d+)\.safetensors$")
FORMAT = "toolkit-checkpoint-1"


@dataclass
class Checkpoint:
    iteration: int                   # iterations completed: the next one to run
    arrays: dict[str, np.ndarray]    # weights, running stats and solver slots
    meta: dict                       # solver, rng state, net name, ...


def checkpoint_path(folder: Path, iteration: int) -> Path:
    return folder / f"iter_{iteration:07d}.safetensors"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = []
    for f in folder.iterdir():
        m = PATTERN.match(f.name)
        if m:
            found.append((int(m.group(1)), f))
    return sorted(found)


def write_checkpoint(folder: Path, ckpt: Checkpoint, keep_last: int) -> Path:
    path = checkpoint_path(folder, ckpt.iteration)
    meta = {"format": FORMAT, "iteration": str(ckpt.iteration), "meta": json.dumps(ckpt.meta)}
    save_weights(str(path), ckpt.arrays, metadata=meta)
    for _it, old in list_checkpoints(folder)[:-keep_last]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> Checkpoint:
    from safetensors import safe_open
    from safetensors.numpy import load_file
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
        arrays = dict(load_file(str(path)))
    except Exception as e:  # the library has its own error types for each malformation
        raise UserError(f"{path}: not a readable checkpoint ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if meta.get("format") != FORMAT:
        raise UserError(f"{path}: not a toolkit checkpoint (no '{FORMAT}' marker)")
    return Checkpoint(int(meta["iteration"]), arrays, json.loads(meta["meta"]))


def find_resume_point(target: str) -> Path:
    """--resume takes a run folder (its newest checkpoint), a checkpoints folder, or a file."""
    p = Path(target)
    if p.is_file():
        return p
    for folder in (p / "checkpoints", p):
        found = list_checkpoints(folder)
        if found:
            return found[-1][1]
    if not p.exists():
        raise UserError(f"--resume {target}: no such file or folder")
    raise UserError(f"--resume {target}: no checkpoint (iter_*.safetensors) found there")

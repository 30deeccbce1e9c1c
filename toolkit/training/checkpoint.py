"""Checkpoints: one .safetensors file per snapshot holding the weights, the solver slots and, in
its metadata, the iteration, the solver and the random generator's state.

Written atomically (temporary file, fsync, rename), so a crash mid-write leaves the previous
checkpoint as it was; older checkpoints beyond keep-last-K are removed only after a new one is
complete. Read back as a regular file only, and its metadata checked whole (``_checked_meta``)
before a resume uses any of it: a file edited or written by another program is one line naming
it, not a traceback from the middle of the trainer.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..fileio import check_regular
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
    check_regular(path)              # safetensors' own open of a FIFO would wait for a writer
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
        arrays = dict(load_file(str(path)))
    except Exception as e:  # the library has its own error types for each malformation
        raise UserError(f"{path}: not a readable checkpoint "
                        f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if meta.get("format") != FORMAT:
        raise UserError(f"{path}: not a toolkit checkpoint (no '{FORMAT}' marker)")
    iteration, about = _checked_meta(path, meta)
    return Checkpoint(iteration, arrays, about)


MAX_ITERATION = 1 << 62


def _checked_meta(path: Path, meta: dict) -> tuple[int, dict]:
    """The iteration and the run's metadata of a checkpoint, each field of the type a resume
    uses it as: the iteration a whole number, the generator's state one numpy accepts, the
    trackers' states mappings of numbers."""
    def bad(what: str) -> UserError:
        return UserError(f"{path}: not a readable checkpoint ({what})")
    text = meta.get("iteration", "")
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 19
            and int(text) <= MAX_ITERATION):
        raise bad(f"its iteration {text[:40]!r} is not a whole number")
    try:
        about = json.loads(meta.get("meta", ""))
    except (json.JSONDecodeError, RecursionError):
        raise bad("its 'meta' is not JSON") from None
    if not isinstance(about, dict):
        raise bad("its 'meta' is not a JSON object")
    if "rng" not in about:
        raise bad("it holds no random generator state, which an exact resume needs")
    try:
        np.random.default_rng(0).bit_generator.state = about["rng"]
    except (TypeError, ValueError, KeyError, OverflowError):
        raise bad("its random generator state is not one numpy's PCG64 takes") from None
    for key in ("net", "solver"):
        if not isinstance(about.get(key, ""), str):
            raise bad(f"its '{key}' is not a name")
    batch = about.get("global_batch", 1)
    if not (type(batch) is int and 0 < batch <= MAX_ITERATION):
        raise bad("its 'global_batch' is not a positive whole number")
    watch = about.get("watch") or {}
    if not isinstance(watch, dict):
        raise bad("its 'watch' (the best-model and early-stop states) is not a mapping")
    for key in ("best", "early_stop"):
        _check_tracker(watch.get(key), f"watch.{key}", bad)
    return int(text), about


def _check_tracker(state, where: str, bad) -> None:
    """A best-model or early-stop tracker's state (watch.Tracker.state): None, or its numbers."""
    if state is None:
        return
    if not isinstance(state, dict):
        raise bad(f"its '{where}' is not a mapping")
    for key, whole in (("best", False), ("best_iter", True), ("since", True), ("last", True)):
        value = state.get(key, 0 if key == "since" else None)
        if value is None and key != "since":
            continue
        number = (type(value) is int and value >= 0) if whole else type(value) in (int, float)
        if not number:
            raise bad(f"its '{where}.{key}' is {json.dumps(value)[:40]}, not a "
                      f"{'whole number' if whole else 'number'}")


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

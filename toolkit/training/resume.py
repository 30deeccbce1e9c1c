"""Resuming a run: the checkpoint ``--resume`` names, checked against the net and copied into the
run's arrays, the iteration to continue at (the same sample under another rank count), and the
refusal of a run that has nothing left to train.

Exactness of resume rests on three facts: every array that changes (weights, running stats,
solver slots) is in the checkpoint; the data order of iteration i is a function of (seed, i);
and the dropout generator's state is saved with the iteration.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError
from .checkpoint import find_resume_point, read_checkpoint


class FinishedRun(Exception):
    """``--resume`` of a run that has nothing left to train: it reached its last iteration, or
    stopped early and would stop again at its next test. Carries the line that says so and the
    iteration the run ended at."""

    def __init__(self, line: str, iteration: int):
        super().__init__(line)
        self.iteration = iteration


@dataclass
class Resumed:
    path: Path             # the checkpoint read
    start: int             # the iteration to continue at
    rng_state: dict        # the dropout generator's state at that iteration
    watch: dict            # the best-model and early-stopping trackers' states
    routes: object = None  # the GPU routes the run measured (backend/measured.py), unchecked


def resume_into(target: str, store: dict[str, np.ndarray], net_name: str, solver: str,
                global_batch: int, max_iter: int) -> Resumed:
    """Reads the checkpoint ``target`` names into ``store`` (the run's weights and solver
    slots, which it must match key for key and shape for shape)."""
    path = find_resume_point(target)
    ckpt = read_checkpoint(path)
    if ckpt.meta.get("solver") != solver:
        raise UserError(f"{path}: written by solver '{ckpt.meta.get('solver')}', but the net now says "
                        f"'{solver}'; resuming must continue the same solver")
    missing = sorted(set(store) - set(ckpt.arrays))
    extra = sorted(set(ckpt.arrays) - set(store))
    whose = f"a checkpoint of net '{ckpt.meta.get('net')}'"
    if missing or extra:
        raise UserError(f"{path}: {whose} does not match net '{net_name}' (missing: "
                        f"{', '.join(missing) or '-'}; unexpected: {', '.join(extra) or '-'})")
    reshaped = [f"'{k}' has shape {list(arr.shape)}, the net needs {list(store[k].shape)}"
                for k, arr in ckpt.arrays.items() if arr.shape != store[k].shape]
    if reshaped:
        raise UserError(*(f"{path}: {whose}: {line}" for line in reshaped))
    for k, arr in ckpt.arrays.items():
        np.copyto(store[k], arr)
    start = ckpt.iteration
    written_at = ckpt.meta.get("global_batch", global_batch)
    if written_at != global_batch:       # another rank count: continue at the same sample
        start = ckpt.iteration * written_at // global_batch
    if start > max_iter:
        raise UserError(f"{path}: the run is at iteration {start} already and train.max_iter is "
                        f"{max_iter}; to train on, raise it (--set train.max_iter=N)")
    return Resumed(path, start, ckpt.meta["rng"], ckpt.meta.get("watch") or {}, ckpt.meta.get("routes"))


def check_not_finished(target: str, resumed: Resumed, spec, max_iter: int) -> None:
    """Raises FinishedRun where the run resumed (its checkpoint read and found to match the
    net) has nothing left to train; before any kernel is compiled."""
    limit = "train.max_iter" if spec.max_iter else "train.epochs"
    if resumed.start == max_iter:
        raise FinishedRun(f"{target}: the run is finished: it reached iteration {resumed.start}, its last "
                          f"({limit} {spec.max_iter or spec.epochs}); nothing to train. To train on, "
                          f"raise it (--set {limit}=N)", resumed.start)
    stopped = resumed.watch.get("early_stop") or {}
    rule = spec.early_stop
    if rule is not None and stopped.get("since", 0) >= rule.patience:
        raise FinishedRun(f"{target}: the run is finished: it stopped early at iteration {resumed.start} "
                          f"({rule.metric} had not improved for {stopped['since']} tests); nothing to train. "
                          f"To train on, raise train.early_stop.patience (--set train.early_stop.patience=N)",
                          resumed.start)

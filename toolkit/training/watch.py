"""What a run watches in its test metrics: the best model so far (``best.safetensors``) and early
stopping, and the optional TensorBoard event files.

The best model is chosen by ``train.best`` (a metric and a mode), else by the early-stopping
metric, else by ``accuracy`` where the test phase measures it, else by the test loss: a user who
configures nothing still gets the best test-time weights, as Caffe users keep the snapshot with
the best test score by hand. The state (best value and iteration, tests without improvement)
travels in each checkpoint's metadata, so a resumed run keeps both exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UserError
from ..frontend.train_checks import NO_TEST_METRIC, unmeasured
from ..frontend.train_checks import metric_name as logged_metric


def mode_of(metric: str, mode: str | None) -> str:
    return mode or ("min" if "loss" in metric else "max")


@dataclass
class Tracked:
    """One metric followed over the test passes: its best value and when, and how many passes
    since it last improved by more than ``min_delta``."""
    metric: str
    mode: str
    min_delta: float = 0.0
    best: float | None = None
    best_iter: int | None = None
    since: int = 0
    last: int | None = None          # the iteration of the last test seen (a resume repeats it)

    def better(self, value: float) -> bool:
        if self.best is None:
            return math.isfinite(value)
        gain = (value - self.best) if self.mode == "max" else (self.best - value)
        return gain > self.min_delta

    def see(self, iteration: int, value: float) -> bool:
        """Record a test pass; True when it is a new best. A test at an iteration already seen
        (the one a resumed run repeats at its first iteration) changes nothing."""
        if self.last is not None and iteration <= self.last:
            return False
        self.last = iteration
        if self.better(value):
            self.best, self.best_iter, self.since = value, iteration, 0
            return True
        self.since += 1
        return False

    def state(self) -> dict:
        return {"best": self.best, "best_iter": self.best_iter, "since": self.since, "last": self.last}

    def restore(self, state: dict | None) -> None:
        if state:
            self.best, self.best_iter, self.since = state.get("best"), state.get("best_iter"), state.get("since", 0)
            self.last = state.get("last")


def metric_name(name: str, measured: list[str]) -> str:
    """The test metric a config names ('loss' is the test loss, logged as test_loss). A net file
    naming one its test phase does not measure is refused when read (frontend/train_checks.py)."""
    found = logged_metric(name, measured)
    if found is None:
        raise UserError(unmeasured(name, measured))
    return found


def trackers(spec, measured: list[str]) -> tuple[Tracked | None, Tracked | None]:
    """(the best model's metric, the early-stopping metric) for a train spec, given the names
    the test phase measures; None where there is nothing to track."""
    stop = None
    if spec.early_stop is not None:
        if not measured:
            raise UserError(NO_TEST_METRIC["early_stop"])
        name = metric_name(spec.early_stop.metric, measured)
        stop = Tracked(name, mode_of(name, spec.early_stop.mode), spec.early_stop.min_delta)
    if spec.best is not None:
        if not measured:
            raise UserError(NO_TEST_METRIC["best"])
        name = metric_name(spec.best.metric, measured)
        return Tracked(name, mode_of(name, spec.best.mode)), stop
    if stop is not None:
        return Tracked(stop.metric, stop.mode), stop
    for name in ("accuracy", "test_loss"):
        if name in measured:
            return Tracked(name, mode_of(name, None)), stop
    return None, stop


class TensorBoard:
    """Scalars as TensorBoard event files in the run's ``tensorboard/`` folder, through
    tensorboardX (the ``tensorboard`` extra, imported only when a net asks for it)."""

    def __init__(self, folder):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise UserError("train.tensorboard needs the tensorboard extra: pip install 'yamlnet-toolkit[tensorboard]' "
                            "(tensorboardX)") from None
        self.writer = SummaryWriter(logdir=str(folder))

    def write(self, record: dict) -> None:
        step = int(record["iter"])
        for key, value in record.items():
            if key != "iter" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, float(value), step)

    def close(self) -> None:
        self.writer.close()

"""Starting a training run, as ``toolkit train`` and ``toolkit.train`` both do: the run folder
(new, or the one resumed), the check of a resumed run's recorded settings, the sweep of what a
killed run left, the history line, then the loop. The caller has loaded the net (from a file,
``zoo:NAME``, a string or a dict, or the run's own ``net.yaml``)."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backend.devices import Device
from ..backend.options import resolve_train_dtype
from ..errors import UserError
from ..frontend import Net
from . import runs


@dataclass
class RunResult:
    """What a finished (or stopped) run left: its folder, exit status, iterations, final test
    metrics, and the best weights kept (metric, value, iteration, file) where any were."""
    folder: Path
    status: int
    iterations: int
    metrics: dict[str, float] = field(default_factory=dict)
    best: dict[str, Any] | None = None


def choose_run_folder(net_name: str, out: str | None, comm) -> tuple[Path, str | None]:
    """Where a new run writes, decided once: with several ranks, rank 0 looks at the disk and
    tells the others. Ranks that looked for themselves could find the folder rank 0 has just
    begun to write, and refuse it as another run's (or move on to the next ``runs/NAME-K``)."""
    if comm is None or comm.size <= 1:
        return runs.new_run_folder(net_name, out)
    decided = None
    if comm.rank == 0:
        try:
            folder, notice = runs.new_run_folder(net_name, out)
            decided = (str(folder), notice, [])
        except UserError as e:
            decided = (None, None, e.problems)
    folder, notice, problems = comm.share(decided)
    if problems:                      # every rank stops with rank 0's reason
        raise UserError(*problems)
    return Path(folder), notice


def train_net(net: Net, device: Device, *, out: str | None = None, resume: str | None = None,
              weights: str | None = None, allow_missing: bool = False, overrides: list[tuple[tuple, Any]] = (),
              set_texts: list[str] = (), disable: tuple[str, ...] | None = None, comm=None,
              stream=None) -> RunResult:
    """Train ``net`` (already loaded with ``overrides``, which ``set_texts`` spell as given) into
    a new run folder, or continue the run ``resume`` names."""
    from .resume import FinishedRun
    from .trainer import Trainer
    say = stream or sys.stderr
    mixed = net.spec.train.solver.mixed_precision if net.spec.train else None
    if mixed is not None:
        resolve_train_dtype(mixed.dtype, device)
    if allow_missing and not weights:
        raise UserError("--allow-missing goes with --weights FILE (the weights to copy from)")
    changed, notice = {}, None
    if resume is not None:
        run = runs.run_of(resume)
        folder = Path(out) if out else run
        for checked in {run, folder}:        # what it reads, and where it writes (and deletes)
            runs.check_run_folder(checked)
        if runs.own_file(run, "net.yaml") is not None:
            from ..frontend.render import render_net
            # as the run recorded it: its mean image named as its copy in the run
            changed = runs.check_resume_changes(run, render_net(net, folder=run, replace=runs.mean_renamed(net)),
                                                list(overrides))
    else:
        folder, notice = choose_run_folder(net.name, out, comm)
    try:
        trainer = Trainer(net, folder, weights=weights, resume=resume, device=device, disable=disable, comm=comm,
                          allow_missing=allow_missing, stream=stream)
    except FinishedRun as finished:
        if comm is None or comm.rank == 0:
            print(finished, file=say)
        return finished_result(folder, finished.iteration)
    if trainer.rank == 0:
        if notice:
            print(notice, file=say)
        for stale in runs.sweep_stale(folder):
            print(f"removed {stale}, a checkpoint a stopped run left half-written", file=say)
        folder.mkdir(parents=True, exist_ok=True)
        runs.record_start(folder, trainer.start, list(set_texts), changed, weights)
    status = trainer.run()
    best = trainer.best
    kept = None
    if best is not None and best.best_iter is not None:
        kept = {"metric": best.metric, "value": best.best, "iteration": best.best_iter,
                "file": folder / "best.safetensors"}
    return RunResult(folder, status, trainer.iterations_done, dict(getattr(trainer, "final_metrics", {}) or {}), kept)


def finished_result(folder: Path, iteration: int) -> RunResult:
    """The RunResult of a run that had finished before this start: its last test metrics (the
    last line of metrics.jsonl without a training loss) and its best weights, as recorded."""
    import json
    metrics: dict[str, float] = {}
    log = folder / "metrics.jsonl"
    if log.is_file():
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "loss" not in record:
                metrics = {k: v for k, v in record.items() if k not in ("iter", "lr") and isinstance(v, (int, float))}
    best = None
    kept = folder / "best.safetensors"
    if kept.is_file():
        from safetensors import safe_open
        try:
            with safe_open(str(kept), framework="numpy") as f:
                about = dict(f.metadata() or {})
            (metric, value), = [(k, v) for k, v in about.items() if k != "iteration"]
            best = {"metric": metric, "value": float(value), "iteration": int(about["iteration"]), "file": kept}
        except Exception:            # weights without the run's note: the result just has no best
            best = None
    return RunResult(folder, 0, iteration, metrics, best)

"""Run folders: where a training run writes, and what it keeps of how it was started.

- A new run never writes into a folder that holds another run: the default ``runs/NAME`` moves
  on to ``runs/NAME-2``, ``-3``, ... (as PyTorch Lightning's ``version_N`` and YOLO's ``expN``
  do), and a named ``--out`` that holds a run is an error saying how to continue it instead.
- ``--resume RUN`` continues with the net the run recorded (its ``net.yaml``: bases merged, every
  ``--set`` applied). A net or ``--set`` that changes a recorded setting must name the change
  with ``--set``; each start is a line of ``history.jsonl`` with what it changed, so the run keeps
  the history of what it trained with.
- Temporary files a killed run left in ``checkpoints/`` are swept when a run starts there.
- A run resumed is checked first (``check_run_folder``): its files are regular files and its
  ``checkpoints/`` a folder, none a symbolic link, so that continuing a run reads, replaces and
  deletes only inside its own folder (never another run's checkpoints through a link, never a
  FIFO that would wait for a writer).
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError
from ..fileio import append_line, check_regular

# what makes a folder a run's: any of these written by a training run
RUN_FILES = ("net.yaml", "metrics.jsonl", "model.safetensors", "checkpoints")
HISTORY = "history.jsonl"
# atomic_write's temporary files: ".TARGET.RANDOM.SUFFIX"
STALE = re.compile(r"^\.iter_\d+\.safetensors\.[^/]+\.safetensors$")


def holds_run(folder: Path) -> bool:
    return folder.is_dir() and any((folder / name).exists() for name in RUN_FILES)


def new_run_folder(net_name: str, out: str | None) -> tuple[Path, str | None]:
    """Where a new (not resumed) run writes, and a line saying why it is not the default."""
    if out is not None:
        folder = Path(out)
        if holds_run(folder):
            raise UserError(f"--out {out}: holds a run already; continue it with `toolkit train --resume {out}`, "
                            "or choose another --out")
        return folder, None
    base = Path("runs") / net_name
    folder, n = base, 2
    while holds_run(folder):
        folder = base.with_name(f"{net_name}-{n}")
        n += 1
    return folder, (None if folder == base else f"{base} holds an earlier run; this run writes to {folder}")


def run_of(resume: str) -> Path:
    """The run folder of a ``--resume`` target (a run folder, its checkpoints folder or a file)."""
    target = Path(resume)
    if target.is_file():
        return target.parent.parent
    return target.parent if target.name == "checkpoints" else target


def recorded_net(run: Path) -> Path:
    path = own_file(run, "net.yaml")
    if path is None:
        raise UserError(f"--resume {run}: the run has no net.yaml; name the net: `toolkit train NET --resume {run}`")
    return path


# what a run folder holds besides RUN_FILES: each must be the run's own, if there
OWN_FILES = ("net.yaml", "metrics.jsonl", "model.safetensors", HISTORY, "best.safetensors")


def own_file(run: Path, name: str) -> Path | None:
    """``run/name`` where it is a regular file of the run's own; None where nothing is there; a
    UserError where it is a symbolic link (continuing the run would write through it, into a
    file elsewhere) or not a regular file (a FIFO would wait for a writer)."""
    path = run / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"{path}: a symbolic link; a run keeps its files in its own folder, so links are refused")
    check_regular(path)
    return path


def check_run_folder(run: Path) -> None:
    """The folder a resumed run reads and writes holds only its own files: each of OWN_FILES a
    regular file (or absent) and ``checkpoints`` a folder, none a symbolic link. A run's own
    checkpoints are the ones it deletes beyond keep-last-K and sweeps when half-written: through
    a link those would be another run's."""
    for name in OWN_FILES:
        own_file(run, name)
    folder = run / "checkpoints"
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UserError(f"{folder}: cannot read: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"{folder}: a symbolic link; a run keeps its checkpoints in its own folder (they are "
                        "deleted and replaced there), so links are refused")
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{folder}: not a folder; a run keeps its checkpoints in the folder checkpoints/")


def changes(recorded: Any, now: Any, path: tuple = ()) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (recorded value, new value) for every leaf that differs (layers by name)."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        out = {}
        for key in list(recorded) + [k for k in now if k not in recorded]:
            out.update(changes(recorded.get(key), now.get(key), path + (key,)))
        return out
    if path == ("layers",) and isinstance(recorded, list) and isinstance(now, list):
        named = {layer.get("name"): layer for layer in recorded if isinstance(layer, dict)}
        fresh = {layer.get("name"): layer for layer in now if isinstance(layer, dict)}
        if list(named) == list(fresh):
            out = {}
            for name in named:
                out.update(changes(named[name], fresh[name], path + (name,)))
            return out
    if recorded != now:
        return {".".join(str(p) for p in path): (recorded, now)}
    return {}


def check_resume_changes(run: Path, rendered: str, overrides: list[tuple[tuple, Any]]) -> dict[str, tuple]:
    """The recorded settings the net now changes; a change that no ``--set`` names is refused."""
    recorded = recorded_settings(run)
    diff = changes(recorded, yaml.safe_load(rendered))
    named = [".".join(str(p) for p in key) for key, _value in overrides]
    unnamed = {k: v for k, v in diff.items()
               if not any(k == n or k.startswith(n + ".") or n.startswith(k + ".") for n in named)}
    if unnamed:
        shown = "; ".join(f"{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in list(unnamed.items())[:4])
        more = f" and {len(unnamed) - 4} more" if len(unnamed) > 4 else ""
        raise UserError(f"--resume {run}: the net differs from the one the run trained ({shown}{more}); "
                        f"leave the net out to continue as recorded, or name each change with --set KEY=VALUE")
    return diff


def recorded_settings(run: Path) -> Any:
    """The run's net.yaml as data, read as a net file is (a regular file, within the size and
    the alias expansion a net file may have: a file planted there is no bomb)."""
    from ..frontend.spec import read_text
    from ..frontend.yaml_loader import load_yaml
    path = recorded_net(run)
    return load_yaml(read_text(str(path)), str(path))[0]


def record_start(run: Path, iteration: int, overrides: list[str], changed: dict[str, tuple],
                 weights: str | None) -> None:
    """One line of history.jsonl: where this start began and what it set or changed."""
    entry: dict[str, Any] = {"iteration": iteration, "set": list(overrides)}
    if changed:
        entry["changed"] = {k: [a, b] for k, (a, b) in changed.items()}
    if weights:
        entry["weights"] = weights
    append_line(run / HISTORY, json.dumps(entry, default=str))


def mean_renamed(net) -> dict[tuple, str]:
    """{the key that names the net's mean image: the name its copy in a run folder has} where
    that differs from what the net writes (a path); {} otherwise: how the run's net.yaml names it."""
    from ..training.data import mean_declared
    declared = mean_declared(net)
    if declared is None:
        return {}
    key, named = declared
    name = _carried(named)
    return {} if name == named else {key: name}


def _carried(named: str) -> str:
    from ..training.data import carried_name
    name = carried_name(named)
    return "mean.npy" if name in RUN_FILES + (HISTORY, "input.json") else name    # never over the run's own files


def carry_mean(net, run: Path) -> dict[tuple, str]:
    """The mean image the net names, copied into the run folder, so that the run (and a model
    published from it) holds what its net.yaml names: under its own file name, the net's key
    pointed at the copy where the net names it otherwise (``mean_renamed``, for the rendered net)."""
    import shutil

    from ..fileio import atomic_write, check_regular, same_file
    from ..training.data import mean_declared, mean_file_of
    declared = mean_declared(net)
    if declared is None:
        return {}
    source, target = mean_file_of(net), run / _carried(declared[1])
    if not same_file(source, target):
        check_regular(source)                # training has read it: a plain file, copied as a stream
        atomic_write(target, lambda tmp: shutil.copyfile(source, tmp))
    return mean_renamed(net)


def sweep_stale(run: Path) -> list[Path]:
    """Remove the temporary checkpoint files a killed run left behind."""
    folder = run / "checkpoints"
    swept = []
    if folder.is_dir():
        for f in folder.iterdir():
            if STALE.match(f.name) and f.is_file():
                f.unlink(missing_ok=True)
                swept.append(f)
    return swept


def save_net(net, out: Path) -> None:
    """The run folder keeps the net it trained, bases merged and --set applied (what
    `toolkit zoo publish RUN_DIR` shares)."""
    from ..fileio import atomic_write
    from ..frontend.render import render_net
    if not net.raw:       # a Net built in code, not loaded from a file
        return
    text = render_net(net, folder=out, replace=carry_mean(net, out))
    target = out / "net.yaml"
    if target.exists() and target.read_text() == text:
        return
    atomic_write(target, lambda tmp: Path(tmp).write_text(text))


def save_input(net, out: Path, source: str) -> None:
    """input.json: what deployment needs to know of the inputs beyond the net (class names of
    an image folder, a CSV's columns and label column) read from the training data ``source``,
    beside net.yaml."""
    from ..fileio import atomic_write
    from .data import INPUT_FILE, data_folder, describe_source
    about = describe_source(source, net.spec.inputs, data_folder(net, "source"))
    if not about:
        return
    text = json.dumps(about, indent=1) + "\n"
    target = out / INPUT_FILE
    if not (target.exists() and target.read_text() == text):
        atomic_write(target, lambda tmp: Path(tmp).write_text(text))


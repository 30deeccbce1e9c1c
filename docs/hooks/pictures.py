"""The documentation site's pictures, drawn from the code each time the site builds.

Registered under ``hooks:`` in mkdocs.yml. Three SVG files are written into the build (never into
docs/), under images/:

- ``lenet.svg``: zoo:lenet's infer graph, drawn by ``toolkit graph --layout builtin`` (the
  toolkit's own layout, so the picture is the same whether or not Graphviz is installed);
- ``dataflow.svg``: the way a net file becomes a run, drawn by the same layout code
  (toolkit/commands/svg_layout.py);
- ``loss.svg``: the loss curve of a real short training run of zoo:lenet, read back from the
  run's metrics.jsonl and drawn by the plot ``toolkit train`` writes as loss.png.

Together they add about 10 s to the build, nearly all of it the training run. A picture that
cannot be drawn stops the build with one message saying which and why.

The picture functions need no MkDocs: tests/docs/test_pictures.py calls them directly.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PICTURES = ("images/lenet.svg", "images/dataflow.svg", "images/loss.svg")
# the short run behind loss.svg: long enough for the curve to fall and level, short enough for
# the build (about 5 s on one core)
LOSS_RUN = ("train.max_iter=200", "train.display=5", "train.test_interval=50")


class PictureError(Exception):
    """A picture could not be drawn."""


def lenet_svg() -> str:
    """zoo:lenet's infer graph as ``toolkit graph zoo:lenet --layout builtin -o lenet.svg`` draws it."""
    from toolkit.cli import main
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lenet.svg"
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            status = main(["graph", "zoo:lenet", "--layout", "builtin", "-o", str(out)])
        if status != 0 or not out.exists():
            raise PictureError(f"images/lenet.svg: toolkit graph failed ({status}): {said.getvalue().strip()}")
        return out.read_text(encoding="utf-8")


# (lines, fill, border) of each step and of what comes in and goes out, in the order drawn
STEPS = [
    (["net.yaml or zoo:NAME", "the net file: layers, data, solver"], "#fff2b3", "#8a7a2a"),
    (["check", "every mistake at FILE:LINE:COL"], "#ffffff", "#444444"),
    (["lower", "each layer to primitive ops: a graph"], "#ffffff", "#444444"),
    (["backward + solver", "gradient ops by autodiff, the updates"], "#dbe8f6", "#3d6fa8"),
    (["passes", "fold, simplify, fuse, place on devices"], "#ffffff", "#444444"),
    (["plan", "memory, kernels, schedule"], "#ffffff", "#444444"),
    (["run on CPU or GPU", "train, test, infer, serve"], "#e1f0d8", "#4f8a3a"),
    (["weights", "model.safetensors"], "#ece4f7", "#6b5a8e"),
    (["your data", "CSV, images, npz, LMDB, HDF5"], "#fff2b3", "#8a7a2a"),
    (["results", "outputs, metrics, snapshots"], "#c9ecd3", "#3a7a4a"),
]
FLOW = [(0, 1, "load"), (1, 2, "validated net"), (2, 3, "train"), (2, 4, "infer, test"),
        (3, 4, "train step"), (4, 5, ""), (5, 6, ""), (7, 5, ""), (8, 6, ""), (6, 9, "")]


def dataflow_svg() -> str:
    """The data flow of the toolkit, drawn with ``toolkit graph``'s built-in layout."""
    from toolkit.commands.svg_layout import Box, Edge, draw
    boxes = [Box(lines, fill, border, kind="step") for lines, fill, border in STEPS]
    edges = [Edge(tail, head, label) for tail, head, label in FLOW]
    return draw(boxes, edges, title="From a net file to a run", show_labels=True)


def loss_svg(work: Path | None = None) -> str:
    """Trains zoo:lenet briefly (LOSS_RUN) in a fresh process and plots its metrics.jsonl."""
    from toolkit.training.progress import plot
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(work or tmp) / "run"
        args = [sys.executable, "-m", "toolkit.cli", "train", "zoo:lenet", "--out", str(run)]
        for setting in LOSS_RUN:
            args += ["--set", setting]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp, env=env, timeout=600)
        if proc.returncode != 0:
            said = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise PictureError(f"images/loss.svg: the training run failed ({proc.returncode}): {said}")
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        if not any("loss" in r for r in records):
            raise PictureError("images/loss.svg: the run's metrics.jsonl has no loss")
        keys = sorted({k for r in records for k in r} - {"iter", "loss", "lr"})
        out = Path(tmp) / "loss.svg"
        if not plot(records, out, "zoo:lenet, 200 iterations", keys):
            raise PictureError("images/loss.svg: matplotlib is not installed (pip install -e '.[docs]')")
        return out.read_text(encoding="utf-8")


def pictures() -> dict[str, str]:
    """Every picture, by its path in the site."""
    return dict(zip(PICTURES, (lenet_svg(), dataflow_svg(), loss_svg())))


# ---------------------------------------------------------------------------------------------
# MkDocs events

def on_files(files, config):
    """Adds the pictures to the build (they exist in site/ only)."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File
    sys.path.insert(0, str(ROOT))
    try:
        drawn = pictures()
    except PictureError as error:
        raise PluginError(str(error)) from None
    for uri, content in drawn.items():
        files.append(File.generated(config, uri, content=content))
    return files

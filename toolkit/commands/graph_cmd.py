"""``toolkit graph``: draws a phase's graph, as lowered or after the passes, as .dot or .svg.

The graph drawn is exactly the one the pass pipeline receives (for train: forward, generated
backward and the solver's updates) or, with ``--optimized``, the one it returns. DOT text comes
from ``toolkit.commands.dot``; SVG from Graphviz's ``dot`` program where it is installed, else
(or with ``--layout builtin``) from the toolkit's own layered layout, ``toolkit.commands.svg_layout``.

Invariant: the ``-o`` file is written whole or not at all. Every mistake that can be found before
work starts (the extension, the folder, ``--layout dot`` without ``dot``) is reported first, and
the file is written through ``atomic_write``, so a failing ``dot`` leaves no partial file and an
existing file as it was.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ..compile import disabled_passes, optimize, train_graph
from ..errors import UserError
from ..fileio import atomic_write, refuse_own_inputs
from ..frontend.spec import parse_overrides
from ..zoo.resolve import load_net
from .dot import to_dot

SUFFIXES = (".dot", ".svg")
NO_DOT = ("--layout dot needs Graphviz's 'dot' program, which is not installed; "
          "leave --layout out (the built-in layout draws the .svg) or install Graphviz")
NOT_SVG = "--layout {layout}: a .dot file has no layout; it applies to -o FILE.svg"
# dot lays out a large train graph (thousands of nodes) in seconds to a minute; past this it is
# stuck rather than slow, and the .dot file is the way out.
DOT_TIMEOUT_S = 300


def _check_target(path: str) -> Path:
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in SUFFIXES:
        got = f"'{target.suffix}'" if target.suffix else "no extension"
        raise UserError(f"-o {path}: write a .svg or .dot file (got {got})")
    if target.is_dir():
        raise UserError(f"-o {path}: is a folder; name a .svg or .dot file")
    if not target.parent.is_dir():
        raise UserError(f"-o {path}: folder {target.parent} does not exist")
    return target


def _render_svg(dot: str, text: str, tmp: str) -> None:
    """``dot -Tsvg`` of ``text`` into ``tmp``; any failure is one user-error line."""
    try:
        proc = subprocess.run([dot, "-Tsvg", "-o", tmp], input=text.encode("utf-8"),
                              capture_output=True, timeout=DOT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserError(f"Graphviz's dot took more than {DOT_TIMEOUT_S} s to lay the graph out; "
                        "write a .dot file instead") from None
    except OSError as e:
        raise UserError(f"cannot run Graphviz's dot ({dot}): {e.strerror or e}") from None
    if proc.returncode != 0:
        said = [line.strip() for line in proc.stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        raise UserError(f"Graphviz's dot failed (exit status {proc.returncode})"
                        + (f": {said[0]}" if said else ""))
    if Path(tmp).stat().st_size == 0:
        raise UserError("Graphviz's dot wrote no SVG")


def run_graph(args) -> int:
    target = _check_target(args.output)
    layout = getattr(args, "layout", "auto")
    svg = target.suffix.lower() == ".svg"
    if not svg and layout != "auto":
        raise UserError(NOT_SVG.format(layout=layout))
    dot = shutil.which("dot") if svg and layout != "builtin" else None
    if layout == "dot" and dot is None:
        raise UserError(NO_DOT)

    net = load_net(args.net, parse_overrides(args.overrides))
    from .io import net_inputs
    refuse_own_inputs("-o", args.output, [target], net_inputs(net, args.weights))
    if args.phase == "train":
        # a deploy net is drawn with the objective `toolkit bench --train` times (frontend/heads.py)
        from ..frontend.heads import with_objective
        net, note = with_objective(net)
        if note:
            print(note, file=sys.stderr)
    disable = disabled_passes(net, args.disable, args.no_optimize)
    graph = train_graph(net) if args.phase == "train" else net.graph(args.phase)
    stage = "as lowered"
    if args.phase == "train":
        stage += ", with backward and solver updates"
    if args.optimized:
        # as compile, infer and test build it: infer and test graphs with the weights frozen in
        weights = None
        if args.phase != "train":
            weights_file = net.weights_or_published(args.weights)
            weights = net.load_weights(weights_file) if weights_file else net.init_weights()
        graph = optimize(graph, disable, weights)
        stage = "after the passes" + (", with backward and solver updates" if args.phase == "train" else "")
    title = f"{net.name}: {args.phase} phase, {stage}"

    if not svg:
        text = to_dot(graph, title=title)
        atomic_write(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    elif dot is None:
        from .svg_layout import graph_svg
        drawing = graph_svg(graph, title=title)
        atomic_write(target, lambda tmp: Path(tmp).write_text(drawing, encoding="utf-8"))
    else:
        text = to_dot(graph, title=title)
        atomic_write(target, lambda tmp: _render_svg(dot, text, tmp))
    drawn = len(graph.nodes) + len(graph.inputs) + len(graph.weights) + len(graph.outputs) + len(graph.updates)
    by = "" if not svg else (", laid out by Graphviz's dot" if dot else ", laid out by the built-in layout")
    print(f"wrote {target}: {net.name} {args.phase} graph {stage.split(',')[0]}, "
          f"{len(graph.nodes)} op nodes ({drawn} nodes with inputs, weights, outputs and updates){by}")
    return 0

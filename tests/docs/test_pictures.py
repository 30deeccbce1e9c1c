"""The documentation site's pictures (docs/hooks/pictures.py): zoo:lenet drawn by ``toolkit graph``,
the data flow drawn by the same layout, and the loss plot ``toolkit train`` makes, as SVG. The
picture functions are called directly (``make docs`` runs the real training run behind loss.svg);
each SVG is read back with xml.etree."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from xml.etree import ElementTree

import pytest

from toolkit.training.progress import plot

ROOT = Path(__file__).resolve().parents[2]
NS = "{http://www.w3.org/2000/svg}"
_spec = importlib.util.spec_from_file_location("docs_pictures", ROOT / "docs" / "hooks" / "pictures.py")
pictures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pictures)


def boxes(svg: str) -> list[list[str]]:
    root = ElementTree.fromstring(svg.encode("utf-8"))
    assert root.tag == NS + "svg"
    return [[t.text for t in g.findall(NS + "text")] for g in root.iter(NS + "g")
            if "node" in g.get("class", "").split()]


def test_lenet_is_its_infer_graph_drawn_by_toolkit_graph():
    drawn = boxes(pictures.lenet_svg())
    ops = [texts[0] for texts in drawn]
    assert ops.count("conv2d") == 2 and "softmax" in ops and "input data" in ops and "output prob" in ops
    assert not any(op.endswith("_grad") for op in ops)      # infer: no backward pass


def test_dataflow_has_every_step_in_order():
    svg = pictures.dataflow_svg()
    drawn = boxes(svg)
    assert [texts[0] for texts in drawn] == [lines[0] for lines, _, _ in pictures.STEPS]
    root = ElementTree.fromstring(svg)
    assert len([p for p in root.iter(NS + "path") if p.get("class") == "edge"]) == len(pictures.FLOW)
    tops = {texts[0]: float(g.find(NS + "rect").get("y")) for texts, g in zip(
        drawn, [g for g in root.iter(NS + "g") if "node" in g.get("class", "")])}
    chain = ["net.yaml or zoo:NAME", "check", "lower", "backward + solver", "passes", "plan",
             "run on CPU or GPU", "results"]
    assert [tops[step] for step in chain] == sorted(tops[step] for step in chain)


def test_the_loss_plot_is_written_as_svg_where_the_name_says_so(tmp_path):
    pytest.importorskip("matplotlib")
    records = [{"iter": i, "loss": 2.0 / (i + 1), "lr": 0.05} for i in range(0, 50, 5)]
    records.append({"iter": 50, "test_loss": 0.3, "accuracy": 0.9})
    assert plot(records, tmp_path / "loss.svg", "a run", ["accuracy", "test_loss"])
    root = ElementTree.parse(tmp_path / "loss.svg").getroot()
    assert root.tag == NS + "svg"
    assert plot(records, tmp_path / "loss.png", "a run", ["accuracy", "test_loss"])
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_loss_run_is_short_and_every_picture_has_its_place():
    assert "train.max_iter=200" in pictures.LOSS_RUN
    assert pictures.PICTURES == ("images/lenet.svg", "images/dataflow.svg", "images/loss.svg")
    lines = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").splitlines()
    start = lines.index("hooks:") + 1
    hooks = [line.strip()[2:] for line in lines[start:] if line.startswith("  - ")][:10]
    assert "docs/hooks/pictures.py" in hooks
    assert "](images/dataflow.svg)" in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")

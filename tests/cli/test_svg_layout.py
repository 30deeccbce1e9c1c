"""The built-in layered SVG layout (``toolkit.commands.svg_layout``), which draws ``toolkit graph
-o FILE.svg`` where Graphviz's ``dot`` is not installed, and the documentation's pictures.

The SVG is read back with xml.etree: it must be well-formed, hold one box per node and one path
per edge, and put every box of a later layer wholly below every box of an earlier one.
"""
from __future__ import annotations

import time
from xml.etree import ElementTree

import pytest
from cli_helpers import LENET, run_cli, write_net

from toolkit.commands.svg_layout import Box, Edge, draw, graph_svg, layout
from toolkit.compile import train_graph
from toolkit.frontend import Net
from toolkit.ir import Graph, Node, TensorType, Value, Weight

NS = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> dict:
    """The drawing's boxes ({id: (x, y, w, h, texts, class)}) and edges ([path d])."""
    root = ElementTree.fromstring(svg.encode("utf-8"))
    assert root.tag == NS + "svg"
    boxes = {}
    for g in root.iter(NS + "g"):
        if "node" not in g.get("class", "").split():
            continue
        rect = g.find(NS + "rect")
        texts = [t.text for t in g.findall(NS + "text")]
        boxes[g.get("id")] = (float(rect.get("x")), float(rect.get("y")), float(rect.get("width")),
                              float(rect.get("height")), texts, g.get("class"))
    edges = [p.get("d") for p in root.iter(NS + "path") if p.get("class") == "edge"]
    return {"boxes": boxes, "edges": edges}


def deep_net(blocks: int) -> str:
    """A residual net of ``blocks`` blocks (about 90 train-graph nodes each)."""
    conv = "type: Convolution, num_output: 4, kernel_size: 3, pad: 1"
    layers = [f"  - {{name: conv0, {conv}, bottom: data, top: b0}}"]
    for i in range(1, blocks + 1):
        layers += [
            f"  - {{name: c{i}a, {conv}, bottom: b{i - 1}, top: c{i}a}}",
            f"  - {{name: bn{i}, type: BatchNorm, bottom: c{i}a, top: c{i}a}}",
            f"  - {{name: r{i}, type: ReLU, bottom: c{i}a, top: c{i}a}}",
            f"  - {{name: c{i}b, {conv}, bottom: c{i}a, top: c{i}b}}",
            f"  - {{name: s{i}, type: Eltwise, bottom: [b{i - 1}, c{i}b], top: b{i}}}"]
    return "\n".join([
        "name: deep", "inputs:", "  data: {shape: [N, 1, 8, 8], dtype: float32}",
        "  label: {shape: [N], dtype: int64}", "layers:", *layers,
        f"  - {{name: fc, type: InnerProduct, bottom: b{blocks}, top: fc, num_output: 10}}",
        "  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss, phase: train}",
        "  - {name: prob, type: Softmax, bottom: fc, top: prob, phase: infer}",
        "outputs: [prob]", "train:", "  solver: {type: sgd, momentum: 0.9}"]) + "\n"


def counts(graph: Graph) -> tuple[int, int]:
    boxes = len(graph.inputs) + len(graph.weights) + len(graph.nodes) + len(graph.outputs) + len(graph.updates)
    uses = sum(len(node.inputs) for node in graph.nodes)
    return boxes, uses + len(graph.outputs) + len(graph.updates)


@pytest.mark.parametrize("phase", ["infer", "train"])
def test_lenet_has_one_box_per_node_and_one_path_per_edge(phase):
    net = Net.load(str(LENET))
    graph = train_graph(net) if phase == "train" else net.graph(phase)
    drawing = parse(graph_svg(graph, title="lenet"))
    n_boxes, n_edges = counts(graph)
    assert len(drawing["boxes"]) == n_boxes
    assert len(drawing["edges"]) == n_edges
    ops = [texts[0] for _, _, _, _, texts, cls in drawing["boxes"].values() if cls.startswith("node op")]
    assert ops == [node.op for node in graph.nodes]
    assert "conv1" in {texts[1] for *_, texts, cls in drawing["boxes"].values() if cls.startswith("node op")}
    if phase == "train":
        classes = {cls for *_, cls in drawing["boxes"].values()}
        assert {"node op forward", "node op backward", "node op solver", "node update"} <= classes


def test_every_later_layer_is_below_every_earlier_one():
    # a chain with a diamond and edges that skip layers: layers 0..3, e between b and d
    chain = [Box(["a"]), Box(["b", "two lines"]), Box(["c"]), Box(["d"]), Box(["e"])]
    links = [Edge(0, 1), Edge(1, 2), Edge(0, 2), Edge(2, 3), Edge(1, 4), Edge(4, 3), Edge(0, 3)]
    lay = layout(chain, links)
    assert lay.layer[:4] == [0, 1, 2, 3]
    for a in range(len(chain)):
        for b in range(len(chain)):
            if lay.layer[a] < lay.layer[b]:
                assert lay.y[b] - lay.h[b] / 2 > lay.y[a] + lay.h[a] / 2, (a, b)
    for a in range(len(chain)):             # no two boxes overlap
        for b in range(a + 1, len(chain)):
            apart_x = abs(lay.x[a] - lay.x[b]) >= (lay.w[a] + lay.w[b]) / 2
            apart_y = abs(lay.y[a] - lay.y[b]) >= (lay.h[a] + lay.h[b]) / 2
            assert apart_x or apart_y, (a, b)
    for e, pts in zip(links, lay.paths):    # every edge runs down from its tail to its head
        assert pts[0][1] == pytest.approx(lay.y[e.tail] + lay.h[e.tail] / 2)
        assert pts[-1][1] == pytest.approx(lay.y[e.head] - lay.h[e.head] / 2)
        assert all(q[1] >= p[1] for p, q in zip(pts, pts[1:]))


def test_drawn_edges_run_downwards_in_a_real_graph():
    graph = train_graph(Net.load(str(LENET)))
    drawing = parse(graph_svg(graph))
    tops = sorted({round(y, 1) for _, y, _, _, _, _ in drawing["boxes"].values()})
    assert len(tops) > 10                   # layered, not one row
    for d in drawing["edges"]:
        numbers = [float(v) for v in d.replace("M", " ").replace("C", " ").replace("L", " ").replace(",", " ").split()]
        ys = numbers[1::2]
        assert ys[-1] > ys[0]


def test_text_is_escaped_and_the_svg_well_formed():
    nasty = 'a"b<c>&d\\N\'e'
    graph = Graph("infer")
    x = Value(TensorType((2, 3), "float32"), name="x")
    graph.inputs[nasty] = x
    w = Value(TensorType((3,), "float32"), name="w")
    graph.weights["w"] = Weight("w", w, True, {"type": "constant", "value": 0.0})
    node = Node("add", [x, w], {"note": nasty}, scope=nasty)
    y = Value(TensorType((2, 3), "float32"), node)
    node.outputs.append(y)
    graph.nodes.append(node)
    graph.outputs[nasty] = y
    drawing = parse(graph_svg(graph, title=nasty))
    texts = [t for *_, ts, _ in drawing["boxes"].values() for t in ts]
    assert f"input {nasty}" in texts and f"output {nasty}" in texts and nasty in texts
    assert len(drawing["edges"]) == 3


def test_output_is_deterministic():
    one = graph_svg(train_graph(Net.load(str(LENET))))
    two = graph_svg(train_graph(Net.load(str(LENET))))    # other value ids
    assert one == two


def test_a_cycle_or_a_bad_edge_is_refused():
    with pytest.raises(ValueError, match="cycle"):
        draw([Box(["a"]), Box(["b"])], [Edge(0, 1), Edge(1, 0)])
    with pytest.raises(ValueError, match="does not join"):
        draw([Box(["a"])], [Edge(0, 3)])


def test_edge_labels_are_drawn_when_asked():
    svg = draw([Box(["a"]), Box(["b"])], [Edge(0, 1, "train only")], show_labels=True)
    assert "train only" in [t.text for t in ElementTree.fromstring(svg).iter(NS + "text")]
    assert "train only" not in [t.text for t in ElementTree.fromstring(draw(
        [Box(["a"]), Box(["b"])], [Edge(0, 1, "train only")])).iter(NS + "text")]


def test_optimized_fused_ops_have_a_double_border(tmp_path):
    out = tmp_path / "lenet.svg"
    result = run_cli("graph", LENET, "--optimized", "--layout", "builtin", "-o", out)
    assert result.status == 0, result.err
    root = ElementTree.parse(out).getroot()
    fused = [g for g in root.iter(NS + "g")
             if g.get("class", "").startswith("node op") and g.find(NS + "text").text == "conv2d_max_pool2d"]
    assert fused and all(len(g.findall(NS + "rect")) == 2 for g in fused)


def test_a_2000_node_train_graph_lays_out_in_seconds(tmp_path):
    path = write_net(tmp_path, deep_net(23))
    graph = train_graph(Net.load(str(path)))
    assert len(graph.nodes) >= 2000
    start = time.perf_counter()
    svg = graph_svg(graph)
    took = time.perf_counter() - start
    drawing = parse(svg)
    n_boxes, n_edges = counts(graph)
    assert len(drawing["boxes"]) == n_boxes and len(drawing["edges"]) == n_edges
    assert took < 20, f"{took:.1f} s"       # about 2 to 4 s on a busy 2-core machine

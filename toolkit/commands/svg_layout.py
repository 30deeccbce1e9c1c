"""A built-in layered drawing of a directed acyclic graph as SVG, for ``toolkit graph -o FILE.svg``
where Graphviz's ``dot`` is not installed (or ``--layout builtin``), and for the pictures of the
documentation site.

``draw(boxes, edges, title) -> str`` lays out any DAG of labelled boxes; ``graph_svg(graph,
title) -> str`` draws a toolkit ``Graph`` with the labels and colours of ``toolkit.commands.dot``.

The layout is the classic layered one (Sugiyama's), kept small:

1. layers: each box one layer below the lowest of its predecessors (longest path), then moved
   down to just above its first consumer (an input, a weight, a solver's constant sits next to
   where it is used; the longest path keeps its layers);
2. an edge that spans several layers passes through a point in each layer it crosses, so that it
   is routed between the boxes rather than through them;
3. order within a layer: a few downward and upward sweeps, each placing a box at the mean position
   of its neighbours in the layer before (the barycentre), keeping the order with fewest
   crossings;
4. coordinates: each box pulled towards the mean x of its neighbours, then the layer's boxes
   pushed apart as little as possible (isotonic regression, the pool-adjacent-violators
   algorithm), a few passes down and up;
5. edges: smooth curves from the bottom of the tail to the top of the head through the points of
   step 2, with an arrowhead.

Invariants: the SVG is well-formed XML (every text escaped); one ``<g class="node">`` per box and
one ``<path class="edge">`` per edge, in the order given; a box lies wholly below every box of an
earlier layer; the output depends only on the input (no randomness, no dict-order surprises).
Cost is linear in boxes plus edge crossings of layers, times the few sweeps: a 2,000-node train
graph takes about a second.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

FONT = "Helvetica, Arial, sans-serif"
FONT_SIZE = 10.0
CHAR_W = 6.0            # a conservative average glyph width at FONT_SIZE (no font metrics here)
LINE_H = 12.5
PAD_X, PAD_Y = 8.0, 5.0
GAP_X = 14.0            # between neighbouring boxes of a layer
GAP_Y = 30.0            # between layers
POINT_W = 6.0           # the width an edge passing through a layer takes there
MARGIN = 16.0
TITLE_H = 26.0
SWEEPS = 4
PASSES = 4
# item visits (boxes and edge points) each of steps 3 and 4 may spend: past it a big graph gets
# fewer sweeps and passes (at least one of each), so a 2,000-node train graph stays in seconds
EFFORT = 300_000
SOURCE_WEIGHT = 0.1


@dataclass
class Box:
    """One node of the drawing: its text lines (the first in bold), colours, and a tooltip."""
    lines: list[str]
    fill: str = "#ffffff"
    border: str = "#444444"
    tooltip: str = ""
    kind: str = "op"            # a CSS class, for styling and for tests
    double: bool = False        # a second border (the fused ops)
    rounded: bool = True


@dataclass
class Edge:
    tail: int
    head: int
    label: str = ""             # drawn where show_labels, else the edge's tooltip


@dataclass
class Layout:
    """Where everything goes: per box its layer and centre x, y, width and height; per edge its
    points from the tail's bottom to the head's top."""
    layer: list[int]
    x: list[float]
    y: list[float]
    w: list[float]
    h: list[float]
    paths: list[list[tuple[float, float]]] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0


def box_size(box: Box) -> tuple[float, float]:
    longest = max((len(line) for line in box.lines), default=0)
    return max(40.0, longest * CHAR_W + 2 * PAD_X), max(1, len(box.lines)) * LINE_H + 2 * PAD_Y


# -- 1. layers -----------------------------------------------------------------------------

def _layers(n: int, edges: list[Edge]) -> list[int]:
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for e in edges:
        succ[e.tail].append(e.head)
        indeg[e.head] += 1
    order = [v for v in range(n) if indeg[v] == 0]
    layer = [0] * n
    for v in order:                     # Kahn's order; the list grows as it is read
        for s in succ[v]:
            layer[s] = max(layer[s], layer[v] + 1)
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    if len(order) != n:
        raise ValueError("the graph has a cycle; only a DAG can be drawn in layers")
    for v in reversed(order):           # then each box as late as its consumers allow
        if succ[v]:
            layer[v] = min(layer[s] for s in succ[v]) - 1
    return layer


# -- 2. points where long edges cross layers, and 3. the order within each layer ------------

def _chains(layer: list[int], edges: list[Edge]):
    """Adds the points where long edges cross layers. The edges leaving one box share their points
    as far as they run together (a value read in the forward pass and again in the backward pass
    is one line until it branches), which keeps a train graph's drawing and its cost down.
    Returns every item's layer (boxes first, then points), each edge's chain of items from tail to
    head, and each item's neighbours in the layer above (``up``) and below (``down``)."""
    items = list(layer)
    trunk: dict[int, list[int]] = {}            # tail -> its shared points, layer by layer
    chains = []
    for e in edges:
        points = trunk.setdefault(e.tail, [])
        while len(points) < layer[e.head] - layer[e.tail] - 1:
            items.append(layer[e.tail] + len(points) + 1)
            points.append(len(items) - 1)
        chains.append([e.tail] + points[: layer[e.head] - layer[e.tail] - 1] + [e.head])
    links = sorted({(a, b) for chain in chains for a, b in zip(chain, chain[1:])})
    up: list[list[int]] = [[] for _ in items]
    down: list[list[int]] = [[] for _ in items]
    for a, b in links:
        down[a].append(b)
        up[b].append(a)
    return items, chains, up, down


def _crossings(upper_pos: dict[int, int], lower_pos: dict[int, int], links: list[tuple[int, int]]) -> int:
    """Edge crossings between two adjacent layers (pairs of links whose ends swap order)."""
    pairs = sorted((upper_pos[a], lower_pos[b]) for a, b in links)
    seen: list[int] = []
    count = 0
    for _, b in pairs:                  # count earlier links ending to the right of b
        i = bisect_left(seen, b + 1)
        count += len(seen) - i
        seen.insert(i, b)
    return count


def _order(items: list[int], up: list[list[int]], down: list[list[int]]) -> list[list[int]]:
    """Each layer's items, left to right: barycentre sweeps down and up, keeping the order with
    the fewest crossings (a big graph: one sweep each way, uncounted)."""
    depth = max(items, default=0) + 1
    base = min(items, default=0)
    rows: list[list[int]] = [[] for _ in range(depth - base)]
    for i, lay in enumerate(items):     # start from the given order: boxes, then edge points
        rows[lay - base].append(i)

    def total() -> int:
        count = 0
        for r in range(len(rows) - 1):
            pu = {v: k for k, v in enumerate(rows[r])}
            pl = {v: k for k, v in enumerate(rows[r + 1])}
            count += _crossings(pu, pl, [(a, b) for a in rows[r] for b in down[a]])
        return count

    pos = [0.0] * len(items)

    def sweep(indices, neighbours) -> None:
        for r in indices:
            row = rows[r]
            key = {}
            for v in row:
                near = neighbours[v]
                if len(near) == 1:      # most items: the points of long edges
                    key[v] = pos[near[0]]
                else:
                    key[v] = sum(pos[u] for u in near) / len(near) if near else pos[v]
            row.sort(key=lambda v: key[v])
            for k, v in enumerate(row):
                pos[v] = k

    for row in rows:
        for k, v in enumerate(row):
            pos[v] = k
    rounds = _rounds(SWEEPS, len(items))
    if rounds == 1:                     # a big graph: one sweep each way, no counting
        sweep(range(1, len(rows)), up)
        sweep(range(len(rows) - 2, -1, -1), down)
        return rows
    best, best_rows = total(), [list(r) for r in rows]
    for _ in range(rounds):
        sweep(range(1, len(rows)), up)
        sweep(range(len(rows) - 2, -1, -1), down)
        now = total()
        if now < best:
            best, best_rows = now, [list(r) for r in rows]
        if best == 0:
            break
    return best_rows


def _rounds(most: int, items: int) -> int:
    return max(1, min(most, EFFORT // max(1, 2 * items)))


# -- 4. coordinates --------------------------------------------------------------------------

def _pack(targets: list[float], widths: list[float], weights: list[float]) -> list[float]:
    """Centres as close as possible (weighted least squares) to ``targets``, in this order, each
    box at least GAP_X from the next: pool-adjacent-violators on the targets less the packed
    offsets. A heavier box moves less."""
    offsets, at = [], 0.0
    for k, w in enumerate(widths):
        if k:
            at += widths[k - 1] / 2 + GAP_X + w / 2
        offsets.append(at)
    blocks: list[list[float]] = []      # [mean, total weight, count]
    for t, o, wt in zip(targets, offsets, weights):
        blocks.append([t - o, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for mean, _, count in blocks:
        out += [mean] * count
    return [y + o for y, o in zip(out, offsets)]


def layout(boxes: list[Box], edges: list[Edge]) -> Layout:
    n = len(boxes)
    for e in edges:
        if not (0 <= e.tail < n and 0 <= e.head < n) or e.tail == e.head:
            raise ValueError(f"edge {e.tail} -> {e.head} does not join two boxes")
    layer = _layers(n, edges)
    items, chains, up, down = _chains(layer, edges)
    rows = _order(items, up, down)
    sizes = [box_size(b) for b in boxes]
    w = [s[0] for s in sizes] + [POINT_W] * (len(items) - n)
    h = [s[1] for s in sizes] + [0.0] * (len(items) - n)

    x = [0.0] * len(items)
    # a box that only feeds others (a weight, an input) gives way to the path it joins
    heft = [1.0 if up[v] or not down[v] else SOURCE_WEIGHT for v in range(len(items))]
    for row in rows:
        for v, c in zip(row, _pack([0.0] * len(row), [w[v] for v in row], [1.0] * len(row))):
            x[v] = c

    # going down, a box follows the boxes that compute its inputs, not its weights and graph
    # inputs (sources, which then take their places beside it going up): the main path stays straight
    computed = [[u for u in near if up[u]] or near for near in up]

    def place(row, neighbours) -> None:
        targets = []
        for v in row:
            near = neighbours[v]
            if len(near) == 1:
                targets.append(x[near[0]])
            else:
                targets.append(sum(x[u] for u in near) / len(near) if near else x[v])
        for v, c in zip(row, _pack(targets, [w[v] for v in row], [heft[v] for v in row])):
            x[v] = c

    for _ in range(_rounds(PASSES, len(items))):
        for row in rows[1:]:
            place(row, computed)
        for row in reversed(rows[:-1]):
            place(row, down)
    left = min((x[v] - w[v] / 2 for v in range(len(items))), default=0.0)
    x = [c - left + MARGIN for c in x]

    y = [0.0] * len(items)
    top, row_top, row_h = MARGIN + TITLE_H, [], []
    for row in rows:
        height = max((h[v] for v in row), default=0.0) or LINE_H
        row_top.append(top)
        row_h.append(height)
        for v in row:
            y[v] = top + height / 2
        top += height + GAP_Y
    base = min(items, default=0)

    paths = []
    for e, chain in zip(edges, chains):
        pts = [(x[e.tail], y[e.tail] + h[e.tail] / 2)]
        for p in chain[1:-1]:
            r = items[p] - base
            pts += [(x[p], row_top[r]), (x[p], row_top[r] + row_h[r])]
        pts.append((x[e.head], y[e.head] - h[e.head] / 2))
        paths.append(pts)
    _spread_ports(paths, edges, x[:n], w[:n])
    width = max((x[v] + w[v] / 2 for v in range(len(items))), default=0.0) + MARGIN
    return Layout(layer[:], x[:n], y[:n], w[:n], h[:n], paths, width, top - GAP_Y + MARGIN)


def _spread_ports(paths, edges, x, w) -> None:
    """Several edges leaving (or entering) one box start (end) side by side across its middle
    half, in the order of where their other ends lie, rather than all at one point."""
    for end, other in ((0, 1), (-1, -2)):
        at: dict[int, list[int]] = {}
        for k, e in enumerate(edges):
            at.setdefault(e.tail if end == 0 else e.head, []).append(k)
        for v, ks in at.items():
            if len(ks) < 2:
                continue
            ks.sort(key=lambda k: (paths[k][other][0], k))
            span = w[v] / 2
            for i, k in enumerate(ks):
                px = x[v] - span / 2 + span * (i + 0.5) / len(ks)
                paths[k][end] = (px, paths[k][end][1])


# -- 5. SVG ----------------------------------------------------------------------------------

def _attr(text: str) -> str:
    return escape(text, {'"': "&quot;"})


def _curve(pts: list[tuple[float, float]]) -> str:
    """Vertical-tangent cubic segments through the points (straight where a segment is vertical)."""
    d = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if abs(x1 - x0) < 0.05:
            d.append(f"L{x1:.1f},{y1:.1f}")
        else:
            mid = (y0 + y1) / 2
            d.append(f"C{x0:.1f},{mid:.1f} {x1:.1f},{mid:.1f} {x1:.1f},{y1:.1f}")
    return " ".join(d)


def render(boxes: list[Box], edges: list[Edge], lay: Layout, title: str = "",
           show_labels: bool = False) -> str:
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" width="{lay.width:.0f}" height="{lay.height:.0f}" '
           f'viewBox="0 0 {lay.width:.1f} {lay.height:.1f}" font-family="{FONT}" font-size="{FONT_SIZE:g}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#666666"/>'
           '</marker></defs>',
           '<rect class="background" width="100%" height="100%" fill="#ffffff"/>']
    if title:
        out.append(f'<text class="title" x="{MARGIN:g}" y="{MARGIN + 14:g}" font-size="14">{escape(title)}</text>')
    for k, (e, pts) in enumerate(zip(edges, lay.paths)):
        tip = f"<title>{escape(e.label)}</title>" if e.label else ""
        out.append(f'<path class="edge" id="e{k}" d="{_curve(pts)}" fill="none" stroke="#666666" '
                   f'stroke-width="1" marker-end="url(#arrow)">{tip}</path>')
        if show_labels and e.label:
            (x0, y0), (x1, y1) = pts[0], pts[1]
            out.append(f'<text class="edge-label" x="{(x0 + x1) / 2 + 4:.1f}" y="{(y0 + y1) / 2 + 3:.1f}" '
                       f'font-size="9" fill="#333333">{escape(e.label)}</text>')
    for v, box in enumerate(boxes):
        x, y, w, h = lay.x[v], lay.y[v], lay.w[v], lay.h[v]
        rx = 6 if box.rounded else 0
        out.append(f'<g class="node {box.kind}" id="n{v}">')
        if box.tooltip:
            out.append(f"<title>{escape(box.tooltip)}</title>")
        out.append(f'<rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{rx}" '
                   f'fill="{_attr(box.fill)}" stroke="{_attr(box.border)}" stroke-width="{1.6 if box.double else 1}"/>')
        if box.double:
            out.append(f'<rect x="{x - w / 2 + 3:.1f}" y="{y - h / 2 + 3:.1f}" width="{w - 6:.1f}" '
                       f'height="{h - 6:.1f}" rx="{max(rx - 2, 0)}" fill="none" stroke="{_attr(box.border)}"/>')
        first = y - h / 2 + PAD_Y + LINE_H - 3
        for i, line in enumerate(box.lines):
            weight = ' font-weight="bold"' if i == 0 else ""
            out.append(f'<text x="{x:.1f}" y="{first + i * LINE_H:.1f}" text-anchor="middle"{weight}>'
                       f"{escape(line)}</text>")
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def draw(boxes: list[Box], edges: list[Edge], title: str = "", show_labels: bool = False) -> str:
    """The SVG text of a DAG of ``boxes`` joined by ``edges`` (indices into ``boxes``)."""
    return render(boxes, edges, layout(boxes, edges), title, show_labels)


# -- a toolkit Graph -------------------------------------------------------------------------

def graph_svg(graph, title: str | None = None) -> str:
    """``graph`` drawn as ``to_dot`` describes it (same boxes, labels, colours, one edge per use
    of a value), laid out here: no clusters, the backward and solver nodes told by their colour."""
    from ..ir.graph import Value
    from .dot import BORDER, FILL, FUSED_FILL, MAX_SCOPE_CHARS, _attr_items, _attr_lines, _clip, _role, is_fused

    boxes: list[Box] = []
    source: dict[int, int] = {}
    for name, v in graph.inputs.items():
        source[v.id] = len(boxes)
        boxes.append(Box([f"input {name}", str(v.type)], "#fff2b3", "#8a7a2a", kind="input"))
    for name, wt in graph.weights.items():
        source[wt.value.id] = len(boxes)
        boxes.append(Box([f"{'param' if wt.trainable else 'state'} {name}", str(wt.value.type)],
                         "#ece4f7", "#6b5a8e", kind="weight", rounded=False))
    first_node = len(boxes)
    for node in graph.nodes:
        role, fused = _role(node), is_fused(node.op)
        for out in node.outputs:
            source[out.id] = len(boxes)
        lines = [node.op] + ([_clip(node.scope, MAX_SCOPE_CHARS)] if node.scope else []) + _attr_lines(node)
        tip = " ".join([f"{node.op} [{node.scope}]"] + _attr_items(node, clip=False))
        boxes.append(Box(lines, FUSED_FILL if fused else FILL[role], BORDER[role], _clip(tip, 600),
                         kind=f"op {role}", double=fused))
    edges: list[Edge] = []

    def edge(v: Value, head: int) -> None:
        if v.id not in source:
            raise ValueError(f"value {v!r} has no producer in the graph (run toolkit.ir.verify)")
        edges.append(Edge(source[v.id], head, str(v.type)))

    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            edge(v, first_node + i)
    for name, v in graph.outputs.items():
        boxes.append(Box([f"output {name}"], "#c9ecd3", "#3a7a4a", kind="output"))
        edge(v, len(boxes) - 1)
    for name, v in graph.updates.items():
        boxes.append(Box([f"update {name}"], "#e6e6e6", "#666666", kind="update", rounded=False))
        edge(v, len(boxes) - 1)
    return draw(boxes, edges, title or f"{graph.phase} graph")

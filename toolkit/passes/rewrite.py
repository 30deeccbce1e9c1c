"""What the passes share for editing a graph: value substitution, constant look-ups, reader counts,
typed node creation, and the regions a layout pass groups values into.

Invariant kept by every helper: a value is only ever replaced by a value of the same type (shape
and dtype), so a rewrite can never change what a consumer's shape rule sees.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.dims import Sym
from ..ir.graph import Graph, Node, Value
from ..ops.base import Builder

CONSTANT_OPS = ("constant", "scalar")


def constant_value(v: Value) -> np.ndarray | None:
    """The array of a value produced by a constant or scalar node, else None."""
    node = v.producer
    if node is None:
        return None
    if node.op == "constant":
        return node.attrs["value"]
    if node.op == "scalar":
        return np.asarray(node.attrs["value"], dtype=node.attrs["dtype"])
    return None


def all_equal(v: Value, number: float) -> bool:
    """True when ``v`` is a constant whose every element equals ``number`` (and is not NaN)."""
    arr = constant_value(v)
    return arr is not None and arr.size > 0 and bool(np.all(arr == number))


def scalar_of(v: Value) -> float | None:
    """The number of a 0-d constant, else None."""
    arr = constant_value(v)
    if arr is None or arr.shape != ():
        return None
    return arr.item()


def is_concrete(obj: Any) -> bool:
    """No symbolic dimension anywhere in a shape or an attribute value."""
    if isinstance(obj, Sym):
        return False
    if isinstance(obj, (tuple, list)):
        return all(is_concrete(x) for x in obj)
    if isinstance(obj, dict):
        return all(is_concrete(x) for x in obj.values())
    return True


def kept_ids(graph: Graph) -> set[int]:
    """Values the graph hands out (outputs and weight updates): they must survive every rewrite."""
    return {v.id for v in graph.outputs.values()} | {v.id for v in graph.updates.values()}


def reader_counts(graph: Graph) -> dict[int, int]:
    """How many node inputs read each value; outputs and updates count as readers too."""
    counts: dict[int, int] = {}
    for node in graph.nodes:
        for v in node.inputs:
            counts[v.id] = counts.get(v.id, 0) + 1
    for vid in kept_ids(graph):
        counts[vid] = counts.get(vid, 0) + 1
    return counts


class Substitution:
    """Pending replacements old value -> new value, applied to every use in one sweep."""

    def __init__(self):
        self.map: dict[int, Value] = {}

    def __bool__(self) -> bool:
        return bool(self.map)

    def replace(self, old: Value, new: Value) -> None:
        new = self.resolve(new)
        if old.id == new.id:
            return
        if old.type != new.type:
            raise AssertionError(f"rewrite would change the type of {old!r}: {old.type} -> {new.type}")
        # the replacement holds what the old value held: it keeps the top's name (the quantize
        # pass finds a top's scale by it, after BatchNorm folding replaced the top's value)
        new.name = new.name or old.name
        self.map[old.id] = new

    def resolve(self, v: Value) -> Value:
        while v.id in self.map:
            v = self.map[v.id]
        return v

    def apply_to_node(self, node: Node) -> None:
        if self.map:
            node.inputs = [self.resolve(v) for v in node.inputs]

    def apply(self, graph: Graph) -> None:
        """Rewrite every use in the graph: node inputs, outputs and updates."""
        if not self.map:
            return
        for node in graph.nodes:
            self.apply_to_node(node)
        graph.outputs = {k: self.resolve(v) for k, v in graph.outputs.items()}
        graph.updates = {k: self.resolve(v) for k, v in graph.updates.items()}


class Emitter(Builder):
    """A Builder whose nodes go to a list the pass splices into the graph where it wants them."""

    def __init__(self, scope: str):
        super().__init__(Graph("scratch"), scope)

    def take(self) -> list[Node]:
        nodes = self.graph.nodes
        self.graph.nodes = []
        return nodes


def constant_node(value: np.ndarray, scope: str) -> Node:
    """A typed node holding ``value`` through a read-only view (plans share it, never copy it)."""
    arr = np.asarray(value).view()
    arr.flags.writeable = False
    emitter = Emitter(scope)
    emitter.op("constant", value=arr)
    return emitter.take()[0]


class LayoutRewriter:
    """The walk both layout passes make (layout.py's blocked layout, layout_nhwc.py's channels
    last): nodes emitted in order into a new list, each NCHW value's form in the other layout
    (``other``), the values that exist only in that form, their forms reordered back to NCHW
    (made once, on first demand: ``reorder_back``), and counts of the reorders (the ops named in
    ``REORDERS``) and of the ops that followed the layout."""

    REORDERS: tuple[str, ...] = ()

    def __init__(self):
        self.nodes: list[Node] = []
        self.other: dict[int, Value] = {}        # NCHW value id -> its form in the other layout
        self.only_other: set[int] = set()        # NCHW values that exist only in that form
        self.plain: dict[int, Value] = {}        # NCHW value id -> its reordered-back form
        self.subst = Substitution()
        self.reorders = {op: 0 for op in self.REORDERS}
        self.followers = 0

    def emit(self, scope: str, op: str, *inputs: Value, **attrs) -> Value:
        e = Emitter(scope)
        out = e.op(op, *inputs, **attrs)
        self.nodes += e.take()
        if op in self.reorders:
            self.reorders[op] += 1
        return out

    def reorder_back(self, v: Value, y: Value) -> Value:
        """The NCHW value ``v`` made from its other-layout form ``y``."""
        raise NotImplementedError

    def to_plain(self, v: Value) -> Value:
        """The NCHW form of a value that may exist only in the other layout."""
        if v.id not in self.only_other:
            return v
        if v.id not in self.plain:
            y = self.other[v.id]
            p = self.reorder_back(v, y)
            self.plain[v.id] = p
            self.other[p.id] = y                  # wanted in the other layout again: the source, no reorder
            self.subst.replace(v, p)
        return self.plain[v.id]

    def produce(self, old: Value, new: Value) -> None:
        """``old`` is now made in the other layout only, as ``new``."""
        self.other[old.id] = new
        self.only_other.add(old.id)

    def keep(self, node: Node) -> None:
        """A node that stays NCHW: its inputs in their NCHW form."""
        node.inputs = [self.to_plain(self.subst.resolve(v)) for v in node.inputs]
        self.nodes.append(node)


class Regions:
    """Union-find over value ids, for the layout passes (layout.py, layout_nhwc.py): a candidate
    convolution joins its input and output, an op that would follow the layout joins its image
    operands and its result, and each region then goes one layout or the other as a whole."""

    def __init__(self):
        self.parent: dict[int, int] = {}

    def find(self, a: int) -> int:
        self.parent.setdefault(a, a)
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)

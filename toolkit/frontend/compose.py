"""Composition: a net file built on others with ``base:`` (docs/spec.md section 1, "Composition").

Every file is read into a *located tree* (each mapping key, list item and scalar keeps the
FILE:LINE:COL where it was written), bases are merged first to last and the file itself last,
and the result is flattened back into plain data plus Positions. Because locations travel with
the values, a problem in the merged net is reported in whichever file wrote the offending key.

Merge rules: layers merge by name, in the bases' order (``after``/``before`` place a layer,
``delete: true`` removes one, and a layer of that name written after the delete, in the same file
or a later one, is a new layer in its place); mappings merge key by key, except that a mapping whose ``type``
changes (a layer, a filler, the solver, the lr policy) is replaced whole, because its keys belong
to another kind of thing (a sgd ``momentum`` means nothing to adam); every other list replaces.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ..errors import Location, Problem, SpecError, UserError, did_you_mean
from .resolver import ZOO_PREFIX, Resolver, zoo_model
from .spec import read_text
from .yaml_loader import Positions, load_yaml

PLACEMENT_KEYS = ("after", "before", "delete")   # consumed by the merge, never seen by the schema


@dataclass
class Scalar:
    value: Any
    loc: Location


@dataclass
class Seq:
    items: list["Node"]
    loc: Location


@dataclass
class Map:
    entries: dict[Any, tuple[Location, "Node"]]   # key -> (where the key was written, value)
    loc: Location

    def get(self, key) -> "Node | None":
        entry = self.entries.get(key)
        return entry[1] if entry else None

    def key_loc(self, key) -> Location:
        return self.entries[key][0]

    def scalar(self, key) -> Any:
        node = self.get(key)
        return node.value if isinstance(node, Scalar) else None


Node = Union[Scalar, Seq, Map]


@dataclass
class Composed:
    """A net file with its bases merged: plain data, where each piece was written, the files read
    and the tops of layers that a derived file deleted (top -> (layer, where it was deleted))."""

    data: Any
    positions: Positions
    files: list[str] = field(default_factory=list)
    deleted: dict[str, tuple[str, Location]] = field(default_factory=dict)
    bases: list[str] = field(default_factory=list)     # the root file's bases, as written
    # layers deleted and written anew: new layers, whose weights start from their fillers even
    # where a weights file holds some of that name (a fine-tuned net's new head)
    replaced: set[str] = field(default_factory=set)
    # each base file that is a zoo model's net (its real path) -> zoo:NAME, so the data the model
    # bundles beside it can be fetched when a run reads it
    zoo: dict[str, str] = field(default_factory=dict)

    def explain(self, problem: Problem) -> Problem:
        """A wiring problem about a top that a deleted layer used to produce says so."""
        for top, (layer, where) in self.deleted.items():
            if f"unknown bottom '{top}'" in problem.message:
                return Problem(f"{problem.message} (layer '{layer}', which produced it, is deleted at {where})",
                               problem.location)
        return problem


def compose(path: str, resolve: Resolver | None = None, text: str | None = None) -> Composed:
    """Reads ``path`` (or takes ``text`` as its contents: a net given as a string, ``path`` then
    naming it in messages, its bases and data relative to the current folder) and, if it has
    ``base:``, everything it builds on (``resolve`` finds a ``zoo:NAME`` base's file). Raises
    SpecError with every composition problem found (missing or cyclic bases, merges naming no
    base layer)."""
    text = read_text(path) if text is None else text
    data, positions = load_yaml(text, path)
    if not (isinstance(data, dict) and "base" in data):
        return Composed(data, positions, [path])
    state = _State(resolve=resolve)
    tree = _compose_file(path, _tree(data, positions, ()), positions, state, (_real(path),))
    if state.problems:
        problems = sorted(state.problems, key=lambda p: (p.location.file != path, p.location.file,
                                                         p.location.line, p.location.col))
        raise SpecError(*problems)
    out = Positions(path, merged=True)
    merged = _flatten(tree, (), out)
    bases = data["base"] if isinstance(data["base"], list) else [data["base"]]
    return Composed(merged, out, state.files, state.deleted, [str(b) for b in bases], state.replaced, state.zoo)


@dataclass
class _State:
    problems: list[Problem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    deleted: dict[str, tuple[str, Location]] = field(default_factory=dict)
    # a deleted layer's name -> the layer that stood above it (None: it was first), where a new
    # layer of that name goes unless it says otherwise
    gaps: dict[str, str | None] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)
    resolve: Resolver | None = None
    # each base file composed once, by real path: a base named twice, or reached through several
    # others, is merged from the same tree (merges build new trees and never change one), so a
    # chain of `base: [prev, prev]` costs its length, not two to the power of it
    composed: dict[str, Node] = field(default_factory=dict)
    zoo: dict[str, str] = field(default_factory=dict)         # as Composed.zoo


def _real(path: str | Path) -> str:
    return os.path.realpath(path)


# -- located trees ---------------------------------------------------------------------------
def _tree(data: Any, positions: Positions, path: tuple) -> Node:
    loc = positions.locate(path, prefer_key=False)
    if isinstance(data, dict):
        return Map({k: (positions.locate(path + (k,)), _tree(v, positions, path + (k,))) for k, v in data.items()}, loc)
    if isinstance(data, list):
        return Seq([_tree(v, positions, path + (i,)) for i, v in enumerate(data)], loc)
    return Scalar(data, loc)


def _flatten(node: Node, path: tuple, out: Positions) -> Any:
    out.values[path] = node.loc
    if isinstance(node, Map):
        result = {}
        for key, (key_loc, value) in node.entries.items():
            out.keys[path + (key,)] = key_loc
            result[key] = _flatten(value, path + (key,), out)
        return result
    if isinstance(node, Seq):
        return [_flatten(item, path + (i,), out) for i, item in enumerate(node.items)]
    return node.value


# -- bases -----------------------------------------------------------------------------------
def _compose_file(path: str, root: Node, positions: Positions, state: _State, chain: tuple[str, ...]) -> Node:
    """The file's tree with its bases merged under it (``chain``: the real paths being composed,
    to catch a base that includes itself)."""
    state.files.append(path)
    if not isinstance(root, Map):
        if chain[1:]:   # a base that is not a mapping; the root file's own case is the schema's
            state.problems.append(Problem("a base net file is a mapping (name, inputs, layers, train, ...)", root.loc))
        return root
    base_node = root.get("base")
    merged: Map | None = None
    for ref, where in _base_refs(root, state):
        base_path = _locate_base(ref, path, where, state)
        if base_path is None:
            continue
        real = _real(base_path)
        if real in chain:
            here = os.path.dirname(_real(path))
            cycle = " -> ".join(_short(p, here) for p in chain[chain.index(real):] + (real,))
            state.problems.append(Problem(f"base '{ref}' includes itself ({cycle})", where))
            continue
        base_tree = state.composed.get(real)
        if base_tree is None:
            try:
                data, base_positions = load_yaml(read_text(base_path), base_path)
            except SpecError as error:
                state.problems.extend(error.problems)
                continue
            except UserError as error:
                state.problems.append(Problem(f"base '{ref}': {error.problems[0].message}", where))
                continue
            if not isinstance(data, dict):
                state.problems.append(Problem(f"base '{ref}' is not a net file (a mapping with name, inputs, layers)",
                                              where))
                continue
            base_tree = state.composed[real] = _compose_file(base_path, _tree(data, base_positions, ()),
                                                             base_positions, state, chain + (real,))
        merged = base_tree if merged is None else _overlay(merged, base_tree, state, has_base=True)
    own = Map({k: v for k, v in root.entries.items() if k != "base"}, root.loc)
    if base_node is None or merged is None:
        return _overlay(Map({}, root.loc), own, state, has_base=False) if base_node is None else own
    return _overlay(merged, own, state, has_base=True)


def _short(real: str, start: str) -> str:
    """A path as seen from the folder of the file that reports it."""
    try:
        return os.path.relpath(real, start)
    except ValueError:      # another drive (Windows)
        return real


def _base_refs(root: Map, state: _State) -> list[tuple[str, Location]]:
    node = root.get("base")
    if node is None:
        return []
    items = node.items if isinstance(node, Seq) else [node]
    refs = []
    for item in items:
        if isinstance(item, Scalar) and isinstance(item.value, str) and item.value.strip():
            refs.append((item.value.strip(), item.loc))
        else:
            state.problems.append(Problem("base: expected a path, zoo:NAME, or a list of them", item.loc))
    if isinstance(node, Seq) and not node.items:
        state.problems.append(Problem("base: the list is empty", node.loc))
    return refs


def _locate_base(ref: str, path: str, where: Location, state: _State) -> str | None:
    if ref.startswith(ZOO_PREFIX):
        try:
            net = str(zoo_model(state.resolve, ref).net)
            state.zoo[_real(net)] = ref
            return net
        except UserError as error:
            state.problems.append(Problem(f"base '{ref}': {error.problems[0].message}", where))
            return None
    candidate = Path(ref).expanduser()
    if not candidate.is_absolute():
        candidate = Path(path).parent / candidate
    if not candidate.exists():
        state.problems.append(Problem(f"base '{ref}': no such file (paths are relative to the folder of "
                                      f"{Path(path).name})", where))
        return None
    if candidate.is_dir():
        nested = candidate / "net.yaml"
        if nested.is_file():
            return str(nested)
        state.problems.append(Problem(f"base '{ref}' is a folder without a net.yaml", where))
        return None
    return str(candidate)


# -- merging ---------------------------------------------------------------------------------
def _overlay(under: Map, over: Map, state: _State, has_base: bool) -> Map:
    """``over`` merged onto ``under``: top-level keys merge, ``layers`` by layer name."""
    entries = dict(under.entries)
    for key, (key_loc, value) in over.entries.items():
        if key == "layers":
            before = under.get("layers")
            entries[key] = (key_loc, _merge_layers(before if isinstance(before, Seq) else None, value, state, has_base))
        else:
            entries[key] = (key_loc, _merge_value(under.get(key), value))
    return Map(entries, over.loc if over.entries else under.loc)


def _merge_value(under: Node | None, over: Node) -> Node:
    """Mappings merge key by key (``over`` wins), except that a mapping whose ``type`` differs
    from the one under it replaces it whole; anything else is replaced."""
    if not (isinstance(under, Map) and isinstance(over, Map)):
        return over
    if "type" in over.entries and over.scalar("type") != under.scalar("type"):
        return over
    entries = dict(under.entries)
    for key, (key_loc, value) in over.entries.items():
        entries[key] = (key_loc, _merge_value(under.get(key), value))
    return Map(entries, over.loc)


def _merge_layers(under: Seq | None, over: Node, state: _State, has_base: bool) -> Node:
    if not isinstance(over, Seq):
        return over       # not a list: the schema says so, at this file's line
    layers: list[Node] = list(under.items) if under is not None else []
    seen_here: dict[str, Location] = {}
    deleted_here: set[str] = set()        # deleted in this file and not yet written anew
    for entry in over.items:
        name = entry.scalar("name") if isinstance(entry, Map) else None
        if not isinstance(name, str):
            layers.append(entry)     # the schema reports a missing or odd name
            continue
        name_loc = entry.get("name").loc
        if name in seen_here and name not in deleted_here:
            state.problems.append(Problem(f"layer name '{name}' is already used (line {seen_here[name].line})",
                                          name_loc))
            continue
        deleted_here.discard(name)
        seen_here[name] = name_loc
        controls = _placement(entry, name, state)
        if controls is None:
            continue
        body = Map({k: v for k, v in entry.entries.items() if k not in PLACEMENT_KEYS}, entry.loc)
        index = _index_of(layers, name)
        if controls.get("delete"):
            if _delete(layers, index, name, entry, state, has_base):
                deleted_here.add(name)
            continue
        if index is None and name in state.gaps and "type" in body.entries:
            # a deleted layer written anew: a new layer (fresh weights), where the old one stood
            # unless it is placed
            state.replaced.add(name)
            above = state.gaps.pop(name)
            if not ("after" in controls or "before" in controls):
                at = 0 if above is None else _index_of(layers, above)
                if at is not None:
                    layers.insert(at if above is None else at + 1, body)
                    continue
        if index is not None:
            merged = _merge_value(layers[index], body)
            if "after" in controls or "before" in controls:
                layers.pop(index)
                _place(layers, merged, controls, name, state)
            else:
                layers[index] = merged
            continue
        if has_base and "type" not in body.entries:
            names = [n for n in (_layer_name(layer) for layer in layers) if n]
            state.problems.append(Problem(f"layer '{name}' is in no base, and has no 'type' to be a new layer"
                                          f"{did_you_mean(name, names)}", name_loc))
            continue
        _place(layers, body, controls, name, state)
    return Seq(layers, over.loc)


def _placement(entry: Map, name: str, state: _State) -> dict | None:
    """The entry's after/before/delete, checked; None if they are unusable (already reported)."""
    controls = {}
    for key in PLACEMENT_KEYS:
        node = entry.get(key)
        if node is None:
            continue
        value = node.value if isinstance(node, Scalar) else None
        if key == "delete":
            if not isinstance(value, bool):
                state.problems.append(Problem(f"layer '{name}': 'delete' is true or false", node.loc))
                return None
        elif not isinstance(value, str):
            state.problems.append(Problem(f"layer '{name}': '{key}' names the layer to place it {key}", node.loc))
            return None
        controls[key] = (value, node.loc)
    if "after" in controls and "before" in controls:
        state.problems.append(Problem(f"layer '{name}': give 'after' or 'before', not both",
                                      entry.key_loc("before")))
        return None
    if controls.get("delete", (False,))[0]:
        extra = [k for k in entry.entries if k not in ("name", "delete")]
        if extra:
            state.problems.append(Problem(f"layer '{name}': a deleted layer takes no other keys (found "
                                          f"'{extra[0]}')", entry.key_loc(extra[0])))
            return None
        return {"delete": True}
    controls.pop("delete", None)
    return controls


def _delete(layers: list[Node], index: int | None, name: str, entry: Map, state: _State, has_base: bool) -> bool:
    """Removes the layer; False (with the problem reported) where there is none to remove."""
    where = entry.key_loc("delete")
    if index is None:
        names = [n for n in (_layer_name(layer) for layer in layers) if n]
        state.problems.append(Problem(f"delete: no layer '{name}' in the base{'s' if has_base else ''} to delete"
                                      f"{did_you_mean(name, names)}", entry.get("name").loc))
        return False
    state.gaps[name] = _layer_name(layers[index - 1]) if index > 0 else None
    removed = layers.pop(index)
    top = removed.get("top") if isinstance(removed, Map) else None
    tops = [t.value for t in top.items] if isinstance(top, Seq) else [top.value] if isinstance(top, Scalar) else []
    for t in tops:
        if isinstance(t, str):
            state.deleted[t] = (name, where)
    return True


def _place(layers: list[Node], layer: Map, controls: dict, name: str, state: _State) -> None:
    for key, offset in (("after", 1), ("before", 0)):
        if key not in controls:
            continue
        target, where = controls[key]
        index = _index_of(layers, target)
        if target == name or index is None:
            names = [n for n in (_layer_name(other) for other in layers) if n and n != name]
            state.problems.append(Problem(f"layer '{name}': {key}: no layer '{target}' to place it {key}"
                                          f"{did_you_mean(target, names)}", where))
            layers.append(layer)
            return
        layers.insert(index + offset, layer)
        return
    layers.append(layer)


def _layer_name(node: Node) -> str | None:
    name = node.scalar("name") if isinstance(node, Map) else None
    return name if isinstance(name, str) else None


def _index_of(layers: list[Node], name: str) -> int | None:
    for i, layer in enumerate(layers):
        if _layer_name(layer) == name:
            return i
    return None

"""Safe YAML reading that remembers where every key and value came from.

Built on PyYAML's SafeLoader composer (no tag can construct Python objects); duplicate keys,
unknown tags and syntax errors become SpecErrors with FILE:LINE:COL. Merge keys (``<<``) are
resolved here, each merged mapping once and every key counted against MAX_NODES, so that
anchors merged into one another cannot expand without bound, whatever PyYAML's version.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from ..errors import Location, Problem, SpecError

Path = tuple[Any, ...]


@dataclass
class Positions:
    """Where each path of the document starts: the key (for mapping entries) and the value."""

    file: str
    keys: dict[Path, Location] = field(default_factory=dict)
    values: dict[Path, Location] = field(default_factory=dict)
    merged: bool = False        # a net built on bases: its layers' order is the merge's, not the lines'

    def locate(self, path: Path, prefer_key: bool = True) -> Location:
        """The location of ``path``, or of its nearest ancestor that has one."""
        path = tuple(path)
        while True:
            table = (self.keys, self.values) if prefer_key else (self.values, self.keys)
            for t in table:
                if path in t:
                    return t[path]
            if not path:
                return Location(self.file, 1, 1)
            path = path[:-1]


def _loc(file: str, mark) -> Location:
    return Location(file, mark.line + 1, mark.column + 1)


def load_yaml(text: str, file: str) -> tuple[Any, Positions]:
    positions = Positions(file)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as e:      # a control character PyYAML refuses, found up front
        char = f"U+{e.character:04X}" if isinstance(e.character, int) else repr(e.character)
        raise SpecError(Problem(f"YAML syntax: control character {char} is not allowed",
                                _offset_loc(file, text, e.position))) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            where = _loc(file, mark) if mark else Location(file, 1, 1)
            message = e.problem or e.context
            cm = e.context_mark
            if e.problem and e.context and cm is not None and mark is not None and cm.line != mark.line:
                # the parser notices the problem later than its cause: say where the construct began
                message += f" ({e.context} that starts at line {cm.line + 1}, column {cm.column + 1})"
            raise SpecError(Problem(f"YAML syntax: {message}", where)) from None
        except yaml.YAMLError as e:
            raise SpecError(Problem(f"YAML syntax: {e}", Location(file, 1, 1))) from None
        except RecursionError:
            raise SpecError(Problem("YAML is nested too deeply", Location(file, 1, 1))) from None
        if root is None:
            raise SpecError(Problem("the file is empty; a net needs at least 'name', 'inputs' and 'layers'",
                                    Location(file, 1, 1)))
        problems: list[Problem] = []
        try:
            data = _construct(loader, root, (), positions, problems, _Merges())
        except _TooLarge:
            raise SpecError(Problem(f"the YAML expands to more than {MAX_NODES:,} values (aliases repeated too often?)",
                                    Location(file, 1, 1))) from None
        except RecursionError:
            raise SpecError(Problem("YAML is nested too deeply", Location(file, 1, 1))) from None
        if problems:
            raise SpecError(*problems)
        return data, positions
    finally:
        loader.dispose()


def _offset_loc(file: str, text: str, offset: int) -> Location:
    line = text.count("\n", 0, offset) + 1
    return Location(file, line, offset - (text.rfind("\n", 0, offset) + 1) + 1)


_COLLECTION_TAGS = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}


MAX_NODES = 200_000   # far beyond any net; stops alias bombs ("billion laughs") early
INT_RANGE = (-(1 << 63), (1 << 64) - 1)      # no field of a net file holds more than 64 bits
MAX_INT_CHARS = 72    # 64 binary digits, their prefix, a sign, a few underscores: longer is never in range


def int_problem(loader, node) -> str | None:
    """Why the YAML integer ``node`` is beyond what any field holds (64 bits), or None; a long
    one is refused unconverted (Python will not convert 4,300 digits or more)."""
    text = node.value
    if len(text) > MAX_INT_CHARS:
        return f"an integer of {len(text):,} digits is more than any field holds (64 bits)"
    value = SafeConstructor.construct_yaml_int(loader, node)
    if not INT_RANGE[0] <= value <= INT_RANGE[1]:
        return f"the integer {text} is more than any field holds (64 bits)"
    return None


class _ValueLoader(yaml.SafeLoader):
    """yaml.safe_load for one value of the command line (``--set``), its integers bounded as a
    net file's are: a ValueError says why."""

    def construct_yaml_int(self, node):
        why = int_problem(self, node)
        if why is not None:
            raise ValueError(why)
        return super().construct_yaml_int(node)


_ValueLoader.add_constructor("tag:yaml.org,2002:int", _ValueLoader.construct_yaml_int)


def load_value(text: str) -> Any:
    """A value given on the command line, read as YAML (yaml.YAMLError where it is not YAML,
    ValueError where an integer is out of range)."""
    loader = _ValueLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


class _TooLarge(Exception):
    pass


MERGE = "tag:yaml.org,2002:merge"


class _Merges:
    """Merge keys of one document resolved, each mapping node once (an anchor merged into many
    mappings is flattened once), with every key a merge contributes counted."""

    def __init__(self):
        self.flat: set[int] = set()
        self.keys = 0

    def flatten(self, node, file: str) -> None:
        """``node.value`` with its merge keys replaced by the keys they bring, as YAML's merge type
        says: a key of the mapping itself wins over a merged one, and of several merged mappings
        the earlier wins. Raises SpecError-ready problems through yaml.MarkedYAMLError."""
        if id(node) in self.flat:
            return
        self.flat.add(id(node))
        own, sources = [], []
        for key_node, value_node in node.value:
            if key_node.tag != MERGE:
                own.append((key_node, value_node))
                continue
            items = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for item in items:
                if not isinstance(item, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        None, None, f"a merge key (<<) takes a mapping or a list of mappings, not a {item.id}",
                        item.start_mark)
                sources.append(item)
        if not sources:
            return
        present = {_key_of(k) for k, _ in own}
        merged = []
        for source in dict.fromkeys(sources):        # the same anchor twice merges once
            self.flatten(source, file)
            for key_node, value_node in source.value:
                self.keys += 1
                if self.keys > MAX_NODES:
                    raise _TooLarge()
                key = _key_of(key_node)
                if key not in present:
                    present.add(key)
                    merged.append((key_node, value_node))
        node.value = merged + own


def _key_of(node) -> Any:
    """What tells two keys apart: a scalar's text and tag, else the node itself."""
    return (node.tag, node.value) if isinstance(node, yaml.ScalarNode) else id(node)


def _construct(loader, node, path: Path, pos: Positions, problems: list[Problem], merges: _Merges) -> Any:
    if len(pos.values) > MAX_NODES:
        raise _TooLarge()
    pos.values.setdefault(path, _loc(pos.file, node.start_mark))
    expected = _COLLECTION_TAGS.get(type(node))
    if expected is not None and node.tag != expected:
        problems.append(Problem(f"unsupported or unsafe YAML tag '{node.tag}'", _loc(pos.file, node.start_mark)))
        return None
    if isinstance(node, yaml.MappingNode):
        try:
            merges.flatten(node, pos.file)
        except yaml.MarkedYAMLError as e:
            problems.append(Problem(f"YAML: {e.problem}", _loc(pos.file, e.problem_mark)))
            return {}
        out: dict = {}
        for key_node, value_node in node.value:
            key = _construct(loader, key_node, path + ("<key>",), pos, problems, merges)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                problems.append(Problem("mapping keys must be plain scalars", _loc(pos.file, key_node.start_mark)))
                continue
            if key in out:
                problems.append(Problem(f"duplicate key '{key}'", _loc(pos.file, key_node.start_mark)))
                continue
            pos.keys[path + (key,)] = _loc(pos.file, key_node.start_mark)
            out[key] = _construct(loader, value_node, path + (key,), pos, problems, merges)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, path + (i,), pos, problems, merges) for i, item in enumerate(node.value)]
    constructor = SafeConstructor.yaml_constructors.get(node.tag)
    if constructor is None or node.tag == "tag:yaml.org,2002:timestamp":
        problems.append(Problem(f"unsupported or unsafe YAML tag '{node.tag}'", _loc(pos.file, node.start_mark)))
        return None
    if node.tag == "tag:yaml.org,2002:int":
        why = int_problem(loader, node)
        if why is not None:
            problems.append(Problem(why, _loc(pos.file, node.start_mark)))
            return None
    return constructor(loader, node)

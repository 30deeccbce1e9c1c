"""Reading a net file into a validated NetSpec, with pydantic's errors rewritten as
``FILE:LINE:COL: error: ...`` lines that name the layer and the key, plus near-miss hints."""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, get_args

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import Location, Problem, SpecError, UserError, did_you_mean
from ..fileio import read_regular
from .yaml_loader import Positions, load_value

# A net file is a few kilobytes (a ResNet-152 written out is under 100 kB); this much text is
# read at the most, so a base that is a device or a file that keeps growing cannot exhaust memory.
MAX_NET_BYTES = 16 << 20


def read_text(path: str) -> str:
    """A net file's text: a regular file (not a FIFO or a device) of at most MAX_NET_BYTES, UTF-8."""
    data = read_regular(path, MAX_NET_BYTES, "net file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None


def parse_overrides(items: list[str]) -> list[tuple[tuple, object]]:
    """``a.b.0.c=VALUE`` -> ((a, b, 0, c), value); VALUE is read as YAML (numbers, lists, strings)."""
    out = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item}: expected KEY=VALUE, e.g. train.solver.base_lr=0.1")
        try:
            value = load_value(text)
        except yaml.YAMLError:
            raise UserError(f"--set {item}: the value is not valid YAML") from None
        except ValueError as e:                 # an integer beyond 64 bits
            raise UserError(f"--set {key}: {e}") from None
        # (an index of 19 digits or more is no list's: left a key, which is then unknown)
        path = tuple(int(p) if p.lstrip("-").isdigit() and len(p) < 19 else p for p in key.strip().split("."))
        out.append((path, value))
    return out


def validate_net(data: Any, positions: Positions, net_model: type[BaseModel],
                 layer_models: dict[str, type[BaseModel]],
                 overrides: list[tuple[tuple, Any]] = (),
                 narrow: Callable[[dict], type[BaseModel]] | None = None) -> tuple[BaseModel, dict, Positions]:
    """A net already read (and composed) as plain data, with ``--set`` overrides applied last;
    ``narrow`` gives the model for the data as overridden in place of ``net_model`` (the net model
    over the layer types it names: ``layers.net_model_for``)."""
    if not isinstance(data, dict):
        raise SpecError(Problem("a net file is a mapping with 'name', 'inputs' and 'layers'",
                                positions.locate(())))
    # a new type replaces its mapping whole: apply those first, so that the settings given with
    # it (--set train.solver.base_lr=... --set train.solver.type=adam) survive in either order
    for path, value in sorted(overrides, key=lambda o: not (o[0] and o[0][-1] == "type")):
        written = _apply_override(data, path, value)
        _mark_overridden(positions, written, f"--set {'.'.join(map(str, path))}")
    if narrow is not None:
        net_model = narrow(data)
    try:
        spec = net_model.model_validate(data)
    except ValidationError as e:
        problems = _problems(e, data, positions, net_model, layer_models) + duplicate_layer_names(data, positions)
        problems.sort(key=lambda p: (p.location.line, p.location.col))
        error = SpecError(*problems)
        error.partial = partial_spec(data, net_model)     # what validated, for the wiring checks
        error.positions = positions
        raise error from None
    return spec, data, positions


@dataclass
class BrokenLayer:
    """A layer that failed validation: skipped by the wiring checks, its tops known to be broken
    so that layers using them get no second error."""

    name: str
    tops: list[str]
    phases: tuple[str, ...]
    broken: bool = True


def _broken_layer(raw, index: int) -> BrokenLayer:
    """What can be read of a layer mapping that failed validation: its name, tops and phases."""
    raw = raw if isinstance(raw, dict) else {}
    top = raw.get("top", [])
    tops = [top] if isinstance(top, str) else [t for t in top if isinstance(t, str)] if isinstance(top, list) else []
    phase = raw.get("phase")
    phases = (tuple(phase) if isinstance(phase, list) else (phase,) if isinstance(phase, str)
              else ("train", "test", "infer"))
    return BrokenLayer(str(raw.get("name", f"#{index + 1}")), tops, phases)


def partial_spec(data: dict, net_model: type[BaseModel]) -> SimpleNamespace | None:
    """The parts of a net that validate on their own: the inputs (required) and each layer,
    with BrokenLayer in place of the ones that do not. None if the inputs themselves are bad."""
    fields = net_model.model_fields
    try:
        inputs = TypeAdapter(fields["inputs"].annotation).validate_python(data.get("inputs"))
    except ValidationError:
        return None
    raw_layers = data.get("layers")
    if not isinstance(raw_layers, list):
        return None
    layer_adapter = TypeAdapter(get_args(fields["layers"].annotation)[0])
    layers = []
    for i, raw in enumerate(raw_layers):
        try:
            layers.append(layer_adapter.validate_python(raw))
        except ValidationError:
            layers.append(_broken_layer(raw, i))
    return SimpleNamespace(inputs=inputs, layers=layers, outputs=None, train=None)


def duplicate_layer_names(data: dict, positions: Positions) -> list[Problem]:
    """A layer name used twice, pointing at the second use (checked on the raw mapping, so it is
    reported together with schema problems)."""
    problems, first = [], {}
    layers = data.get("layers")
    for i, layer in enumerate(layers if isinstance(layers, list) else []):
        name = layer.get("name") if isinstance(layer, dict) else None
        if not isinstance(name, str):
            continue
        if name in first:
            line = positions.locate(("layers", first[name], "name"), prefer_key=False).line
            problems.append(Problem(f"layer name '{name}' is already used (line {line})",
                                    positions.locate(("layers", i, "name"), prefer_key=False)))
        else:
            first[name] = i
    return problems


def _apply_override(data: dict, path: tuple, value: Any) -> None:
    """Set one ``--set`` key. In a list, a number is an index and a name picks the layer of that
    name (``layers.conv1.num_output``). A new ``type`` for a mapping that is not a layer
    (``train.solver.type=adam``, a filler's type) replaces the mapping whole, as a base's
    mapping of another type is replaced: the old type's settings do not carry over."""
    shown = ".".join(map(str, path))
    node: Any = data
    written: list = []
    in_list = False
    for depth, key in enumerate(path):
        last = depth == len(path) - 1
        if (last and key == "type" and isinstance(node, dict) and not in_list
                and node.get("type", value) != value):
            node.clear()
        in_list = isinstance(node, list)
        if isinstance(node, list):
            if isinstance(key, int):
                if not -len(node) <= key < len(node):
                    raise UserError(f"--set {shown}: index {key} is out of range (the list has {len(node)} items)")
                index = key
            else:
                names = [item.get("name") for item in node if isinstance(item, dict)]
                if key not in names:
                    raise UserError(f"--set {shown}: no layer named '{key}'{did_you_mean(key, names)}")
                index = names.index(key)
            written.append(index)
            if last:
                node[index] = value
            else:
                node = node[index]
        elif isinstance(node, dict):
            written.append(key)
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        else:
            raise UserError(f"--set {shown}: '{path[depth - 1]}' is a value, not a mapping or list")
    return tuple(written)


COMMAND_LINE = 0    # the line number of a location that stands for a --set flag, not a file


def _mark_overridden(positions: Positions, path: tuple, flag: str) -> None:
    """Problems in a value that ``--set`` wrote are the flag's, not the file's: its path (and
    everything under it) is located at the flag, which the CLI prints as ``error: --set ...``."""
    for table in (positions.keys, positions.values):
        for known in [p for p in table if p[:len(path)] == path]:
            del table[known]
        table[path] = Location(flag, COMMAND_LINE, 0)


def from_command_line(problem: Problem) -> Problem:
    """A problem located at a --set flag, as the plain ``error: --set KEY: ...`` line it is."""
    where = problem.location
    if where is not None and where.line == COMMAND_LINE:
        return Problem(f"{where.file}: {problem.message}")
    return problem


def split_loc(loc: tuple, data: Any) -> tuple[tuple, list]:
    """Split pydantic's loc into the document path (keys that exist) and the rest (tags, members)."""
    path, rest, cur = [], [], data
    for el in loc:
        if isinstance(cur, dict) and el in cur:
            path.append(el)
            cur = cur[el]
        elif isinstance(cur, list) and isinstance(el, int) and 0 <= el < len(cur):
            path.append(el)
            cur = cur[el]
        else:
            rest.append(el)
    return tuple(path), rest


def _layer_label(data: Any, path: tuple) -> str:
    if len(path) >= 2 and path[0] == "layers" and isinstance(path[1], int):
        layer = data["layers"][path[1]]
        if isinstance(layer, dict):
            name = layer.get("name")
            kind = layer.get("type")
            if name is not None:
                return f"layer '{name}'" + (f" ({kind})" if isinstance(kind, str) else "")
        return f"layer #{path[1] + 1}"
    return ""


def _model_for(path: tuple, data: Any, net_model, layer_models) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at ``path`` (for key hints)."""
    if len(path) >= 2 and path[0] == "layers":
        layer = data["layers"][path[1]]
        model = layer_models.get(layer.get("type")) if isinstance(layer, dict) else None
        if len(path) == 2:
            return model
        return None
    model = net_model
    for key in path:
        if isinstance(key, int):
            return None
        field = model.model_fields.get(key)
        if field is None:
            return None
        ann = field.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return None
        model = inner[0]
    return model


def _problems(error: ValidationError, data, positions: Positions, net_model, layer_models) -> list[Problem]:
    """One problem per offending place; a value that fails every member of a union is one line."""
    found: dict[tuple, Problem] = {}
    bad_values: dict[tuple, tuple[str, list[str], object]] = {}
    for err in error.errors(include_url=False):
        path, rest = split_loc(err["loc"], data)
        kind = err["type"]
        label = _layer_label(data, path)
        prefix = f"{label}: " if label else ""
        if kind == "union_tag_invalid":
            tag = err["ctx"]["tag"]
            found[path] = Problem(f"{prefix}unknown layer type '{tag}'{did_you_mean(tag, layer_models)}",
                                  positions.locate(path + ("type",), prefer_key=False))
        elif kind == "union_tag_not_found":
            found[path] = Problem(f"{prefix}missing 'type' (one of: {', '.join(sorted(layer_models))})",
                                  positions.locate(path))
        elif kind == "extra_forbidden":
            owner = _model_for(path[:-1], data, net_model, layer_models)
            hint = did_you_mean(path[-1], owner.model_fields) if owner else ""
            found[path] = Problem(f"{prefix}unknown key '{path[-1]}'{hint}", positions.locate(path))
        elif kind == "missing":
            key = rest[-1] if rest else "?"
            found[path + (key,)] = Problem(f"{prefix}missing required key '{key}'", positions.locate(path))
        else:
            key = next((str(k) for k in reversed(path) if isinstance(k, str)), "")
            what = f"'{key}'" if key else "value"
            entry = bad_values.setdefault(path, (f"{prefix}bad {what}: ", [], positions.locate(path, prefer_key=False)))
            entry[1].append(_plain(err["msg"]))
    for path, (head, reasons, where) in bad_values.items():
        found.setdefault(path, Problem(head + "; or ".join(dict.fromkeys(reasons)), where))
    return sorted(found.values(), key=lambda p: (p.location.line, p.location.col))


def _plain(msg: str) -> str:
    return msg[0].lower() + msg[1:] if msg else msg


class _Prefixed:
    """Positions of a block's layer list, addressed as if it were a net's ``layers``."""

    def __init__(self, positions: Positions, block: tuple):
        self.positions = positions
        self.block = block

    def locate(self, path: tuple, prefer_key: bool = True) -> Location:
        if path[:1] == ("layers",):
            path = self.block + tuple(path[1:])
        return self.positions.locate(path, prefer_key=prefer_key)


class _Errors:
    def __init__(self, errors: list):
        self._errors = errors

    def errors(self, include_url: bool = False) -> list:
        return self._errors


def validate_block(raw_layers: list, block: tuple, positions: Positions, net_model, layer_models):
    """The layers of an If or Loop block (the raw list at document path ``block``), validated as
    a net's layers are: (layers, with BrokenLayer for the ones that fail; problems at their own
    FILE:LINE:COL)."""
    adapter = TypeAdapter(get_args(net_model.model_fields["layers"].annotation)[0])
    layers, errors = [], []
    for i, raw in enumerate(raw_layers):
        try:
            layers.append(adapter.validate_python(raw))
        except ValidationError as e:
            errors += [dict(err, loc=("layers", i) + tuple(err["loc"])) for err in e.errors(include_url=False)]
            layers.append(_broken_layer(raw, i))
    data = {"layers": raw_layers}
    where = _Prefixed(positions, block)
    problems = _problems(_Errors(errors), data, where, net_model, layer_models) if errors else []
    problems += duplicate_layer_names(data, where)
    return layers, problems

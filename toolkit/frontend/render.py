"""Printing a net as YAML with its bases merged and ``--set`` applied (``toolkit render``).

The text is itself a valid net file that loads to the same net: one layer per line in flow
style, as the zoo writes them. Relative data paths are rewritten to hold from the folder the
text is meant for, so the printed net finds the same data.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from .net import Net

ORDER = ("name", "inputs", "layers", "outputs", "train", "optimize")
# the comment that says a text was rendered, and from what: not the net's own description
BANNER = "# (rendered: {file} with its bases merged: {bases})"
_BANNER = re.compile(r"# \(rendered: .* with its bases merged: (?P<bases>.*)\)")


def rendered_bases(line: str) -> list[str] | None:
    """The bases a rendering banner names (as written, split at ", "), None for another line."""
    found = _BANNER.fullmatch(line.strip())
    return found["bases"].split(", ") if found else None


def render_net(net: Net, header: bool = True, folder: str | Path | None = None,
               replace: dict[tuple, Any] | None = None) -> str:
    """The merged net as YAML; relative data paths are rewritten to hold from ``folder`` (default:
    the net file's folder), where the text is meant to be saved; ``replace``: {key path: value}
    set over it (a file copied beside the saved text, named anew)."""
    data = _with_data_paths_rebased(net, Path(folder) if folder is not None else Path(net.file).parent)
    for path, value in (replace or {}).items():
        data = _set(data, path, value)
    lines = _leading_comments(net.file) if header else []
    if header and net.bases:
        lines.append(BANNER.format(file=Path(net.file).name, bases=", ".join(net.bases)))
    keys = [k for k in ORDER if k in data] + [k for k in data if k not in ORDER]
    for key in keys:
        value = data[key]
        if key == "layers" and isinstance(value, list):
            lines.append("layers:")
            lines += [f"  - {_flow(layer)}" for layer in value]
        elif isinstance(value, dict) and value:
            lines.append(f"{key}:")
            lines += [f"  {_flow(k)}: {_flow(v)}" for k, v in value.items()]
        else:
            lines.append(f"{_flow(key)}: {_flow(value)}")
    return "\n".join(lines) + "\n"


def _leading_comments(path: str) -> list[str]:
    """The comment lines that open the net file (its description, by the zoo's habit)."""
    lines = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return lines
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 30, allow_unicode=True)
    text = text.strip()
    return text[:-len("...")].strip() if text.endswith("...") else text   # a bare scalar ends the document


def _set(data: dict, path: tuple, value: Any) -> dict:
    """``data`` with ``path`` set to ``value``, the mappings along it copied (net.raw is left as is)."""
    inner = data.get(path[0]) if isinstance(data.get(path[0]), dict) else {}
    return {**data, path[0]: value if len(path) == 1 else _set(inner, path[1:], value)}


def _with_data_paths_rebased(net: Net, here: Path) -> dict:
    data = dict(net.raw)
    train = data.get("train")
    if not isinstance(train, dict) or not isinstance(train.get("data"), dict):
        return data
    source = dict(train["data"])
    for key in ("source", "test_source"):
        value = source.get(key)
        if not isinstance(value, str) or value.startswith("builtin:") or Path(value).is_absolute():
            continue
        written_in = Path(net.positions.locate(("train", "data", key), prefer_key=False).file).parent
        found = Path(value) if Path(value).exists() else written_in / value   # as the data loader looks
        if found.exists() and found.resolve() != (here / value).resolve():
            source[key] = os.path.relpath(found, here)
    data["train"] = {**train, "data": source}
    return data
